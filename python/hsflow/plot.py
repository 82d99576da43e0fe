# SPDX-License-Identifier: Apache-2.0
"""Plots a consumer's --stats-jsonl file (one JSON object per second):

    python -m hsflow.plot STATS.jsonl -o run.png

One panel each, over wall-clock time: tokens/s delivered to the trainer
(from the change in "tokens" between lines), cache fill and pinned bytes,
tickets out, producer stall and trainer starve. Needs matplotlib; the
figures are read with the standard library alone (read_stats), so a
caller can plot them another way.
"""
import argparse
import datetime
import json
import os
import sys

# The panels: (title, y label, [(field or derived name, legend), ...]).
# recent_*: over the consumer's last 30 s (older files without them plot 0).
PANELS = [
    ("tokens delivered", "tokens/s", [("tokens_per_s_now", "tokens/s (each second)"),
                                      ("recent_tokens_per_s", "last 30 s"),
                                      ("tokens_per_s", "run average")]),
    ("host-RAM cache", "GiB", [("cache_used_gib", "filled"), ("cache_ready_gib", "pinned"),
                               ("cache_capacity_gib", "capacity")]),
    ("tickets out", "tickets", [("tickets_out", "tickets out")]),
    ("waiting and verifying", "% of the time",
     [("producer_stall_pct", "producer stall (last 30 s)"),
      ("recent_starve_pct", "trainer starve (last 30 s)"),
      ("starve_pct", "trainer starve (run)"),
      ("recent_verify_pct", "checksum threads busy (last 30 s)")]),
]


def read_stats(path):
    """The lines of a --stats-jsonl file as dicts sorted by wall time, with
    derived figures: "wall" (Unix seconds; older files that wrote only a
    monotonic "time" are shifted to end at the file's last change),
    "tokens_per_s_now" (between this line and the one before) and the cache
    figures in GiB. Raises ValueError naming the line that is not JSON or has
    no time."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError("%s:%d: not a JSON object (%s)" % (path, n, e)) from None
            if not isinstance(row, dict) or not isinstance(row.get("time"), (int, float)):
                raise ValueError('%s:%d: no numeric "time"; is this an hs-consumer '
                                 '--stats-jsonl file?' % (path, n))
            rows.append(row)
    if not rows:
        raise ValueError("%s: no lines to plot" % path)
    if "monotonic_s" not in rows[0] and rows[-1]["time"] < 1e9:
        # Written before "time" became wall-clock: anchor the last line at
        # the file's modification time.
        shift = os.path.getmtime(path) - rows[-1]["time"]
        for r in rows:
            r["wall"] = r["time"] + shift
    else:
        for r in rows:
            r["wall"] = r["time"]
    rows.sort(key=lambda r: r["wall"])
    # The line written at exit can share its millisecond with the periodic
    # one before it: keep the later of lines at the same instant.
    rows = [r for r, n in zip(rows, rows[1:] + [None]) if n is None or n["wall"] > r["wall"]]
    prev = None
    for r in rows:
        rate = 0.0
        if prev is not None and r["wall"] > prev["wall"]:
            rate = max(0.0, (r.get("tokens", 0) - prev.get("tokens", 0)) / (r["wall"] - prev["wall"]))
        r["tokens_per_s_now"] = rate
        for k in ("cache_used", "cache_ready_bytes", "cache_capacity"):
            r[k.replace("_bytes", "") + "_gib"] = r.get(k, 0) / float(1 << 30)
        prev = r
    return rows


def plot(rows, out, title=None):
    """Writes the panels of rows (read_stats) to the image file out."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    t = [datetime.datetime.fromtimestamp(r["wall"]) for r in rows]
    fig, axes = plt.subplots(len(PANELS), 1, figsize=(9, 2.3 * len(PANELS)), sharex=True)
    for ax, (name, unit, series) in zip(axes, PANELS):
        for field, label in series:
            ax.plot(t, [r.get(field, 0) for r in rows], label=label, linewidth=1.4)
        ax.set_title(name, fontsize=10, loc="left")
        ax.set_ylabel(unit)
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        if len(series) > 1:
            ax.legend(fontsize=8, loc="upper right")
    axes[-1].xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S"))
    axes[-1].set_xlabel("wall-clock time (local)")
    last = rows[-1]
    fig.suptitle(title or "hsflow run: %d/%d batches, %.0f tokens/s, %.2f GB/s" % (
        last.get("batches_delivered", 0), last.get("batches_planned", 0),
        last.get("tokens_per_s", 0), last.get("gbytes_per_s", 0)), fontsize=11)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(
        allow_abbrev=False,
        prog="python -m hsflow.plot",
        description="Plot an hs-consumer --stats-jsonl file: tokens/s, cache fill and pinned "
                    "bytes, tickets out, producer stall and trainer starve over wall-clock time.",
        epilog="example: hs-consumer --loopback 2 --stats-jsonl stats.jsonl ... && "
               "python -m hsflow.plot stats.jsonl -o run.png")
    ap.add_argument("stats", help="the --stats-jsonl file of a run")
    ap.add_argument("-o", "--out", required=True, help="image to write (.png, .svg, .pdf)")
    ap.add_argument("--title", help="figure title (default: the run's totals)")
    args = ap.parse_args(argv)
    try:
        import matplotlib  # noqa: F401
    except Exception as e:  # missing, or built against another numpy
        from ._deps import missing_text
        print("hsflow.plot: %s; or apt install python3-matplotlib" % missing_text(
            "matplotlib", "python -m hsflow.plot", "plot", "%s: %s" % (type(e).__name__, e)),
            file=sys.stderr)
        return 2
    try:
        rows = read_stats(args.stats)
    except (OSError, ValueError) as e:
        print("hsflow.plot: %s" % e, file=sys.stderr)
        return 2
    plot(rows, args.out, args.title)
    print("hsflow.plot: %d seconds of %s -> %s" % (
        round(rows[-1]["wall"] - rows[0]["wall"]), args.stats, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
