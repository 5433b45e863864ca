#!/usr/bin/env python3
"""Host discovery for local runs and the demo: Horovod's `--host-discovery-script` contract.

Prints `host:slots` lines on stdout and nothing else, exit 0; diagnostics go to stderr.
Horovod runs it every second. The host list can change with the job's progress, which makes
a repeatable rehearsal of losing and regaining a server on one machine::

    python launch/local_hosts.py --phase 0=localhost:1,127.0.0.1:1 \\
        --phase 120=localhost:1 --phase 240=localhost:1,127.0.0.1:1 \\
        --progress runs/demo/metrics.jsonl

Each `--phase STEP=HOSTS` applies from the job's step STEP on; the current step is the last
`"step"` written to the progress file (0 while it does not exist). `localhost` and
`127.0.0.1` are two distinct hosts to Horovod that both run here without ssh.
Installed, the same script is `python -m transientvod.launch.local_hosts`.
(Discovery from real spot lifecycles lives in launch/spot_hosts.py, same contract.)
"""
from __future__ import annotations

import argparse
import json
import os
import sys

TAIL_BYTES = 4096  # the progress file only grows; its last line is all we need


def parse_phase(text: str) -> tuple[int, list[str]]:
    step_text, sep, hosts_text = text.partition("=")
    if not sep or not step_text.strip().isdigit():
        raise ValueError(f"--phase {text!r} must look like STEP=host:slots,host:slots (for example 0=localhost:1).")
    hosts = [h.strip() for h in hosts_text.split(",") if h.strip()]
    for host in hosts:
        name, colon, slots = host.rpartition(":")
        if not colon or not name or not slots.isdigit() or int(slots) < 1:
            raise ValueError(f"--phase {text!r}: {host!r} must be host:slots with slots >= 1.")
    return int(step_text), hosts


def current_step(progress_path: str | None) -> int:
    if not progress_path or not os.path.exists(progress_path):
        return 0
    with open(progress_path, "rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - TAIL_BYTES))
        lines = f.read().decode(errors="replace").splitlines()
    for line in reversed(lines):
        try:
            return int(json.loads(line)["step"])
        except (ValueError, KeyError, TypeError):
            continue  # a line cut by the seek, or being written right now
    return 0


def hosts_now(phases: list[tuple[int, list[str]]], step: int) -> list[str]:
    active: list[str] = []
    for start, hosts in sorted(phases):
        if start <= step:
            active = hosts
    return active


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", help="a fixed host list, host:slots,host:slots (same as --phase 0=...)")
    parser.add_argument("--phase", action="append", default=[], metavar="STEP=HOSTS",
                        help="the hosts from step STEP on; repeat for each change")
    parser.add_argument("--progress", help="a JSON-lines file whose last 'step' is the job's progress")
    args = parser.parse_args(argv)
    try:
        phases = [parse_phase(p) for p in args.phase]
        if args.hosts:
            phases.append(parse_phase("0=" + args.hosts))
    except ValueError as e:
        print(f"local_hosts: {e}", file=sys.stderr)
        return 2
    if not phases:
        print("local_hosts: give --hosts or at least one --phase.", file=sys.stderr)
        return 2
    for host in hosts_now(phases, current_step(args.progress)):
        print(host)
    return 0


if __name__ == "__main__":
    sys.exit(main())
