"""Draws the exchange benchmark's steps/s per codec and staleness at each bandwidth.

    .venv/bin/python docs/exchange_chart.py            # writes docs/exchange-chart.png

One panel per recorded run of benchmarks/exchange.py (benchmarks/results/exchange.json), each
with its bandwidths side by side (the run's columns between "s" and "comm": unshaped, then the
shaped link); one bar per codec and staleness, the codec by colour, staleness 2 hatched. Each
run measured its own unshaped bars, so the unshaped bars of two panels are two measurements of
the same thing, not one copied. The numbers are the tables on the results page.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import picture  # noqa: E402  (docs/picture.py)

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results" / "exchange.json"
OUT = REPO / "docs" / "exchange-chart.png"
WIDTH, HEIGHT = 900, 480
CODEC_COLOURS = {"none": "tab:grey", "fp16": "tab:blue", "int8": "tab:green"}
STALENESS_HATCHES = {0: "", 1: "..", 2: "//"}


def exchange_runs(results=RESULTS) -> list[dict]:
    """Each recorded run: its id, its bandwidths and {(codec, staleness): [steps/s per bandwidth]}."""
    document = json.loads(Path(results).read_text())
    runs = []
    for run in document["runs"]:
        columns = run["columns"]
        first, last = columns.index("s") + 1, columns.index("comm")
        bars = {(row[0], int(row[1])): [float(v) for v in row[first:last]] for row in run["rows"]}
        runs.append({"id": run["id"], "title": run["title"], "bandwidths": columns[first:last], "bars": bars})
    return runs


def draw(out=OUT, results=RESULTS) -> Path:
    runs = exchange_runs(results)
    fig, axes = picture.new_figure(WIDTH, HEIGHT, ncols=len(runs), sharey=True, squeeze=False)
    for ax, run in zip(axes[0], runs):
        keys = list(run["bars"])
        width = 0.8 / len(keys)
        for k, (codec, staleness) in enumerate(keys):
            x = [b + (k - (len(keys) - 1) / 2) * width for b in range(len(run["bandwidths"]))]
            values = run["bars"][(codec, staleness)]
            bars = ax.bar(x, values, width, color=CODEC_COLOURS.get(codec, "tab:purple"),
                          hatch=STALENESS_HATCHES.get(staleness, "xx"), edgecolor="white", linewidth=0.5,
                          label=f"{codec}, s={staleness}")
            ax.bar_label(bars, fmt="%.1f", fontsize=6.5, padding=1)
        ax.set_xticks(range(len(run["bandwidths"])), run["bandwidths"])
        ax.set_title(run["title"], fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel("steps/s (4 hosts, ResNet-32)")
    axes[0][-1].legend(loc="upper right", fontsize=8, title="codec, staleness", title_fontsize=8)
    fig.suptitle("The exchange: steps/s by codec and staleness at each bandwidth", fontsize=11)
    return picture.save(fig, out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(OUT), help="the PNG to write (default: %(default)s)")
    args = parser.parse_args(argv)
    print(draw(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
