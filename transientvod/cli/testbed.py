"""`transientvod testbed`: a real cluster on this machine (transientvod/testbed/)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_parser(subparsers) -> None:
    testbed = subparsers.add_parser("testbed", help="a real cluster on this machine: namespaced hosts with sshd (root)")
    actions = testbed.add_subparsers(dest="action", required=True)
    helps = {"up": "make the head and N hosts", "down": "remove all the testbed made",
             "status": "hosts, addresses, link, sshd and shaping", "vanish": "the host disappears from the network",
             "kill": "the host's processes are killed", "restore": "a replacement server comes back",
             "exec": "run a command on the head (after --)",
             "boot": "the host's sshd stops and it runs user data as a new VM would (fleet --print-user-data)"}
    for action, text in helps.items():
        verb = actions.add_parser(action, help=text)
        verb.add_argument("--name", default="tvd", help="the testbed's name, the prefix of its hosts (default: tvd)")
        if action == "up":
            verb.add_argument("--hosts", type=int, default=3, help="how many hosts (2..64)")
            verb.add_argument("--bandwidth", default="",
                              help="each host's egress rate, for example 100mbit; RATE/QUEUE sets how long a packet "
                                   "may wait in tbf's queue before it is dropped (default 50ms), e.g. 25mbit/400ms")
            verb.add_argument("--congestion", default="",
                              help="every machine's TCP congestion control, for example cubic or bbr (default: "
                                   "this machine's, net.ipv4.tcp_congestion_control)")
            verb.add_argument("--private-disk", action="append", default=[], metavar="DIR",
                              help="each host gets an empty DIR of its own, seen by no other host nor the head, as "
                                   "VMs that share no file system (repeatable; made if missing)")
        elif action in ("vanish", "kill", "restore"):
            verb.add_argument("host", help="a host of the testbed, for example tvd-h2")
        elif action == "exec":
            verb.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
        elif action == "boot":
            verb.add_argument("host", help="a host of the testbed, for example tvd-h2")
            verb.add_argument("--user-data", required=True, help="the script to run, as root, in the foreground")
    testbed.set_defaults(func=cmd_testbed)


def cmd_testbed(args) -> int:
    from transientvod.testbed import cluster

    if args.action == "up":
        record = cluster.up(args.name, args.hosts, args.bandwidth, tuple(args.private_disk), args.congestion)
        layout = record.layout
        print(f"testbed {layout.name}: head {layout.head.name} ({layout.head.address}), hosts "
              + ", ".join(f"{h.name} ({h.address})" for h in layout.hosts)
              + (f"; each host's egress shaped to {layout.bandwidth}" if layout.bandwidth else "; links unshaped")
              + (f"; TCP congestion control {layout.congestion}" if layout.congestion else "")
              + private_disk_words(record.private_disk)
              + f". Run commands on the head with: transientvod testbed exec --name {layout.name} -- COMMAND")
    elif args.action == "down":
        cluster.down(args.name)
        print(f"testbed {args.name}: removed")
    elif args.action == "status":
        rows = cluster.status(args.name)
        columns = ("host", "address", "condition", "link", "sshd", "shaping", "congestion")
        widths = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in columns}
        for row in [dict(zip(columns, columns))] + rows:
            print("  ".join(str(row[c]).ljust(widths[c]) for c in columns).rstrip())
        from transientvod.testbed.record import require_record
        private = require_record(args.name).private_disk
        if private:
            print(private_disk_words(private).lstrip("; "))
    elif args.action == "exec":
        command = args.command[1:] if args.command[:1] == ["--"] else args.command
        return cluster.exec_on_head(args.name, command)
    elif args.action == "boot":
        from transientvod.testbed.boot import boot
        sys.stdout.write(boot(args.name, args.host, Path(args.user_data)))
        print(f"testbed {args.name}: {args.host} booted from {args.user_data}")
    else:  # vanish, kill, restore
        getattr(cluster, args.action)(args.name, args.host)
        done = {"vanish": "vanished", "kill": "killed", "restore": "restored"}[args.action]
        print(f"testbed {args.name}: {args.host} {done}")
    return 0


def private_disk_words(directories: list[str]) -> str:
    if not directories:
        return ""
    return (f"; each host has its own {', '.join(directories)} (empty at start and after restore; "
            "the head has this machine's)")
