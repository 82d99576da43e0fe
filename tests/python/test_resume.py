# SPDX-License-Identifier: Apache-2.0
"""Resume that follows the trainer's checkpoint: Consumer.state_dict() saved
after k batches, a trainer process SIGKILLed 4 batches later, and a consumer
built with resume=state, all fed by real hs-producer processes over loopback.
The restart delivers those 4 batches again and nothing from before the
state, so across both runs every batch of every epoch reaches the trainer
exactly once; in plan order the restart continues the very same sequence."""
import dis
import inspect
import json
import os
import queue
import subprocess
import sys
import threading
import time

import pytest

import hsflow
from test_consumer import start_producers, stop

EPOCHS = 2

# The trainer of the first run: prints its port, every batch it takes, the
# state after k batches, and then waits, holding its last batch unreleased,
# to be killed.
TRAINER = r"""
import json, sys, time
import hsflow
order, k = sys.argv[1], int(sys.argv[2])
c = hsflow.Consumer(listen="127.0.0.1:0", cache_gb=0.02, epochs=%d, order=order,
                    arrays="numpy")
print(json.dumps({"port": c.port}), flush=True)
n = 0
for b in c:
    n += 1
    print(json.dumps({"batch": [b.epoch, b.batch]}), flush=True)
    if n == k:
        print(json.dumps({"state": c.state_dict()}), flush=True)
    if n == k + 4:
        print(json.dumps({"crash": True}), flush=True)
        time.sleep(120)
""" % EPOCHS


def per_epoch_batches(producer_bin, data):
    """Batches per epoch of the plan the producers build from `data`."""
    with hsflow.Consumer(listen="127.0.0.1:0", cache_gb=0.02, epochs=1, arrays="numpy") as c:
        procs = start_producers(producer_bin, c.port, data, n=1)
        try:
            n = sum(1 for _ in c)
        finally:
            stop(procs)
    return n


def first_run(producer_bin, data, order, k):
    """Runs TRAINER until it has taken k + 4 batches, then SIGKILLs it.
    Returns (batches it took, in order; the state it saved after k)."""
    proc = subprocess.Popen([sys.executable, "-c", TRAINER, order, str(k)],
                            stdout=subprocess.PIPE, env=dict(os.environ, HS_LOG_LEVEL="warn"))
    lines = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout] + [lines.put(b"")],
                     daemon=True).start()
    producers = []
    seen, state = [], None
    deadline = time.monotonic() + 60
    try:
        while True:
            try:
                line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError("the first run took more than 60 s")
            if not line:
                raise AssertionError("the trainer ended (rc %s) before taking %d batches"
                                     % (proc.wait(), k + 4))
            msg = json.loads(line)
            if "port" in msg:
                producers = start_producers(producer_bin, msg["port"], data)
            elif "batch" in msg:
                seen.append(tuple(msg["batch"]))
            elif "state" in msg:
                state = msg["state"]
            elif "crash" in msg:
                break
    finally:
        proc.kill()
        proc.wait(30)
        for p in producers:
            p.kill()
            p.wait(30)
            p.log.close()
    assert len(seen) == k + 4 and state is not None
    return seen, state


