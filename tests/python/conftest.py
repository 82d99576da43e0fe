# SPDX-License-Identifier: Apache-2.0
"""Shared fixtures for the Python binding's tests.

CTest sets HSFLOW_LIB (the libhsflow.so under test), HSFLOW_BIN_DIR (its
hs-producer) and PYTHONPATH (python/). Run by hand from the repository root:

    HSFLOW_LIB=build/libhsflow.so HSFLOW_BIN_DIR=build/bin PYTHONPATH=python \
        python3 -m pytest tests/python

A session in which every test was skipped exits 77, which CTest reports as
skipped (SKIP_RETURN_CODE).

A library built with -DHS_SANITIZE=address needs the ASan runtime loaded
before the (uninstrumented) interpreter starts; CTest does that. By hand:

    LD_PRELOAD=$(cc -print-file-name=libasan.so) ASAN_OPTIONS=detect_leaks=0 \
        HSFLOW_LIB=build-asan/libhsflow.so HSFLOW_BIN_DIR=build-asan/bin \
        PYTHONPATH=python python3 -m pytest tests/python"""
import json
import os
import random
import sys
import threading

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if os.path.join(ROOT, "python") not in sys.path:
    sys.path.insert(0, os.path.join(ROOT, "python"))
os.environ.setdefault("HS_LOG_LEVEL", "warn")


def asan_runtime_loaded():
    """True when an AddressSanitizer runtime is mapped into this process."""
    with open("/proc/self/maps") as f:
        return any("libasan" in line or "libclang_rt.asan" in line for line in f)


def library_needs_asan(path):
    """True when the shared library at `path` links the ASan runtime."""
    import subprocess
    try:
        out = subprocess.run(["ldd", path], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return "libasan" in out or "libclang_rt.asan" in out


_lib = os.environ.get("HSFLOW_LIB")
if _lib and os.path.exists(_lib) and library_needs_asan(_lib) and not asan_runtime_loaded():
    # Loading it would abort the interpreter with a terse ASan message.
    pytest.exit("%s is built with AddressSanitizer, but its runtime is not loaded: run these "
                "tests through ctest, or set LD_PRELOAD=$(cc -print-file-name=libasan.so) "
                "ASAN_OPTIONS=detect_leaks=0" % _lib, returncode=2)

import hsflow  # noqa: E402


def have_torch():
    try:
        import torch  # noqa: F401
        return True
    except ImportError:
        return False


@pytest.fixture(scope="session")
def lib_path():
    try:
        return hsflow.library_path()
    except hsflow.HsflowError as e:
        pytest.fail(str(e))


@pytest.fixture(scope="session")
def producer_bin(lib_path):
    p = hsflow.find_tool("hs-producer")
    if not p:
        pytest.fail("hs-producer not found: build it (cmake --build BUILD --target hs-producer) "
                    "and set HSFLOW_BIN_DIR=BUILD/bin")
    return p


def write_dataset(path, n, min_len, max_len, vocab, seed):
    """A JSONL dataset; returns the list of (input_ids, loss_mask) per sample."""
    rng = random.Random(seed)
    rows = []
    with open(path, "w") as f:
        for _ in range(n):
            ln = rng.randint(min_len, max_len)
            ids = [rng.randrange(vocab) for _ in range(ln)]
            first = rng.randint(0, 3)  # a short unmasked prompt
            mask = [0 if i < first else 1 for i in range(ln)]
            rows.append((ids, mask))
            f.write(json.dumps({"input_ids": ids, "loss_mask": mask}) + "\n")
    return rows


@pytest.fixture
def dataset(tmp_path):
    """(path, rows): 50 sequences of 5..200 tokens, ids < 1000."""
    path = str(tmp_path / "data.jsonl")
    return path, write_dataset(path, 50, 5, 200, 1000, seed=7)


class ConsumerThread:
    """Runs `fn(batch)` for every batch of a consumer in a thread; the
    batches' summaries end up in .seen and any exception in .error."""

    def __init__(self, consumer, fn, deadline_s=60):
        self.consumer, self.fn, self.deadline_s = consumer, fn, deadline_s
        self.seen, self.error = [], None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        import time
        t_end = time.monotonic() + self.deadline_s
        try:
            while True:
                b = self.consumer.next_batch(timeout=max(0.1, t_end - time.monotonic()))
                if b is None:
                    raise AssertionError("no batch within %d s" % self.deadline_s)
                self.seen.append((b.epoch, b.batch, b.n_tokens))
                self.fn(b)
        except StopIteration:
            pass
        except BaseException as e:  # reported by join()
            self.error = e

    def join(self, timeout=60):
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "consumer thread still running"
        if self.error is not None:
            raise self.error
        return self.seen


def pytest_sessionfinish(session, exitstatus):
    tr = session.config.pluginmanager.get_plugin("terminalreporter")
    if tr is None or exitstatus != 0:
        return
    stats = tr.stats
    ran = sum(len(stats.get(k, [])) for k in ("passed", "failed", "error"))
    if ran == 0 and stats.get("skipped"):
        session.exitstatus = 77
