# SPDX-License-Identifier: Apache-2.0
"""The binding's contract with the C library and with its callers: struct
layouts match include/hsflow.h, the library lookup fails with a clear
message, bad arguments are refused before reaching C, errors from C carry
the library's status text, and the numpy synthetic source is bit-identical
to the C one."""
import ctypes
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import hsflow
from hsflow import _lib
from conftest import ROOT, have_torch
from ports import reserve_port

STRUCTS = {"hs_consumer_config_t": _lib.ConsumerConfig, "hs_batch_t": _lib.CBatch,
           "hs_consumer_stats_t": _lib.ConsumerStats,
           "hs_producer_client_config_t": _lib.ProducerClientConfig, "hs_work_t": _lib.CWork,
           "hs_producer_info_t": _lib.ProducerInfo}


def test_ctypes_structs_match_the_c_header_field_by_field(tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler to read the header's layout")
    lines = ['#include <stdio.h>', '#include <stddef.h>', '#include "hsflow.h"',
             'int main(void) {']
    for cname, py in STRUCTS.items():
        lines.append('printf("%s size %%zu\\n", sizeof(%s));' % (cname, cname))
        for f, _ in py._fields_:
            lines.append('printf("%s.%s %%zu\\n", offsetof(%s, %s));' % (cname, f, cname, f))
    lines.append("return 0; }")
    src = tmp_path / "layout.c"
    src.write_text("\n".join(lines))
    exe = str(tmp_path / "layout")
    r = subprocess.run([cc, "-std=c11", "-I", os.path.join(ROOT, "include"), str(src), "-o", exe],
                       capture_output=True, text=True)
    assert r.returncode == 0, "a field the binding declares is not in hsflow.h:\n" + r.stderr
    want = dict(line.rsplit(" ", 1) for line in
                subprocess.run([exe], capture_output=True, text=True, check=True).stdout.split("\n")
                if line)
    got = {}
    for cname, py in STRUCTS.items():
        got["%s size" % cname] = str(ctypes.sizeof(py))
        for f, _ in py._fields_:
            got["%s.%s" % (cname, f)] = str(getattr(py, f).offset)
    assert got == want


def test_version_in_a_checkout_is_read_from_its_header_not_held_in_python(tmp_path):
    """A checkout whose header says another release: the package says it too
    (nothing in python/ holds a copy), without loading any library."""
    import re
    repo = tmp_path / "repo"
    shutil.copytree(os.path.join(ROOT, "python"), str(repo / "python"),
                    ignore=shutil.ignore_patterns("__pycache__", "*.so", "bin"))
    (repo / "include").mkdir()
    header = open(os.path.join(ROOT, "include", "hsflow.h")).read()
    header, n = re.subn(r'(#define HSFLOW_VERSION_STRING )"[0-9.]+"', r'\1"9.8.7"', header)
    assert n == 1
    (repo / "include" / "hsflow.h").write_text(header)
    env = dict(os.environ, HSFLOW_LIB=str(tmp_path / "nowhere" / "libhsflow.so"),
               PYTHONPATH=str(repo / "python"))
    r = subprocess.run([sys.executable, "-c", "import hsflow; print(hsflow.__version__)"],
                       capture_output=True, text=True, env=env, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "9.8.7"


def test_python_dtype_names_are_the_c_table_of_hs_dtype_h(tmp_path):
    """hsflow._dtypes against common/dtype.c compiled here: the same ids,
    names, sizes and order, the same joined names in messages, and the same
    answers of the parser for every name and a few near misses."""
    from hsflow import _dtypes
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler to build common/dtype.c")
    probes = list(_dtypes.NAMES) + ["auto", "BF16", "fp16", "fp32", "e4m3", "bf16 ", "", "?"]
    src = tmp_path / "dtypes.c"
    src.write_text("\n".join([
        '#include <stdio.h>', '#include "hs_dtype.h"', 'int main(void) {',
        'size_t n; const hs_dtype_info_t *t = hs_dtype_table(&n); char buf[128];',
        'for (size_t i = 0; i < n; i++) printf("dtype %u %s %u %u %s\\n", t[i].id, t[i].name,',
        '    t[i].elem_bytes, t[i].row_scale_bytes, hs_dtype_str(t[i].id));',
        'printf("unknown %s\\n", hs_dtype_str(0));',
        'printf("or %s\\n", hs_dtype_names(buf, sizeof buf, NULL, ", ", " or "));',
        'printf("bar %s\\n", hs_dtype_names(buf, sizeof buf, "auto", "|", "|"));',
        'const char *probes[] = {%s};' % ", ".join('"%s"' % p for p in probes),
        'for (size_t i = 0; i < sizeof probes / sizeof *probes; i++) {',
        '    uint32_t d = 0; int st = hs_dtype_parse(probes[i], &d);',
        '    printf("parse [%s] %d %u\\n", probes[i], st == HS_OK, st == HS_OK ? d : 0u); }',
        'return 0; }']))
    exe = str(tmp_path / "dtypes")
    r = subprocess.run([cc, "-std=c11", "-I", os.path.join(ROOT, "include"),
                        "-I", os.path.join(ROOT, "common"), str(src),
                        os.path.join(ROOT, "common", "dtype.c"), "-o", exe],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    got = subprocess.run([exe], capture_output=True, text=True, check=True).stdout.splitlines()
    want = ["dtype %d %s %d %d %s" % (d.id, d.name, d.elem_bytes, d.row_scale_bytes, d.name)
            for d in _dtypes.TABLE]
    want += ["unknown ?", "or " + _dtypes.names(), "bar " + "|".join(_dtypes.WEIGHTS)]
    want += ["parse [%s] %d %d" % (p, p in _dtypes.BY_NAME,
                                   _dtypes.BY_NAME[p].id if p in _dtypes.BY_NAME else 0)
             for p in probes]
    assert got == want
    assert (_lib.HS_HIDDEN_BF16, _lib.HS_HIDDEN_FP8) == (_dtypes.BF16.id, _dtypes.FP8.id)
    # the consumer's option table spells --deliver's choices itself: the same names
    lib, info = hsflow._lib.load(), _lib.OptionInfo()
    choices = {}
    for i in range(lib.hs_consumer_option_count()):
        assert lib.hs_consumer_option_info(i, ctypes.byref(info)) == 0
        choices[info.name.decode()] = (info.choices or b"").decode()
    assert choices["deliver"] == _dtypes.names(sep="|", last_sep="|")


def test_missing_library_names_what_was_tried_and_how_to_build_it(tmp_path):
    code = ("import hsflow\n"
            "try:\n    hsflow.Consumer()\n"
            "except hsflow.HsflowError as e:\n    print(e)\n")
    env = dict(os.environ, HSFLOW_LIB=str(tmp_path / "nowhere" / "libhsflow.so"),
               PYTHONPATH=os.path.join(ROOT, "python"))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert "cannot find libhsflow.so" in r.stdout and "nowhere" in r.stdout
    assert "cmake" in r.stdout and "HSFLOW_LIB" in r.stdout


def test_a_sanitized_library_runs_with_its_sanitizer_live(lib_path):
    """A -DHS_SANITIZE=address build: CTest preloads the ASan runtime, so the
    allocator these tests use is ASan's (a freed block is poisoned) and the
    library's checks are live; leaks are left to the C tests."""
    from conftest import asan_runtime_loaded, library_needs_asan
    if not library_needs_asan(lib_path):
        pytest.skip("the library is not built with AddressSanitizer")
    assert asan_runtime_loaded()
    assert "detect_leaks=0" in os.environ.get("ASAN_OPTIONS", "")
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    poisoned = libc.__asan_address_is_poisoned
    poisoned.argtypes, poisoned.restype = [ctypes.c_void_p], ctypes.c_int
    p = libc.malloc(64)
    assert poisoned(p) == 0
    libc.free(p)
    assert poisoned(p) == 1


def test_status_codes_have_the_library_text():
    assert hsflow.status_str(0) != hsflow.status_str(-9)
    e = hsflow.HsflowError("hs_consumer_next", -11)
    assert e.status == -11 and hsflow.status_str(-11) in str(e) and "-11" in str(e)


@pytest.mark.parametrize("kw, msg", [
    (dict(listen="7000"), "expected 'HOST:PORT'"),
    (dict(listen="host:http"), "port must be a number"),
    (dict(listen="127.0.0.1:70000"), "port must be a number"),
    (dict(cache_gb=0), "cache_gb=0"),
    (dict(epochs=0), "epochs=0"),
    (dict(order="random"), "expected 'arrival'"),
    (dict(gpu=-3), "gpu=-3"),
    (dict(gpu="cuda"), "gpu='cuda'"),
    (dict(prefetch=0), "prefetch=0"),
    (dict(transport="rdma"), "transport='rdma'"),
    (dict(arrays="jax"), "arrays='jax'"),
    (dict(lease_timeout_s=-1), "lease_timeout_s=-1"),
])
def test_consumer_refuses_bad_arguments_with_a_clear_message(kw, msg):
    with pytest.raises(ValueError, match=msg.replace("(", r"\(").replace("*", r"\*")):
        hsflow.Consumer(**dict(dict(listen="127.0.0.1:0"), **kw))


@pytest.mark.parametrize("kw, msg", [
    (dict(to="localhost"), "expected the consumer as 'HOST:PORT'"),
    (dict(data="/nonexistent.jsonl"), "not a file"),
    (dict(token_budget=0), "token_budget=0"),
    (dict(hidden_size=-1), "hidden_size=-1"),
    (dict(layers=[]), "strictly increasing"),
    (dict(layers=[3, 2]), "strictly increasing"),
    (dict(layers="2,16"), "expected a list"),
    (dict(overflow="wrap"), "overflow='wrap'"),
    (dict(prefetch=0), "prefetch=0"),
    (dict(transport="rdma"), "transport='rdma'"),
    (dict(target=None), "say which target computes the states"),
    (dict(target="/nonexistent-model"), "not a folder"),
    (dict(target_fingerprint=0), "target_fingerprint=0"),
    (dict(target_fingerprint="xyz"), "target_fingerprint='xyz'"),
])
def test_producer_refuses_bad_arguments_with_a_clear_message(kw, msg, dataset):
    args = dict(to="127.0.0.1:1", data=dataset[0], token_budget=256, hidden_size=8,
                layers=[1, 2], target="synthetic")
    args.update(kw)
    with pytest.raises(ValueError, match=msg):
        hsflow.Producer(**args)


def test_errors_from_the_library_raise_hsflow_error_with_its_status():
    with hsflow.Consumer(listen="127.0.0.1:0", cache_gb=0.01) as c:
        with pytest.raises(hsflow.HsflowError, match="hs_consumer_create") as e:
            hsflow.Consumer(listen="127.0.0.1:%d" % c.port, cache_gb=0.01)  # port taken
        assert e.value.status < 0 and hsflow.status_str(e.value.status) in str(e.value)
    with pytest.raises(hsflow.HsflowError, match="consumer is closed"):
        c.stats()


def test_producer_with_no_consumer_fails_after_its_connect_timeout(dataset):
    port = reserve_port()  # a port nobody listens on
    with pytest.raises(hsflow.HsflowError, match="hs_producer_open") as e:
        hsflow.Producer(to="127.0.0.1:%d" % port, data=dataset[0], token_budget=256,
                        hidden_size=8, layers=[1, 2], connect_timeout_s=1, transport="tcp",
                        target="synthetic")
    assert e.value.status < 0


def test_gpu_delivery_without_a_usable_gpu_is_an_hsflow_error():
    if have_torch():
        import torch
        if torch.cuda.is_available():
            pytest.skip("a GPU is present")
    with pytest.raises(hsflow.HsflowError, match="gpu 0"):
        hsflow.Consumer(listen="127.0.0.1:0", cache_gb=0.01, gpu=0)


def test_stats_before_any_producer_are_zero_and_the_status_line_is_text():
    with hsflow.Consumer(listen="127.0.0.1:0", cache_gb=0.01) as c:
        s = c.stats()
        assert s["batches_delivered"] == 0 and s["cache_capacity"] >= 0.01 * (1 << 30) * 0.9
        assert s["epochs"] == 1 and not s["finished"]
        assert isinstance(c.status_line(), str) and c.status_line()
        assert c.next_batch(timeout=0.05) is None  # nothing yet: a timeout, not an error


def test_numpy_synthetic_source_is_bit_identical_to_the_library():
    lib = ctypes.CDLL(hsflow.library_path())
    f = lib.hs_synth_value
    f.restype = ctypes.c_uint16
    f.argtypes = [ctypes.c_uint64, ctypes.c_int32, ctypes.c_uint32, ctypes.c_uint32]
    sids, cu, layers, H = [5, 2 ** 63 + 7, 123456789], [0, 3, 4, 11], [0, 2, 31], 37
    got = hsflow.synthetic_hidden(sids, cu, layers, H)
    want = np.empty_like(got)
    for s in range(3):
        for t in range(cu[s], cu[s + 1]):
            for j, layer in enumerate(layers):
                for c in range(H):
                    want[t, j * H + c] = f(sids[s], layer, t - cu[s], c)
    assert np.array_equal(got, want)


def test_find_tool_honours_hsflow_bin_dir(tmp_path, monkeypatch):
    tool = tmp_path / "hs-producer"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    monkeypatch.setenv("HSFLOW_BIN_DIR", str(tmp_path))
    assert hsflow.find_tool("hs-producer") == str(tool)
    assert hsflow.find_tool("hs-no-such-tool") is None


def test_version_is_the_same_in_python_the_library_the_header_and_every_binary():
    import re
    header = open(os.path.join(ROOT, "include", "hsflow.h")).read()
    want = re.search(r'#define HSFLOW_VERSION_STRING "([0-9.]+)"', header).group(1)
    assert hsflow.__version__ == want
    info = hsflow.library_version()
    assert info["version"] == want
    assert info["build"].startswith("CUDA ")
    for tool in ("hs-consumer", "hs-producer", "hs-data", "hs-forward"):
        path = hsflow.find_tool(tool)
        assert path, "%s not found" % tool
        r = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        first, build = r.stdout.splitlines()[:2]
        assert first.split()[:2] == [tool, want], r.stdout
        if info["git"]:
            assert "(git %s)" % info["git"] in first
        assert build == "build: " + info["build"]


def test_consumer_options_come_from_the_table():
    from hsflow.consumer import option_names
    names = option_names()
    for kw in ("cache_gb", "epochs", "gpu", "order", "prefetch", "store", "deliver",
               "lease_min_tokens_per_s", "expect_plan", "handshake_timeout_s"):
        assert kw in names
    with pytest.raises(TypeError, match="no_such_setting"):
        hsflow.Consumer(listen="127.0.0.1:0", cache_gb=0.01, no_such_setting=1)
    # a table option without a keyword of its own, bounds from the table
    with pytest.raises(ValueError, match=r"handshake_timeout_s=0: expected s more than 0"):
        hsflow.Consumer(listen="127.0.0.1:0", cache_gb=0.01, handshake_timeout_s=0)
    with pytest.raises(ValueError, match=r"max_producers=-1: expected a whole number"):
        hsflow.Consumer(listen="127.0.0.1:0", cache_gb=0.01, max_producers=-1)
    with hsflow.Consumer(listen="127.0.0.1:0", cache_gb=0.01, handshake_timeout_s=5,
                         max_producers=2) as c:
        assert c.port > 0
