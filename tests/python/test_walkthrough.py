# SPDX-License-Identifier: Apache-2.0
"""README's walk-through "From a ShareGPT file to a run", run as written.

The shell blocks between the <!-- walkthrough --> markers of README.md are
run by bash on a small ShareGPT file, with only these substitutions: the
tokenizer folder (a BPE built here), build/bin/ (the binaries under test,
build/bin/hsflow-python included), the port (a free one) and the example's
path; and in a clean environment (no PYTHONPATH, no HSFLOW_*), as on a fresh
clone after the README's two set-up commands. The trainer's block runs with a
python3 first on PATH that has no site-packages (no numpy, no torch), as a
pyenv or conda shell has its own."""
import json
import os
import random
import re
import signal
import subprocess
import sys

import pytest

from conftest import ROOT, have_torch
from ports import reserve_port

pytest.importorskip("tokenizers", reason="the tokenizers package is not installed "
                    "(scripts/install-deps installs python/requirements-dev.txt)")
pytest.importorskip("transformers", reason="transformers is not installed "
                    "(scripts/install-deps installs python/requirements-dev.txt)")
pytest.importorskip("xxhash", reason="xxhash is not installed (python/requirements-dev.txt)")

from tiny_tokenizer import CHATML, CORPUS, save_tokenizer, train_bpe  # noqa: E402

README_TOKENIZER = "/models/Qwen2.5-7B-Instruct"
README_PORT = "127.0.0.1:7000"


def readme_block(marker):
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    m = re.search(rf"<!-- {marker} -->\n```sh\n(.*?)```\n<!-- /{marker} -->", text, re.S)
    assert m, f"README.md has no ```sh block between <!-- {marker} --> markers"
    return m.group(1)




def bin_dir():
    d = os.environ.get("HSFLOW_BIN_DIR") or os.path.join(ROOT, "build", "bin")
    if not os.path.exists(os.path.join(d, "hs-consumer")):
        pytest.fail(f"hs-consumer not found in {d}: build the project and set HSFLOW_BIN_DIR")
    return d


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A folder with chat.jsonl (ShareGPT) and the tokenizer."""
    d = tmp_path_factory.mktemp("walkthrough")
    tok_dir = save_tokenizer(train_bpe(), d / "tokenizer", CHATML)
    rng = random.Random(3)
    with open(d / "chat.jsonl", "w") as f:
        for i in range(300):
            turns = [{"from": "system", "value": "you are a helpful assistant"}] if i % 3 == 0 \
                else []
            for _ in range(rng.randint(1, 4)):
                turns.append({"from": "human", "value": " ".join(rng.choices(CORPUS, k=3))})
                turns.append({"from": "gpt", "value": " ".join(rng.choices(CORPUS, k=rng.randint(2, 40)))})
            f.write(json.dumps({"conversations": turns}) + "\n")
        f.write("{not json\n")  # counted and reported, not fatal
    return d, tok_dir


def script_for(block, tok_dir, port):
    for must in ("build/bin/", README_PORT):
        assert must in block, f"the README block no longer mentions {must}; update this test"
    s = block.replace(README_TOKENIZER, tok_dir).replace(README_PORT, f"127.0.0.1:{port}")
    s = s.replace("build/bin/", bin_dir() + "/")
    s = s.replace("examples/drafter_loop.py", os.path.join(ROOT, "examples", "drafter_loop.py"))
    # no interpreter of the test's own: the block names build/bin/hsflow-python,
    # which must work whichever python3 comes first on PATH
    assert not re.search(r"^python3? ", s, flags=re.M), "a bare python in the README block"
    return "set -euo pipefail\n" + s


def clean_env():
    """The environment of a user on a fresh clone: none of the test run's
    PYTHONPATH, HSFLOW_* or HS_* settings, so the commands find the package
    and the library as the README says they do. Kept: the basics of a shell,
    a sanitizer runtime CTest preloads into an instrumented build, and, when
    the build under test is not the checkout's build/ (which the README's
    python3 command finds by itself), that build's library."""
    keep = ("PATH", "HOME", "USER", "LANG", "LC_ALL", "TMPDIR", "LD_PRELOAD", "ASAN_OPTIONS",
            "UBSAN_OPTIONS", "TSAN_OPTIONS")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    lib = os.environ.get("HSFLOW_LIB")
    if lib and os.path.realpath(lib) != os.path.realpath(os.path.join(ROOT, "build",
                                                                     "libhsflow.so")):
        env["HSFLOW_LIB"] = lib
    env["HS_LOG_LEVEL"] = "warn"
    return env


def run_script(d, script, timeout=300, path_first=None):
    """Runs script with bash in its own process group, all of which is
    killed if it has not finished within `timeout` seconds; path_first: a
    folder put first on PATH."""
    env = clean_env()
    if path_first:
        env["PATH"] = str(path_first) + os.pathsep + env.get("PATH", "")
    p = subprocess.Popen(["bash", "-c", script], cwd=d, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        pytest.fail(f"the walk-through did not finish within {timeout} s:\n{out[-2000:]}\n"
                    f"{err[-2000:]}")
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)  # anything it left in the background
        except ProcessLookupError:
            pass
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def test_readme_walkthrough_from_sharegpt_to_a_run(workdir):
    d, tok_dir = workdir
    block = readme_block("walkthrough")
    assert README_TOKENIZER in block and "build/bin/hsflow-data prepare chat.jsonl train.hst" in block
    r = run_script(d, script_for(block, tok_dir, reserve_port()))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    meta = json.load(open(d / "train.hst.meta.json"))
    assert meta["counts"]["written"] == 300 and meta["counts"]["malformed"] == 1
    assert "chat.jsonl:301: not valid JSON" in r.stderr
    assert re.search(r"batches\s+\d+ per epoch", r.stdout), r.stdout[-2000:]
    summary = json.load(open(d / "run.json"))
    assert summary["complete"] is True, summary
    assert summary["batches_delivered"] == summary["batches_planned"] > 0
    assert summary["checksum_failures"] == 0 and summary["duplicates"] == 0


@pytest.mark.skipif(not have_torch(), reason="the trainer step needs torch")
def test_readme_walkthrough_trainer_step(workdir):
    d, tok_dir = workdir
    if not os.path.exists(d / "train.hst"):
        pytest.skip("needs the train.hst of the walk-through test")
    # a python3 without numpy or torch first on PATH: the block must not use it
    bare = d / "bare-python"
    bare.mkdir(exist_ok=True)
    (bare / "python3").write_text("#!/bin/sh\nexec %s -S \"$@\"\n" % sys.executable)
    (bare / "python3").chmod(0o755)
    block = readme_block("walkthrough-trainer")
    assert "build/bin/hsflow-python examples/drafter_loop.py" in block and 'wait "$trainer"' in block
    r = run_script(d, script_for(block, tok_dir, reserve_port()), path_first=bare)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "tokens/s" in r.stdout + r.stderr
