"""What a revocation benchmark reads from a finished job: how long each revocation stalled the
ring, and why a job that failed stopped. Shared by benchmarks/revocations.py (loopback) and
benchmarks/testbed.py revocations (namespaced hosts), so both tables mean the same thing."""
from __future__ import annotations

import json
from pathlib import Path


def revocation_delays(run_dir: Path, hosts_at_start: int) -> list[float]:
    """For each revoked host, in revocation order: seconds from its revocation to rank 0's first
    sync at a size no larger than what was left after it (negative: the job already trained at
    that size before the server went, as it does when it leaves at its notice)."""
    hosts = json.loads((run_dir / "hosts.json").read_text())["hosts"]
    revoked = sorted((h for h in hosts if h["state"] == "gone"), key=lambda h: h["terminate_at"])
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines() if line.strip()]
    synced = [e for e in events if e.get("event", "synced") == "synced" and e["rank"] == 0]
    delays = []
    for gone, host in enumerate(revoked, start=1):
        times = [e["time"] for e in synced if e["size"] <= hosts_at_start - gone]
        delays.append(min(times) - host["terminate_at"] if times else float("nan"))
    return delays


def why_it_failed(log_text: str) -> str:
    """The last line of a failed job's log that says why it stopped."""
    reasons = [line for line in log_text.splitlines()
               if "timeout" in line.lower() or "failure count" in line or "transientvod: the job" in line]
    return reasons[-1].strip()[-160:] if reasons else "see its log"
