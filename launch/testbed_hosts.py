#!/usr/bin/env python3
"""Host discovery for a testbed (`transientvod testbed up`): Horovod's `--host-discovery-script`.

Prints `host:slots` for every testbed host that is up, as a cloud's API lists its running
servers, and nothing else; exit 0. A host that vanished or was killed drops out; a restored
one comes back. `--lag SECONDS` keeps reporting a change's old state that long, as a cloud's
API lags behind its servers::

    python launch/testbed_hosts.py --name tvd --slots 1 --lag 5
    python -m transientvod.launch.testbed_hosts --name tvd --slots 1 --lag 5    # installed

Horovod runs it every second, so it imports nothing beyond the testbed's record.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

if not __package__:  # run as a file from a checkout (python launch/testbed_hosts.py): the package is beside launch/
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from transientvod.testbed import TestbedError  # noqa: E402
from transientvod.testbed.record import require_record  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--name", default="tvd", help="the testbed's name (default: tvd)")
    parser.add_argument("--slots", type=int, default=1, help="slots per host (default: 1)")
    parser.add_argument("--lag", type=float, default=0.0, help="seconds the listing lags behind a change")
    args = parser.parse_args(argv)
    try:
        record = require_record(args.name)
    except TestbedError as e:
        print(f"testbed_hosts: {e}", file=sys.stderr)
        return 2
    for host in record.listed_hosts(time.time(), args.lag):
        print(f"{host}:{args.slots}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
