# SPDX-License-Identifier: Apache-2.0
"""What a new user meets first, without installing the package: a missing
optional package is named with the extra that installs it and the command
that needs it, and the console scripts of the C commands run the binaries
they stand for (pip install ./python puts them on PATH; test_wheel checks
that install). Missing packages are simulated by an import hook that refuses
them, so these run whatever is installed."""
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT, write_dataset

# Runs argv[2:] as `python -m argv[1]` with the modules named in
# $BLOCK_MODULES unimportable (as if not installed).
BLOCKER = r"""
import os, runpy, sys
blocked = set(os.environ["BLOCK_MODULES"].split(","))
class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in blocked:
            raise ModuleNotFoundError("No module named %r" % name, name=name)
        return None
sys.meta_path.insert(0, Blocker())
sys.argv = [sys.argv[1]] + sys.argv[2:]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""


def run_without(blocked, module, *args, cwd=None):
    env = dict(os.environ, BLOCK_MODULES=",".join(blocked))
    return subprocess.run([sys.executable, "-c", BLOCKER, module, *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture
def chat(tmp_path):
    p = tmp_path / "chat.jsonl"
    p.write_text(json.dumps({"conversations": [{"from": "human", "value": "hi"},
                                               {"from": "gpt", "value": "hello"}]}) + "\n")
    tok = tmp_path / "tok"
    tok.mkdir()
    return p, tok


@pytest.mark.parametrize("missing", ["transformers", "tokenizers"])
def test_prepare_without_a_tokeniser_package_names_the_data_extra(chat, tmp_path, missing):
    src, tok = chat
    r = run_without([missing], "hsflow.data", "prepare", str(src), str(tmp_path / "out.hst"),
                    "--tokenizer", str(tok))
    assert r.returncode == 2, r.stderr
    assert "hsflow-data needs %s" % missing in r.stderr, r.stderr
    assert 'pip install "hsflow[data]"' in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_prepare_to_hst_without_xxhash_names_the_data_extra(tmp_path):
    src = tmp_path / "tokens.jsonl"
    src.write_text(json.dumps({"input_ids": [1, 2, 3]}) + "\n")
    r = run_without(["xxhash"], "hsflow.data", "prepare", str(src), str(tmp_path / "out.hst"))
    assert r.returncode == 2, r.stderr
    assert "hsflow-data prepare needs xxhash" in r.stderr, r.stderr
    assert 'pip install "hsflow[data]"' in r.stderr and "hs-data import" in r.stderr


@pytest.mark.parametrize("missing", ["torch", "transformers"])
def test_produce_without_torch_or_transformers_names_the_produce_extra(tmp_path, missing):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({
        "model_type": "llama", "architectures": ["LlamaForCausalLM"],
        "num_hidden_layers": 4, "hidden_size": 64}))
    (model / "model.safetensors").write_bytes(b"")
    data = tmp_path / "d.jsonl"
    write_dataset(str(data), 10, 5, 50, 100, seed=1)
    r = run_without([missing], "hsflow.produce", "--to", "127.0.0.1:1", "--data", str(data),
                    "--token-budget", "256", "--model", str(model), "--layers", "1,2",
                    "--gpus", "cpu:1")
    assert r.returncode == 2, r.stderr
    assert "hsflow-produce needs %s" % missing in r.stderr, r.stderr
    assert 'pip install "hsflow[produce]"' in r.stderr, r.stderr


def test_plot_without_matplotlib_names_the_plot_extra(tmp_path):
    stats = tmp_path / "s.jsonl"
    stats.write_text("{}\n")
    r = run_without(["matplotlib"], "hsflow.plot", str(stats), "-o", str(tmp_path / "p.png"))
    assert r.returncode == 2, r.stderr
    assert "needs matplotlib" in r.stderr and 'pip install "hsflow[plot]"' in r.stderr, r.stderr


def test_console_scripts_exec_the_binaries_they_are_named_after():
    """hs-consumer & co. as installed by the package: each execs its binary
    with its own name as argv[0], so --version and --help read as the
    binary's."""
    for name, func in (("hs-consumer", "hs_consumer"), ("hs-producer", "hs_producer"),
                       ("hs-data", "hs_data"), ("hs-forward", "hs_forward")):
        code = "import sys; from hsflow import _commands; sys.exit(_commands.%s())" % func
        r = subprocess.run([sys.executable, "-c", code, "--version"], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0, (name, r.stderr)
        assert r.stdout.split()[0] == name, r.stdout


def test_a_console_script_without_its_binary_says_where_it_looked(tmp_path):
    code = ("import sys; from hsflow import _commands; "
            "_commands._PKG_DIR = sys.argv[1]; _commands._REPO_DIR = None; "
            "sys.exit(_commands.hs_consumer())")
    env = {k: v for k, v in os.environ.items() if k != "HSFLOW_BIN_DIR"}
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True,
                       text=True, timeout=60, env=env)
    assert r.returncode == 127
    assert str(tmp_path / "bin") in r.stderr and "pip install ./python" in r.stderr, r.stderr


def test_pyproject_declares_every_command_and_every_extra_named():
    text = open(os.path.join(ROOT, "python", "pyproject.toml")).read()
    for script in ("hs-consumer", "hs-producer", "hs-data", "hs-forward", "hsflow-produce",
                   "hsflow-data"):
        assert "\n%s = " % script in text, script
    for extra in ("data", "produce", "torch", "plot"):
        assert "\n%s = [" % extra in text, extra


@pytest.mark.parametrize("module,args,abbrev", [
    ("hsflow.plot", ["stats.jsonl", "--out", "x.png"], "--tit"),
    ("hsflow.data", ["store", "export", "store", "out"], "--form"),
])
def test_an_abbreviated_flag_is_refused_not_taken_for_the_flag_it_starts(tmp_path, module, args,
                                                                          abbrev):
    r = subprocess.run([sys.executable, "-m", module, *args, abbrev, "x"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "unrecognized arguments: %s" % abbrev in r.stderr, r.stderr


def test_every_python_command_and_example_refuses_abbreviated_flags():
    """Each argparse parser of the package and the examples (subcommands
    included) is built with allow_abbrev=False, so '--layer 2' is never
    taken for '--layers'."""
    import re
    roots = [os.path.join(ROOT, "python", "hsflow"), os.path.join(ROOT, "examples")]
    seen = 0
    for root in roots:
        for d, _, names in os.walk(root):
            for n in names:
                if not n.endswith(".py"):
                    continue
                text = open(os.path.join(d, n)).read()
                for m in re.finditer(r"(ArgumentParser|add_parser)\(", text):
                    depth, i = 1, m.end()
                    while depth:
                        depth += {"(": 1, ")": -1}.get(text[i], 0)
                        i += 1
                    seen += 1
                    assert "allow_abbrev=False" in text[m.end():i], "%s: %s" % (n, text[m.start():i])
    assert seen >= 8
