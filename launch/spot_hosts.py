#!/usr/bin/env python3
"""Horovod's --host-discovery-script for spot servers: prints `host:slots`, nothing else.

    horovodrun -np 4 --min-np 2 --max-np 8 \\
        --host-discovery-script "python launch/spot_hosts.py --state-file runs/job/hosts.json" ...

(from a checkout; wherever transientvod is installed: `python -m transientvod.launch.spot_hosts ...`)

Horovod runs this every second, so it never calls a cloud API: it reads the host-state file
that the watcher (`transientvod watch ...`) keeps current, and prints the usable hosts (hosts
with an interruption notice are already left out, so Horovod removes them gracefully before
they die). If the watcher has not written for longer than --stale-after seconds, it says so
on stderr and keeps printing the last known usable hosts. It exits non-zero only when there
has never been a state to read.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

if not __package__:  # run as a file from a checkout (python launch/spot_hosts.py): the package is beside launch/
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from transientvod.spot.hosts import HostStateError, read_host_state  # noqa: E402  (never imports torch)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="print the usable spot hosts as host:slots lines")
    parser.add_argument("--state-file", required=True, help="the host-state file the watcher writes")
    parser.add_argument("--stale-after", type=float, default=30.0,
                        help="seconds without a write after which the state is reported stale (default 30)")
    args = parser.parse_args(argv)
    try:
        state = read_host_state(args.state_file)
    except HostStateError as e:
        print(f"spot_hosts: {e}", file=sys.stderr)
        return 1
    age = time.time() - state.written_at
    if age > args.stale_after:
        print(f"spot_hosts: the host state in {args.state_file} is {age:.0f} s old (watcher stopped?); "
              "printing the last known usable hosts.", file=sys.stderr)
    sys.stdout.write("".join(f"{h.name}:{h.slots}\n" for h in state.usable()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
