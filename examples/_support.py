# SPDX-License-Identifier: Apache-2.0
"""What the example trainers share: hsflow found in this checkout when it is
not installed, and for --loopback their command line split at `--` (what
follows goes to hs-producer) and the local hs-producer processes started and
stopped around the run. The scripts import it from their own folder (the
first entry of sys.path when a script is run), before hsflow."""
import os
import subprocess
import sys

try:
    import hsflow  # noqa: F401
except ImportError:  # running from a checkout without `pip install ./python`
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))


def say(line):
    """line and its newline in one write to stdout, flushed: the ranks of a
    torchrun job share stdout, and print()'s separate write of the newline
    lets another rank's line land in between."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def parse_args(ap, argv, needs=""):
    """ap's arguments (which include --loopback) parsed from argv up to
    `--`; what follows goes to hs-producer, as args.producer_args. --loopback
    without them is a usage error; `needs` says which they must hold."""
    producer_args = []
    if "--" in argv:
        i = argv.index("--")
        argv, producer_args = argv[:i], argv[i + 1:]
    args = ap.parse_args(argv)
    if args.loopback and not producer_args:
        ap.error("--loopback needs hs-producer arguments after `--`" + needs)
    args.producer_args = producer_args
    return args


def start_producers(prog, exe, n, to, producer_args):
    """Starts n hs-producer processes (exe) sending to `to`, named
    loopback-0 .. loopback-(n-1); returns their Popen objects."""
    cmd = [exe, "--to", to] + producer_args
    print("%s: starting %d x %s" % (prog, n, " ".join(cmd)), flush=True)
    return [subprocess.Popen(cmd + ["--name", "loopback-%d" % i]) for i in range(n)]


def stop_producers(procs, wait_s):
    """Waits up to wait_s seconds for each producer to end (the consumer's
    close() told them BYE), kills the ones still running and reaps them."""
    for p in procs:
        try:
            p.wait(wait_s)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
