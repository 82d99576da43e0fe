# SPDX-License-Identifier: Apache-2.0
"""python -m hsflow.plot: the --stats-jsonl file of a real loopback run
becomes a PNG with one panel per figure; tokens/s comes from the change in
tokens between lines over wall-clock "time"; a file that is not a stats
file is refused naming the line."""
import json
import os
import subprocess
import sys
import time

import pytest

import hsflow
from hsflow import plot
from conftest import ROOT, asan_runtime_loaded


def run_loopback(tmp_path):
    consumer, data = hsflow.find_tool("hs-consumer"), hsflow.find_tool("hs-data")
    assert consumer and data
    tokens = str(tmp_path / "d.jsonl")
    subprocess.run([data, "synth", tokens, "--sequences", "400", "--min-len", "16",
                    "--max-len", "600", "--seed", "5"], check=True, capture_output=True,
                   timeout=60)
    stats = tmp_path / "stats.jsonl"
    # 60 ms per batch on the producer side: a run of a few seconds, so that
    # there are several lines (one per second) to plot.
    env = dict(os.environ, HS_FAULT="delay_ms=60")
    subprocess.run([consumer, "--loopback", "1", "--transport", "tcp", "--cache-gb", "0.0625",
                    "--stats-jsonl", str(stats), "--", "--transport", "tcp", "--data", tokens,
                    "--token-budget", "2048", "--hidden-size", "64", "--layers", "1,2",
                    "--source", "synthetic"], check=True, capture_output=True, timeout=120,
                   env=env)
    return stats


def test_stats_lines_carry_wall_clock_time_and_plot_reads_rates(tmp_path):
    before = time.time()
    stats = run_loopback(tmp_path)
    rows = plot.read_stats(str(stats))
    assert len(rows) >= 2
    assert all(before - 1 <= r["wall"] <= time.time() + 1 for r in rows)
    assert all("monotonic_s" in r for r in rows)
    assert rows[-1]["complete"] is True
    # The derived rate integrates back to the tokens delivered between lines.
    total = sum(r["tokens_per_s_now"] * (r["wall"] - p["wall"]) for p, r in zip(rows, rows[1:]))
    assert total == pytest.approx(rows[-1]["tokens"] - rows[0]["tokens"], rel=1e-6, abs=1)
    # The recent window beside the run's averages, in every line and the
    # plot's panels: within the first 30 s the window is the whole run.
    for r in rows[1:]:
        assert 0 < r["window_s"] <= 30.5, r
        assert r["recent_tokens_per_s"] == pytest.approx(r["tokens_per_s"], rel=0.05, abs=50), r
        assert 0 <= r["recent_starve_pct"] <= 100.5 and 0 <= r["recent_verify_pct"] <= 100.5
    fields = {f for _, _, series in plot.PANELS for f, _ in series}
    assert {"recent_tokens_per_s", "recent_starve_pct", "recent_verify_pct"} <= fields


def test_plot_command_writes_a_png_of_a_real_run(tmp_path):
    try:
        import matplotlib  # noqa: F401
    except Exception as e:  # missing, or built against another numpy
        pytest.skip("matplotlib cannot be imported: %s" % e)
    if asan_runtime_loaded():
        # matplotlib's C++ extensions throw through ASan's __cxa_throw
        # interceptor, which finds no C++ runtime preloaded beside it.
        pytest.skip("matplotlib does not run under the preloaded ASan runtime")
    stats = run_loopback(tmp_path)
    out = tmp_path / "run.png"
    r = subprocess.run([sys.executable, "-m", "hsflow.plot", str(stats), "-o", str(out)],
                       capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python")))
    assert r.returncode == 0, r.stderr
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10000


def test_plot_refuses_a_file_that_is_not_a_stats_file_naming_the_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"time": 1.0, "tokens": 0}) + "\n" + json.dumps({"x": 1}) + "\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:2: no numeric \"time\""):
        plot.read_stats(str(bad))
    r = subprocess.run([sys.executable, "-m", "hsflow.plot", str(bad), "-o",
                        str(tmp_path / "x.png")], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python")))
    assert r.returncode == 2
    assert "bad.jsonl:2" in r.stderr or "matplotlib cannot be imported" in r.stderr