@pytest.mark.parametrize("order", ["arrival", "plan"])
def test_restart_from_state_delivers_the_batches_after_it_exactly_once(producer_bin, dataset,
                                                                       order):
    data, _ = dataset
    per_epoch = per_epoch_batches(producer_bin, data)
    assert per_epoch >= 6
    k = per_epoch - 2  # the 4 batches after the state straddle the first two epochs
    seen1, state = first_run(producer_bin, data, order, k)

    # plain JSON types, as a checkpoint stores them
    assert isinstance(state, dict) and json.loads(json.dumps(state)) == state
    assert state["delivered"] == k and state["epochs"] == EPOCHS and state["order"] == order

    before, after = seen1[:k], seen1[k:]
    with hsflow.Consumer(listen="127.0.0.1:0", cache_gb=0.02, epochs=EPOCHS, order=order,
                         arrays="numpy", resume=json.loads(json.dumps(state))) as c:
        procs = start_producers(producer_bin, c.port, data)
        try:
            seen2 = [(b.epoch, b.batch) for b in c]
            s = c.stats()
            final = c.state_dict()
        finally:
            stop(procs)

    assert set(after) <= set(seen2), "the 4 batches after the state were not delivered again"
    assert not set(before) & set(seen2), "batches from before the state were delivered again"
    assert len(seen2) == len(set(seen2))
    everything = [(e, b) for e in range(EPOCHS) for b in range(per_epoch)]
    assert sorted(before + seen2) == everything
    assert s["batches_resumed"] == k and s["batches_delivered"] == s["batches_planned"]
    assert s["batches_planned"] == EPOCHS * per_epoch - k and s["duplicates"] == 0
    assert final["delivered"] == EPOCHS * per_epoch and final["epochs_done"] == EPOCHS
    if order == "plan":
        # the same sequence as an uninterrupted run: the restart goes on from the state
        assert seen2[:4] == after
        assert before + seen2 == seen1[:k] + seen2


def test_state_saved_before_any_batch_resumes_a_fresh_run(producer_bin, dataset):
    data, _ = dataset
    with hsflow.Consumer(listen="127.0.0.1:0", cache_gb=0.02, arrays="numpy") as c:
        empty = c.state_dict()
    assert empty["plan"] is None and empty["delivered"] == 0
    with hsflow.Consumer(listen="127.0.0.1:0", cache_gb=0.02, arrays="numpy",
                         resume=empty) as c:
        procs = start_producers(producer_bin, c.port, data, n=1)
        try:
            n = sum(1 for _ in c)
            s = c.stats()
        finally:
            stop(procs)
    assert n == s["batches_planned"] > 0 and s["batches_resumed"] == 0


def saved_state(producer_bin, data, batches):
    """A state after `batches` batches of a one-epoch run."""
    with hsflow.Consumer(listen="127.0.0.1:0", cache_gb=0.02, arrays="numpy") as c:
        procs = start_producers(producer_bin, c.port, data, n=1)
        try:
            for i, _ in enumerate(c):
                if i + 1 == batches:
                    state = c.state_dict()
            return state
        finally:
            stop(procs)


def test_state_of_another_run_or_a_malformed_one_is_refused_by_name(producer_bin, dataset,
                                                                    capfd):
    data, _ = dataset
    state = saved_state(producer_bin, data, 2)
    capfd.readouterr()
    cases = [
        (dict(state, epochs=3), {}, "saved by a run of 3 epoch"),
        (state, {"epochs": 2}, "saved by a run of 1 epoch"),
        (state, {"order": "plan"}, "saved with --order arrival"),
        (dict(state, hsflow_state=7), {}, "version 7"),
        (dict(state, plan="xyz"), {}, "16 hex digits"),
        (dict(state, delivered=state["delivered"] + 1), {}, "altered or cut short"),
        ('{"hsflow_state": 1, "epochs": 1', {}, "not valid JSON"),
        ({"epochs": 1}, {}, "not an hsflow resume state"),
    ]
    partial = dict(state["partial"][0], bitmap=state["partial"][0]["bitmap"] + "AAAA")
    cases.append((dict(state, partial=[partial]), {}, "base64 characters"))
    for bad, kw, says in cases:
        with pytest.raises(hsflow.HsflowError, match="resume state"):
            hsflow.Consumer(listen="127.0.0.1:0", cache_gb=0.02, arrays="numpy", resume=bad,
                            **kw)
        err = capfd.readouterr().err
        assert says in err, (says, err)
    with pytest.raises(ValueError, match="state_dict"):
        hsflow.Consumer(listen="127.0.0.1:0", cache_gb=0.02, resume=42)


