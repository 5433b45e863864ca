"""How long Horovod's discovery call takes: launch/spot_hosts.py with a 100-host state.

    .venv/bin/python benchmarks/discovery.py [--runs 50] [--hosts 100]

Horovod runs the discovery script every second, so it must be quick; the goal is a median
under 150 ms. Printed beside it: a bare `python -c pass` (the interpreter's own start-up,
the floor no script can beat) and the ratio of the two.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from transientvod.spot.hosts import NOTICED, HostState, HostStatus, write_host_state  # noqa: E402

SCRIPT = Path(__file__).resolve().parents[1] / "launch" / "spot_hosts.py"
GOAL_MS = 150.0


def time_command(argv: list[str], runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
        times.append((time.perf_counter() - start) * 1000)
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--hosts", type=int, default=100)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "hosts.json"
        hosts = [HostStatus(f"ip-10-0-{i // 250}-{i % 250}.ec2.internal", 8,
                            NOTICED if i % 10 == 0 else "usable") for i in range(args.hosts)]
        write_host_state(state, HostState("aws", time.time(), hosts))
        floor = time_command([sys.executable, "-c", "pass"], args.runs)
        discovery = time_command([sys.executable, str(SCRIPT), "--state-file", str(state)], args.runs)
    print(f"{'command':<32} {'median ms':>10} {'p90 ms':>8}")
    for name, times in (("python -c pass", floor), (f"spot_hosts.py ({args.hosts} hosts)", discovery)):
        p90 = statistics.quantiles(times, n=10)[-1]
        print(f"{name:<32} {statistics.median(times):>10.1f} {p90:>8.1f}")
    median = statistics.median(discovery)
    print(f"spot_hosts.py / python start-up: {median / statistics.median(floor):.2f}x; "
          f"goal {GOAL_MS:.0f} ms: {'met' if median < GOAL_MS else 'NOT met'} ({median / GOAL_MS:.2f} of it)")


if __name__ == "__main__":
    main()
