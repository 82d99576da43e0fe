# SPDX-License-Identifier: Apache-2.0
"""What a user of the Python package does: a fresh virtual environment,
`pip install ./python` (which builds libhsflow.so and the hs-* commands with
the project's CMake and puts them inside the package), then, from a folder
outside the checkout and with no HSFLOW_* variable set: `import hsflow` and
its version, the console scripts, and a loopback run through the bundled
library and the bundled hs-producer.

The install needs no network: the environment sees the test interpreter's
packages (`--system-site-packages`: scikit-build-core and numpy, which
scripts/install-deps installs from python/requirements-dev.txt) and pip runs
with `--no-index --no-build-isolation` and no pip configuration. hsflow
itself is not among those packages (the other suites import it through
PYTHONPATH), and the test checks that what imports is the installed copy."""
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

from conftest import ROOT, write_dataset

# A fresh configure and build of the library and the commands on a loaded
# 2-core machine, then pip's own work.
INSTALL_TIMEOUT_S = 480


def header_version():
    with open(os.path.join(ROOT, "include", "hsflow.h")) as f:
        return re.search(r'#define HSFLOW_VERSION_STRING "([0-9.]+)"', f.read()).group(1)


def user_env(**extra):
    """The environment of a user who has set nothing: no HSFLOW_*, PYTHON*,
    PIP_* or HS_CUDA from the test run, no pip configuration file."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HSFLOW_", "PYTHON", "PIP_", "VIRTUAL_ENV"))
           and k not in ("HS_CUDA", "LD_LIBRARY_PATH")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1",
               PYTHONDONTWRITEBYTECODE="1", HS_LOG_LEVEL="warn")
    env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", "2")
    env.update(extra)
    return env


def run(args, cwd, timeout=120, env=None, check=True):
    r = subprocess.run(args, cwd=cwd, env=env or user_env(), capture_output=True, text=True,
                       timeout=timeout)
    if check and r.returncode != 0:
        raise AssertionError("%s exited %d\n--- stdout\n%s\n--- stderr\n%s"
                             % (" ".join(args), r.returncode, r.stdout[-4000:], r.stderr[-4000:]))
    return r


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    """(venv folder, its python, a working folder outside the checkout)
    after `pip install ./python` into a new virtual environment."""
    base = tmp_path_factory.mktemp("wheel")
    outside = base / "elsewhere"
    outside.mkdir()
    try:
        import scikit_build_core  # noqa: F401
    except ImportError:
        pytest.fail("scikit-build-core is not installed for %s: run scripts/install-deps "
                    "(python/requirements-dev.txt)" % sys.executable)
    env_dir = base / "venv"
    r = run([sys.executable, "-m", "venv", "--system-site-packages", str(env_dir)], cwd=outside,
            check=False)
    assert r.returncode == 0, ("%s -m venv failed (Debian: apt install python3-venv):\n%s"
                               % (sys.executable, r.stderr))
    py = str(env_dir / "bin" / "python")
    r = run([py, "-c", "import scikit_build_core, numpy"], cwd=outside, check=False)
    assert r.returncode == 0, (
        "the new venv does not see scikit-build-core and numpy through --system-site-packages "
        "(is %s itself in a venv? run the tests with the python3 scripts/install-deps "
        "installed into):\n%s" % (sys.executable, r.stderr))
    run([py, "-m", "pip", "install", "-q", "--no-index", "--no-build-isolation",
         os.path.join(ROOT, "python")], cwd=outside, timeout=INSTALL_TIMEOUT_S)
    return env_dir, py, outside


def site_package(py, outside):
    """The folder the venv imports hsflow from."""
    r = run([py, "-c", "import os, hsflow; print(os.path.dirname(hsflow.__file__))"], cwd=outside)
    return r.stdout.strip()


def test_pip_install_puts_the_library_and_the_commands_inside_the_package(venv):
    env_dir, py, outside = venv
    pkg = site_package(py, outside)
    assert pkg.startswith(str(env_dir)), "hsflow imported from %s, not the venv" % pkg
    assert not pkg.startswith(ROOT)
    assert os.path.isfile(os.path.join(pkg, "libhsflow.so"))
    for tool in ("hs-consumer", "hs-producer", "hs-data", "hs-forward"):
        assert os.access(os.path.join(pkg, "bin", tool), os.X_OK), tool
    for script in ("hsflow-produce", "hsflow-data", "hs-consumer", "hs-producer", "hs-data",
                   "hs-forward"):
        assert os.access(str(env_dir / "bin" / script), os.X_OK), script
    # The wheel is the library and the binding, not the tests.
    assert not os.path.exists(os.path.join(pkg, "tests"))


def test_import_outside_the_checkout_finds_the_bundled_library_and_one_version(venv):
    env_dir, py, outside = venv
    code = textwrap.dedent("""
        import json, importlib.metadata, hsflow
        print(json.dumps({"version": hsflow.__version__, "lib": hsflow.library_path(),
                          "library": hsflow.library_version(),
                          "dist": importlib.metadata.version("hsflow"),
                          "pkg": hsflow.__file__}))
    """)
    got = json.loads(run([py, "-c", code], cwd=outside).stdout)
    pkg = os.path.dirname(got["pkg"])
    assert got["lib"] == os.path.join(pkg, "libhsflow.so")
    want = header_version()
    assert got["version"] == got["library"]["version"] == got["dist"] == want
    assert got["library"]["build"].startswith("CUDA off")  # the default wheel is the CPU build
    r = run([py, "-c", "import hsflow; print(hsflow.__version__)"], cwd=outside)
    assert r.stdout.strip() == want


def test_console_scripts_answer_help_and_version(venv):
    env_dir, py, outside = venv
    want = header_version()
    for script, usage in (("hsflow-produce", "--model"), ("hsflow-data", "prepare")):
        exe = str(env_dir / "bin" / script)
        r = run([exe, "--help"], cwd=outside)
        assert "usage: %s" % script in r.stdout and usage in r.stdout, r.stdout
        r = run([exe, "--version"], cwd=outside)
        first, build, lib = r.stdout.splitlines()[:3]
        assert first.split()[:2] == [script, want], r.stdout
        assert build.startswith("build: CUDA off") and lib.startswith("library: " + str(env_dir))
    r = run([py, "-c", "import hsflow; print(hsflow.find_tool('hs-producer'))"], cwd=outside)
    tool = r.stdout.strip()
    assert tool.startswith(str(env_dir)), tool
    r = run([tool, "--version"], cwd=outside)
    assert r.stdout.split()[:2] == ["hs-producer", want]


def test_every_command_is_on_path_after_install(venv):
    """The venv's bin/ (on PATH once it is activated) runs the C commands
    through console scripts that exec the binaries in hsflow/bin/."""
    env_dir, py, outside = venv
    want = header_version()
    env = user_env(PATH=str(env_dir / "bin") + os.pathsep + os.environ.get("PATH", ""))
    for cmd in ("hs-consumer", "hs-producer", "hs-data", "hs-forward", "hsflow-produce",
                "hsflow-data"):
        r = run([cmd, "--version"], cwd=outside, env=env)
        assert r.stdout.split()[:2] == [cmd, want], (cmd, r.stdout)
    r = run(["hs-data", "synth", "d.jsonl", "--sequences", "5"], cwd=outside, env=env)
    assert os.path.getsize(os.path.join(str(outside), "d.jsonl")) > 0


def test_hsflow_lib_still_overrides_the_bundled_library(venv, tmp_path):
    env_dir, py, outside = venv
    code = "import hsflow; print(hsflow.library_path())"
    missing = str(tmp_path / "nowhere" / "libhsflow.so")
    r = run([py, "-c", code], cwd=outside, env=user_env(HSFLOW_LIB=missing), check=False)
    assert r.returncode != 0 and missing in r.stderr and "HSFLOW_LIB" in r.stderr, r.stderr
    # A copy of the bundled library elsewhere is the one loaded when named.
    pkg = site_package(py, outside)
    other = str(tmp_path / "libhsflow.so")
    shutil.copy(os.path.join(pkg, "libhsflow.so"), other)
    r = run([py, "-c", code], cwd=outside, env=user_env(HSFLOW_LIB=other))
    assert r.stdout.strip() == other


def test_loopback_run_through_the_bundled_library_and_hs_producer(venv):
    """A consumer in the venv's interpreter, fed by the wheel's hs-producer
    (found by hsflow.find_tool) with the synthetic source: every batch is
    delivered once and every hidden value is the one the producer computed."""
    env_dir, py, outside = venv
    data = str(outside / "data.jsonl")
    write_dataset(data, 40, 5, 150, 1000, seed=3)
    code = textwrap.dedent("""
        import json, subprocess, sys
        import numpy as np
        import hsflow
        H = 32
        exe = hsflow.find_tool("hs-producer")
        seen = []
        with hsflow.Consumer(listen="127.0.0.1:0", cache_gb=0.02, epochs=2,
                             verify_synthetic=True, arrays="numpy") as c:
            p = subprocess.Popen([exe, "--to", "127.0.0.1:%d" % c.port, "--data", sys.argv[1],
                                  "--token-budget", "400", "--hidden-size", str(H),
                                  "--layers", "1,3", "--source", "synthetic", "--gpus", "cpu:1",
                                  "--connect-timeout", "30"])
            try:
                while True:
                    b = c.next_batch(timeout=60)
                    if b is None:
                        sys.exit("no batch within 60 s")
                    want = hsflow.synthetic_hidden(b.sample_ids, b.cu_seqlens, b.layers, H)
                    assert np.array_equal(b.hidden_states, want), (b.epoch, b.batch)
                    seen.append((b.epoch, b.batch))
                    b.release()
            except StopIteration:  # the last epoch is delivered
                pass
            s = c.stats()
        rc = p.wait(60)
        print(json.dumps({"seen": seen, "stats": s, "rc": rc, "exe": exe}))
    """)
    r = run([py, "-c", code, data], cwd=outside, timeout=180)
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["exe"].startswith(str(env_dir))
    seen = [tuple(x) for x in got["seen"]]
    assert len(seen) == len(set(seen)) == got["stats"]["batches_planned"] > 2
    assert len({e for e, _ in seen}) == 2
    assert got["stats"]["checksum_failures"] == 0 and got["stats"]["finished"]
    assert got["rc"] == 0