def test_producers_of_another_plan_are_refused_naming_both_plans(producer_bin, dataset, capfd):
    data, _ = dataset
    state = saved_state(producer_bin, data, 2)
    capfd.readouterr()
    with hsflow.Consumer(listen="127.0.0.1:0", cache_gb=0.02, arrays="numpy", resume=state) as c:
        procs = start_producers(producer_bin, c.port, data, n=1, extra=["--seed", "99"])
        try:
            deadline = time.monotonic() + 60
            while c.stats()["producers_dropped"] == 0:
                assert time.monotonic() < deadline, "the producer of another plan was admitted"
                time.sleep(0.05)
            assert c.stats()["batches_delivered"] == 0
        finally:
            for p in procs:
                p.kill()
                p.wait(30)
                p.log.close()
    err = capfd.readouterr().err
    assert "resume state was saved for plan %s" % state["plan"] in err, err


# ---- an exception inside next_batch() -------------------------------------------------------
# A signal handler that raises (Ctrl-C in a notebook, a timeout handler) can
# interrupt next_batch() at any bytecode. Whatever the point, the batch is
# either returned or stays queued for the next call: the trainer gets every
# batch exactly once, and state_dict() and the journal name only the batches
# it was given.

class Interrupted(Exception):
    """What the tests' signal handler and tracer raise inside next_batch()."""


_PKG = os.path.dirname(os.path.abspath(hsflow.__file__)) + os.sep
_NEXT_BATCH = hsflow.Consumer.next_batch.__code__


_RETURN_VALUE = dis.opmap["RETURN_VALUE"]
_NOP = dis.opmap["NOP"]


def call_raising_at(fn, n, again=False):
    """fn() with Interrupted raised before the n-th bytecode (from 0) that
    runs in the hsflow package's code during the call, as a signal handler
    raising there would; fn()'s result when fewer bytecodes ran. Not at the
    RETURN_VALUE of next_batch() itself: CPython runs signal handlers only
    where it checks for them (calls, backward jumps, function starts), and
    once that instruction runs the batch is the caller's; nor at a NOP, which
    checks for nothing and which the compiler leaves out of exception
    handling (it cannot raise). again: a second
    Interrupted at the next point where CPython would run a pending handler
    after the first (a function's start, the return of a builtin), as a
    second Ctrl-C would."""
    left, second = [n], [again]

    def profile(frame, event, arg):
        # (not where a generator is being closed: the exception would go nowhere)
        if left[0] == -1 and second[0] and event in ("call", "c_return") \
                and not frame.f_code.co_flags & inspect.CO_GENERATOR:
            second[0] = False
            raise Interrupted("again, at the %s of %s" % (event, frame.f_code.co_name))

    def local(frame, event, arg):
        op = frame.f_code.co_code[frame.f_lasti] if event == "opcode" else None
        if op is not None and op != _NOP and not (frame.f_code is _NEXT_BATCH
                                                  and op == _RETURN_VALUE):
            if left[0] == 0:
                left[0] = -1
                raise Interrupted("at bytecode %d (%s:%d)" % (n, frame.f_code.co_name,
                                                               frame.f_lineno))
            left[0] -= 1
        return local

    def calls(frame, event, arg):
        if left[0] >= 0 and frame.f_code.co_filename.startswith(_PKG):
            frame.f_trace_opcodes = True
            return local
        return None

    sys.settrace(calls)
    if again:
        sys.setprofile(profile)
    try:
        return fn()
    finally:
        sys.settrace(None)
        sys.setprofile(None)


def journal_entries(path):
    with open(path) as f:
        lines = f.read().splitlines()
    assert lines and lines[0].startswith("hsflow-journal"), lines[:1]
    return [tuple(int(x) for x in line.split()) for line in lines[1:] if line.strip()]


def check_exactly_once(seen, stats, journal, per_epoch, epochs):
    everything = [(e, b) for e in range(epochs) for b in range(per_epoch)]
    assert len(seen) == len(set(seen)), "a batch was handed to the trainer twice"
    assert sorted(seen) == everything, "batches never handed to the trainer: %s" % sorted(
        set(everything) - set(seen))
    assert stats["batches_delivered"] == len(seen) == stats["batches_planned"], stats
    assert stats["finished"] and stats["duplicates"] == 0
    entries = journal_entries(journal)
    assert len(entries) == len(set(entries)), "the journal names a batch twice"
    assert sorted(entries) == everything, "the journal differs from what the trainer got"


