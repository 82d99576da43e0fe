# SPDX-License-Identifier: Apache-2.0
"""The test harness's ports (ports.py, and lib.sh's reserve_port through it):
a port one test holds is never handed to another test, whether that one is
Python or shell, and none comes from the kernel's ephemeral range. Two tests
once took the same port (bind port 0, let it go) and one's producers joined
the other's consumer."""
import os
import subprocess
import sys

import ports

HERE = os.path.dirname(os.path.abspath(__file__))


def test_ports_come_from_outside_the_ephemeral_range_and_are_free():
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        lo, hi = (int(x) for x in f.read().split())
    for _ in range(5):
        p = ports.reserve_port(2)
        assert not lo <= p <= hi and not lo <= p + 1 <= hi, (p, lo, hi)
        assert ports._bindable(p) and ports._bindable(p + 1)


def test_a_held_port_is_not_handed_to_another_test():
    held = ports.reserve_port()
    # another Python test whose random choice falls on the held port first
    child = ("import random, ports\n"
             "picks = iter([%d] * 5)\n"
             "real = random.randint\n"
             "random.randint = lambda a, b: next(picks, None) or real(a, b)\n"
             "print(ports.reserve_port())\n" % held)
    out = subprocess.run([sys.executable, "-c", child], cwd=HERE, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) != held
    # a shell test (lib.sh locks the same file with flock)
    lock = os.path.join(ports.LOCKS, str(held))
    r = subprocess.run(["flock", "-n", lock, "true"], timeout=30)
    assert r.returncode == 1, "flock took a port this process holds"


def test_a_port_is_free_again_when_its_holder_ends():
    out = subprocess.run([sys.executable, "-c", "import ports; print(ports.reserve_port())"],
                         cwd=HERE, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lock = os.path.join(ports.LOCKS, out.stdout.strip())
    assert subprocess.run(["flock", "-n", lock, "true"], timeout=30).returncode == 0


def test_the_command_line_names_a_candidate_in_the_range():
    first, last = ports._range()
    out = subprocess.run([sys.executable, os.path.join(HERE, "ports.py")], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert first <= int(out.stdout) <= last
