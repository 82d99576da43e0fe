# SPDX-License-Identifier: Apache-2.0
"""One rule for every output file of every command, as hs_outfile_check()
applies it in the C tools: an output is refused when it is, or links to
(symlink or hard link), one of the command's inputs, and when it would go
inside an input folder (a tokenizer or model folder), where it could
replace or join that folder's files."""
import os


def output_conflict(out, inputs):
    """The reason `out` may not be written given `inputs` (paths, None
    skipped), or None when it may."""
    if os.path.isdir(out):
        return "%s: the output is a folder; give a file name" % out
    try:
        o = os.stat(out)
    except OSError:
        o = None
    try:
        d = os.stat(os.path.dirname(os.path.abspath(out)) or ".")
    except OSError:
        d = None
    for inp in inputs:
        if not inp:
            continue
        try:
            i = os.stat(inp)
        except OSError:
            continue
        if os.path.isdir(inp):
            if d is not None and (d.st_dev, d.st_ino) == (i.st_dev, i.st_ino):
                return ("%s: the output would go inside the input folder %s and could replace or "
                        "join its files; write it somewhere else" % (out, inp))
        elif o is not None and (o.st_dev, o.st_ino) == (i.st_dev, i.st_ino):
            other = "" if out == inp else " (the same file by another name or link)"
            return ("%s: the output is the input %s%s; writing it would destroy the input: give "
                    "another output name" % (out, inp, other))
    return None