@pytest.mark.parametrize("again", [False, True], ids=["once", "twice"])
def test_an_exception_at_any_bytecode_of_next_batch_loses_no_batch(producer_bin, dataset,
                                                                    tmp_path, again):
    """Interrupted is raised at bytecode 0, 1, 2, ... of next_batch() and
    the helpers it calls (its release of the previous batch, the waits, the
    views), one point per call, until a call gets through; then the same for
    the next batch. "twice": a second one follows at the next point a signal
    handler could run (Ctrl-C pressed twice). After each interruption
    state_dict() counts only the batches returned so far."""
    data, _ = dataset
    per_epoch = per_epoch_batches(producer_bin, data)
    journal = str(tmp_path / "journal")
    seen, interrupts, longest = [], 0, 0
    with hsflow.Consumer(listen="127.0.0.1:0", cache_gb=0.02, epochs=EPOCHS, journal=journal,
                         arrays="numpy") as c:
        procs = start_producers(producer_bin, c.port, data)
        try:
            deadline = time.monotonic() + 240
            n = 0
            while True:
                assert time.monotonic() < deadline, "%d interruptions in 240 s" % interrupts
                try:
                    b = call_raising_at(lambda: c.next_batch(timeout=30), n, again)
                except Interrupted:
                    interrupts += 1
                    n += 1
                    assert c.state_dict()["delivered"] == len(seen), \
                        "interrupted at bytecode %d: state_dict() counts a batch the " \
                        "trainer never got" % (n - 1)
                    continue
                except StopIteration:
                    break
                assert b is not None, "no batch for 30 s"
                assert b.input_ids.shape == (b.n_tokens,)
                seen.append((b.epoch, b.batch))
                longest, n = max(longest, n), 0
            s = c.stats()
        finally:
            stop(procs)
    assert longest > 50 and interrupts > len(seen) * 50, (longest, interrupts)
    check_exactly_once(seen, s, journal, per_epoch, EPOCHS)


def test_a_signal_handler_raising_in_next_batch_loses_no_batch_nor_deadlocks_a_small_cache(
        producer_bin, tmp_path):
    """SIGALRM from a random moment of each next_batch() call on, every
    50 us, its handler raising once per call; a cache of a few batches, so
    each batch handed to nobody would hold a slot for good and the run would
    stop."""
    import random
    import signal
    from conftest import write_dataset
    data = str(tmp_path / "data.jsonl")
    write_dataset(data, 120, 5, 200, 1000, seed=11)
    per_epoch = per_epoch_batches(producer_bin, data)
    journal = str(tmp_path / "journal")
    armed = [False]

    def handler(signum, frame):
        if armed[0]:
            armed[0] = False
            raise Interrupted("SIGALRM")

    rng = random.Random(3)
    seen, interrupts = [], 0
    old = signal.signal(signal.SIGALRM, handler)
    try:
        with hsflow.Consumer(listen="127.0.0.1:0", cache_gb=0.001, epochs=2 * EPOCHS,
                             journal=journal, arrays="numpy") as c:
            procs = start_producers(producer_bin, c.port, data)
            try:
                while True:
                    try:
                        armed[0] = True
                        signal.setitimer(signal.ITIMER_REAL, rng.uniform(0.000005, 0.0001),
                                         0.00005)
                        b = c.next_batch(timeout=20)
                    except Interrupted:
                        interrupts += 1
                        assert c.state_dict()["delivered"] == len(seen)
                        continue
                    except StopIteration:
                        break
                    finally:
                        armed[0] = False
                        signal.setitimer(signal.ITIMER_REAL, 0)
                    assert b is not None, ("no batch for 20 s after %d interruptions: the cache "
                                           "is full of batches handed to nobody" % interrupts)
                    seen.append((b.epoch, b.batch))
                s = c.stats()
            finally:
                stop(procs)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert interrupts >= 20, interrupts
    check_exactly_once(seen, s, journal, per_epoch, 2 * EPOCHS)
