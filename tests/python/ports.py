# SPDX-License-Identifier: Apache-2.0
"""Ports for tests that run beside other tests.

Binding port 0 and letting it go is not enough when tests run in parallel:
the kernel can hand the same port to another test before this one listens
on it, and producers then join the wrong run. reserve_port() takes ports
from below the kernel's ephemeral range (no outgoing connection takes one
as its source port) and holds a lock on a file per port until this process
exits. tests/integration/lib.sh's reserve_port takes the same locks, with
`python3 ports.py` naming a candidate (in the range and free to bind) that
the shell then locks itself: the lock must be held by the test's process."""
import fcntl
import os
import random
import socket

LOCKS = "/tmp/hsflow-test-ports-%d" % os.getuid()
_held = []  # open lock files: closing one would give its port away


def _range():
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        lo, hi = (int(x) for x in f.read().split())
    return (lo - 10000, lo - 1) if lo > 12000 else (hi + 1, 65535)


def _bindable(port):
    """Nothing listens on PORT of 127.0.0.1 now."""
    try:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the consumer binds
            s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False


def _take(port):
    """Locks PORT and checks nothing listens on it; the open lock file, or None."""
    f = open(os.path.join(LOCKS, str(port)), "w")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.close()
        return None
    if not _bindable(port):
        f.close()
        return None
    return f


def reserve_port(count=1):
    """A port P such that P .. P + count - 1 are free on 127.0.0.1 and held
    for this process until it exits."""
    os.makedirs(LOCKS, exist_ok=True)
    first, last = _range()
    for _ in range(200):
        port = random.randint(first, last - count + 1)
        files = []
        for p in range(port, port + count):
            f = _take(p)
            if f is None:
                break
            files.append(f)
        if len(files) == count:
            _held.extend(files)
            return port
        for f in files:
            f.close()
    raise RuntimeError("no %d free consecutive ports in %d-%d after 200 tries" % (count, first, last))


if __name__ == "__main__":  # a candidate for lib.sh, which locks it
    first, last = _range()
    for _ in range(200):
        port = random.randint(first, last)
        if _bindable(port):
            print(port)
            break
    else:
        raise SystemExit("no free port in %d-%d after 200 tries" % (first, last))
