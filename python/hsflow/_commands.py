# SPDX-License-Identifier: Apache-2.0
"""Console entry points of the C commands: `pip install ./python` puts
hs-consumer, hs-producer, hs-data and hs-forward in hsflow/bin/ and these
scripts on PATH; each replaces itself with the binary (exec), so signals,
exit codes and the terminal are the binary's own."""
import os
import sys

from ._lib import _PKG_DIR, _REPO_DIR


def tool_path(name):
    """The binary behind the console script NAME: $HSFLOW_BIN_DIR/NAME when
    set, else the one shipped in this package (hsflow/bin/NAME), else, run
    from a checkout, build/bin/NAME. PATH is never searched: the script of
    that name is this one."""
    dirs = []
    if os.environ.get("HSFLOW_BIN_DIR"):
        dirs.append(os.environ["HSFLOW_BIN_DIR"])
    dirs.append(os.path.join(_PKG_DIR, "bin"))
    if _REPO_DIR:
        dirs.append(os.path.join(_REPO_DIR, "build", "bin"))
    for d in dirs:
        p = os.path.join(d, name)
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return p, dirs
    return None, dirs


def _exec(name):
    path, dirs = tool_path(name)
    if path is None:
        sys.stderr.write("%s: the binary is not installed (looked in %s); reinstall the package "
                         "with its commands (pip install ./python, from the checkout) or build "
                         "them (cmake --build build) and set HSFLOW_BIN_DIR=build/bin\n"
                         % (name, ", ".join(dirs)))
        return 127
    try:
        os.execv(path, [name] + sys.argv[1:])
    except OSError as e:
        sys.stderr.write("%s: cannot run %s: %s\n" % (name, path, e))
        return 126


def hs_consumer():
    return _exec("hs-consumer")


def hs_producer():
    return _exec("hs-producer")


def hs_data():
    return _exec("hs-data")


def hs_forward():
    return _exec("hs-forward")
