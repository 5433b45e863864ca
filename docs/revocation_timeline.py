"""Draws the revocation benchmark's timeline: world size, notices and revocations.

    .venv/bin/python docs/revocation_timeline.py            # writes docs/revocation-timeline.png

The revocation benchmark (benchmarks/testbed.py revocations) as a picture: the world size of
each of its three runs against the trace's clock, with the notices and the revocations marked.

What is drawn comes from the repository only. The revocation times are the trace the benchmark
replays (benchmarks/traces/three_revocations.csv), each notice comes `spot.notice_seconds`
before its revocation, and each change of size is placed at its revocation plus the offset the
benchmark recorded ("revocation -> new size (s)" in benchmarks/results/testbed.json: rank 0's
first step at the smaller size). The JSON keeps no per-step times, so each line is flat
between its changes, and it ends a little after the last one (the job went on at size 1).
A run without notices (a, a+) has its notices left off: its job never heard them.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import picture  # noqa: E402  (docs/picture.py)
from transientvod.config.schema import SpotConfig  # noqa: E402
from transientvod.spot.providers.trace import load_trace, select_run  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "testbed.json"
TRACE = REPO / "benchmarks" / "traces" / "three_revocations.csv"
OUT = REPO / "docs" / "revocation-timeline.png"
WIDTH, HEIGHT = 900, 560
LEAD_S = 40  # trace seconds shown before the first notice (the benchmark's replay starts there)
TAIL_S = 40  # shown after the last change of size


def revocation_times(trace=TRACE) -> list[float]:
    """The trace's revocations, in trace seconds, in order (its run 1, as the benchmark replays)."""
    return sorted(vm.uptime_s for vm in select_run(load_trace(trace), "1").revoked_vms())


def benchmark_runs(results=RESULTS) -> list[dict]:
    """Each run of the revocation benchmark's latest recording: its label, wall seconds, lost
    steps, world sizes and seconds from each revocation to the new size."""
    document = json.loads(Path(results).read_text())
    run = [r for r in document["runs"] if r.get("id") == "revocations"][-1]
    column = {name: i for i, name in enumerate(run["columns"])}
    runs = []
    for row in run["rows"]:
        runs.append({"label": row[column["run"]], "wall_s": float(row[column["wall s"]]),
                     "lost_steps": int(row[column["lost steps"]]),
                     "sizes": [int(s) for s in str(row[column["sizes"]]).split(">")],
                     "offsets_s": [float(s) for s in str(row[column["revocation -> new size (s)"]]).split(",")]})
    return runs


def draw(out=OUT, results=RESULTS, trace=TRACE) -> Path:
    revoked = revocation_times(trace)
    notice_s = SpotConfig().notice_seconds
    runs = benchmark_runs(results)
    for r in runs:
        if len(r["offsets_s"]) != len(revoked) or len(r["sizes"]) != len(revoked) + 1:
            raise ValueError(f"{results}: run {r['label']!r} records {len(r['offsets_s'])} revocations and sizes "
                             f"{r['sizes']}, but the trace has {len(revoked)} revocations.")
    start = revoked[0] - notice_s - LEAD_S
    end = max(t + o for r in runs for t, o in zip(revoked, r["offsets_s"])) + TAIL_S
    fig, axes = picture.new_figure(WIDTH, HEIGHT, nrows=len(runs), sharex=True, sharey=True)
    for ax, r in zip(axes, runs):
        changes = [t + o for t, o in zip(revoked, r["offsets_s"])]
        ax.step([start, *changes, end], [r["sizes"][0], *r["sizes"][1:], r["sizes"][-1]], where="post",
                color="tab:blue", linewidth=2, label="world size")
        # The JSON records whether a run listened for notices only in its label: "(b) ..., notices"
        # against "(a) ..., no notice".
        heard = "notices" in r["label"] and "no notice" not in r["label"]
        for i, (t, o) in enumerate(zip(revoked, r["offsets_s"])):
            ax.axvline(t, color="tab:red", linewidth=1.5, label="revocation" if i == 0 else None)
            if heard:
                ax.axvline(t - notice_s, color="tab:orange", linestyle=":", linewidth=1.5,
                           label=f"notice ({notice_s:g} s before)" if i == 0 else None)
            if o > 0:
                ax.axvspan(t, t + o, color="tab:red", alpha=0.15, label="stalled" if i == 0 else None)
        stalls = [f"{o:.1f}" for o in r["offsets_s"] if o > 0]
        stalled = f"stalled {' + '.join(stalls)} s" if stalls else "never stalled"
        ax.set_title(f"{r['label']}: {r['lost_steps']} steps lost, {stalled}, {r['wall_s']:.0f} s wall",
                     fontsize=9, loc="left")
        ax.set_ylabel("world size")
        ax.set_yticks(range(1, max(r["sizes"]) + 1))
        ax.set_ylim(0.5, max(r["sizes"]) + 0.5)
        ax.grid(alpha=0.3)
    # One legend for the three panels (every mark is on some panel), below them, off the lines.
    marks = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            marks.setdefault(label, handle)
    fig.legend(marks.values(), marks.keys(), loc="outside lower center", ncols=len(marks), fontsize=8)
    axes[-1].set_xlabel("trace seconds (benchmarks/traces/three_revocations.csv, replayed at real time)")
    axes[-1].set_xlim(start, end)
    fig.suptitle("Three revocations on 4 testbed hosts: world size, notices and revocations", fontsize=11)
    return picture.save(fig, out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(OUT), help="the PNG to write (default: %(default)s)")
    args = parser.parse_args(argv)
    print(draw(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
