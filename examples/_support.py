# SPDX-License-Identifier: Apache-2.0
"""What the example trainers share: hsflow found in this checkout when it is
not installed, their rank under torchrun, and for --loopback their command
line split at `--` (what follows goes to hs-producer) and the local
hs-producer processes started and stopped around the run. The scripts import it from their own folder (the
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


def torchrun_rank():
    """(distributed, rank, world, local rank) from torchrun's environment
    (RANK, WORLD_SIZE, LOCAL_RANK); without it, rank 0 of 1, not distributed."""
    distributed = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    rank = int(os.environ.get("RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    return distributed, rank, world, int(os.environ.get("LOCAL_RANK", rank))


def start_loopback_producers(prog, args, consumer_port, world, layers):
    """--loopback N of a trainer: N local hs-producer processes with the
    arguments after `--`, sending to this rank's consumer (one rank) or to
    every rank's port from --base-port (several), with --layers added when
    those arguments name no layers. Returns their Popen objects."""
    import hsflow
    exe = hsflow.find_tool("hs-producer")
    if not exe:
        sys.exit("%s: hs-producer not found next to %s, in $HSFLOW_BIN_DIR or on PATH"
                 % (prog, hsflow.library_path()))
    to = "127.0.0.1:%d" % consumer_port if world == 1 else \
        "127.0.0.1:%d-%d" % (args.base_port, args.base_port + world - 1)
    extra = list(args.producer_args)
    if not any(a in extra for a in ("--layers", "--dflash-layers", "--eagle3-layers")):
        extra += ["--layers", ",".join(map(str, layers))]
    return start_producers(prog, exe, args.loopback, to, extra)


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
