"""A job's own revocations as a trace the planner replays: `simulate --trace runs/NAME`.

    text, note = trace_from_run("runs/calib")   # the trace CSV (spot/trace.py's format), one line why

Every rank of a transientvod job writes a `synced` event to its run directory's events.jsonl
each time the ring forms (its host, the world size, the step, the time). Read in time order,
the rings say which servers the job started with and when each of them left: a server of the
first ring that is missing from a later ring left the job there, which for a job on transient
servers is its revocation; one in every ring lasted the whole run (to the last logged metrics
row). The first ring's rank 0 is the master. Servers that joined later are replacements, not in
the trace (the planner models them with --replacement-delay).

The trace's Uptime runs from the cluster's start and holds its provisioning (the study's
format); the job's clock starts at its first ring, so the planner's fitted provisioning for
that many servers is added to every uptime. The replay is of this one run: every simulated
run replays it, which says what this job's revocations would cost elsewhere, not how likely
they are. Never imports torch or horovod.
"""
from __future__ import annotations

import json
from pathlib import Path

from transientvod.planner.provisioning import fit_provisioning
from transientvod.planner.study_data import PlanError

EVENTS = "events.jsonl"
METRICS = "metrics.jsonl"
TRACE_FILE = "revocation-trace.csv"  # written into the run directory, for the user to read
NEW_RING_GAP_S = 30.0  # rows of one ring are written within moments of each other


def _rows(path: Path) -> list[dict]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return []
    except (OSError, UnicodeDecodeError) as e:
        raise PlanError(f"cannot read {path} ({getattr(e, 'strerror', None) or e}).") from None
    rows = []
    for number, line in enumerate(lines, 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                raise PlanError(f"{path}, line {number}, is not JSON; the run's records are damaged.") from None
    return rows


def rings(run_dir: Path) -> list[tuple[float, list[str]]]:
    """(time the ring formed, its hosts by rank) for every ring of the job, in order."""
    synced = sorted((r for r in _rows(run_dir / EVENTS) if r.get("event") == "synced"), key=lambda r: r["time"])
    found: list[tuple[float, dict]] = []
    key = None
    for row in synced:
        this = (row["step"], row["size"])
        if key != this or row["time"] - found[-1][0] > NEW_RING_GAP_S:
            found.append((row["time"], {}))
            key = this
        found[-1][1][row["rank"]] = row.get("host") or row.get("address") or f"rank-{row['rank']}"
    return [(at, [hosts[rank] for rank in sorted(hosts)]) for at, hosts in found]


def trace_from_run(run_dir) -> tuple[str, str]:
    run_dir = Path(run_dir)
    formed = rings(run_dir)
    if not formed:
        raise PlanError(f"{run_dir} holds no revocation log ({EVENTS} has no synced events); give the run directory "
                        "of a job that trained (runs/NAME).")
    start, first = formed[0]
    first = list(dict.fromkeys(first))  # a host with several slots is one server
    logged = [r["time"] for r in _rows(run_dir / METRICS) if "time" in r]
    end = max([formed[-1][0], *logged])
    left = {}
    for at, hosts in formed[1:]:
        for host in first:
            if host not in hosts and host not in left:
                left[host] = at
    provisioning = fit_provisioning().seconds(len(first))
    run_id = run_dir.name.replace(",", "_")
    lines = ["VM_name,Uptime,Revoked"]
    for i, host in enumerate(first):
        name = f"{run_id}-master" if i == 0 else f"{run_id}-worker-{i - 1}"
        revoked = host in left
        uptime = (left[host] if revoked else end) - start + provisioning
        lines.append(f"{name},{uptime:.3f},{'Revoked' if revoked else 'Job completed'}")
    note = (f"the revocations of {run_dir}: {len(first)} servers, {len(left)} revoked; uptimes from its first ring "
            f"plus the fitted provisioning ({provisioning:.0f} s)")
    return "\n".join(lines) + "\n", note


def write_trace_from_run(run_dir) -> tuple[Path, str]:
    """The trace written as TRACE_FILE in the run directory; its path and the note."""
    text, note = trace_from_run(run_dir)
    path = Path(run_dir) / TRACE_FILE
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as e:
        raise PlanError(f"cannot write {path} ({e.strerror}).") from None
    return path, note
