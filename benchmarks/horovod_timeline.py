"""Where Horovod's background thread spends a job's steps, from rank 0's timeline.

    python benchmarks/exchange.py --steps 300 --bandwidths 100mbit/400ms --exchanges int8:2 --timeline
    python benchmarks/horovod_timeline.py runs/exchange-bench/exchange-100mbit-q400ms-int8-s2/timeline.json

Horovod runs one collective at a time per rank, in its background thread, each only once every
rank has asked for it (the negotiation). On a link that a step's bytes nearly fill, the time
that thread spends *between* collectives is what staleness cannot hide. This prints, over the
second half of the timeline (past start-up and the synchronous warm-up):
- each kind of op (shards, owners, sum, the commit vote, other): how many,
  its mean time executing on rank 0, and its share of the wall time;
- the idle gaps between one op and the next, by the kinds on either side, and when the next
  op's negotiation began in rank 0's timeline, relative to the end of the op before
  (negative: it was already being negotiated while that op ran).
HOROVOD_TIMELINE writes the file on rank 0 only; writing it costs time, so compare steps/s
only between jobs run without it.
"""
from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path

EXECUTED = ("ALLTOALL", "ALLREDUCE", "ALLGATHER", "BROADCAST")
EXCHANGE_PHASES = ("shards", "owners", "sum")  # codecs/scatter_reduce.py's two alltoalls, fp32.py's allreduce


def load_spans(path: Path) -> list[tuple[str, str, int, int]]:
    """(tensor name, activity, start µs, end µs) for every begin/end pair, by start time. A job
    that ended without closing the JSON array (Horovod appends to it) still reads."""
    text = path.read_text().rstrip().rstrip(",")
    events = json.loads(text if text.endswith("]") else text + "]")
    names = {e["pid"]: e["args"]["name"] for e in events
             if e.get("name") == "process_name" and "name" in e.get("args", {})}
    open_spans, spans = collections.defaultdict(list), []
    for event in events:
        if event.get("ph") == "B":
            open_spans[event["pid"]].append((event["name"], event["ts"]))
        elif event.get("ph") == "E" and open_spans[event["pid"]]:
            activity, start = open_spans[event["pid"]].pop()
            spans.append((names.get(event["pid"], "?"), activity, start, event["ts"]))
    return sorted(spans, key=lambda span: span[2])


def kind(tensor: str) -> str:
    """The commit vote, a phase of the gradient exchange, or anything else (the state's
    broadcasts after a sync, the evaluation's counts, hvd.DistributedOptimizer's allreduces)."""
    if "commit_vote" in tensor:
        return "vote"
    last = tensor.rsplit(".", 1)[-1]
    return last if last in EXCHANGE_PHASES else "other"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("timeline", type=Path)
    parser.add_argument("--skip", type=float, default=0.5, help="share of the timeline to leave out at its start")
    parser.add_argument("--gaps", type=int, default=8, help="how many kinds of gap to list, the costliest first")
    args = parser.parse_args()
    if not args.timeline.is_file():
        parser.error(f"{args.timeline} is not a file; give the timeline.json of a job run with --timeline")
    spans = load_spans(args.timeline)
    if not spans:
        parser.error(f"{args.timeline} holds no Horovod activity")
    begin = spans[0][2] + (spans[-1][3] - spans[0][2]) * args.skip
    wall = spans[-1][3] - begin
    executed = [s for s in spans if s[2] >= begin and s[1] in EXECUTED]
    negotiations = collections.defaultdict(list)
    for tensor, activity, start, end in spans:
        if activity.startswith("NEGOTIATE"):
            negotiations[tensor].append((start, end))

    print(f"{args.timeline}: {wall / 1e6:.1f} s of rank 0's background thread")
    by_kind = collections.defaultdict(list)
    for tensor, _, start, end in executed:
        by_kind[kind(tensor)].append(end - start)
    for name, durations in sorted(by_kind.items()):
        print(f"  {name:>8}: {len(durations):5d} ops, {sum(durations) / len(durations) / 1e3:6.1f} ms each, "
              f"{sum(durations) / wall:4.0%} of the time")
    gaps = collections.defaultdict(list)
    for before, after in zip(executed, executed[1:]):
        asked = [start for start, end in negotiations[after[0]] if before[2] - 200_000 <= end <= after[2] + 1]
        gaps[(kind(before[0]), kind(after[0]))].append((after[2] - before[3], asked[-1] - before[3] if asked else None))
    idle = sum(gap for pairs in gaps.values() for gap, _ in pairs)
    print(f"  idle between ops: {idle / wall:.0%} of the time")
    for (first, then), pairs in sorted(gaps.items(), key=lambda item: -sum(g for g, _ in item[1]))[:args.gaps]:
        asked = [a for _, a in pairs if a is not None]
        print(f"  {first:>8} -> {then:<8} {len(pairs):5d} gaps, {sum(g for g, _ in pairs) / len(pairs) / 1e3:6.1f} ms "
              f"each ({sum(g for g, _ in pairs) / wall:4.0%} of the time); next negotiation began "
              + (f"{sum(asked) / len(asked) / 1e3:+.1f} ms after" if asked else "?"))


if __name__ == "__main__":
    main()
