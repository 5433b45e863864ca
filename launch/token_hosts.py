#!/usr/bin/env python3
"""The discovery command of a job with remote hosts: the user's (or the spot watcher's)
discovery, with each remote host listed only once it holds the channel's token file.

    python -m transientvod.launch.token_hosts --token-file .transientvod/channel-tokens/ID.token \\
        --discovery "python -m transientvod.launch.spot_hosts --state-file runs/job/hosts.json"

The launcher puts this in horovodrun's --host-discovery-script (remote_hosts.HeadServices),
so the token reaches every host horovodrun will start a worker on before it starts one, through
ssh's stdin (channel/token.py says why not the command line). Horovod runs discovery every
second: a host already given the token is not asked again (the list is kept in ID.hosts beside
the token), a host that left the listing is forgotten (a new server may come back under its
name), and a host that does not take the token is left out of this listing and tried again at
the next call. Local hosts read the launcher's own file.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

if not __package__:  # run as a file from a checkout: the package is beside launch/
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from transientvod.channel.token import home, install_on, installed_list  # noqa: E402
from transientvod.spot.reach.ssh import MAX_PARALLEL, remote_hosts  # noqa: E402


def read_installed(token_file: str) -> set[str]:
    try:
        return set(json.loads((home() / installed_list(token_file)).read_text()))
    except (OSError, ValueError):
        return set()


def write_installed(token_file: str, hosts: set[str]) -> None:
    path = home() / installed_list(token_file)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(sorted(hosts)))
    os.replace(temporary, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="discovery that gives each remote host the channel's token first")
    parser.add_argument("--token-file", required=True, help="the token file, relative to the home directory")
    parser.add_argument("--discovery", required=True, help="the discovery command to wrap (run through the shell)")
    args = parser.parse_args(argv)
    inner = subprocess.run(args.discovery, shell=True, capture_output=True, text=True)
    sys.stderr.write(inner.stderr)
    if inner.returncode != 0:
        return inner.returncode
    lines = [line.strip() for line in inner.stdout.splitlines() if line.strip()]
    listed = [line.rsplit(":", 1)[0] for line in lines]
    remote = set(remote_hosts(listed))
    installed = read_installed(args.token_file) & set(listed)  # a host that left is forgotten
    missing = sorted(remote - installed)
    if missing:
        token = (home() / args.token_file).read_text()
        with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(missing))) as pool:
            answers = list(pool.map(lambda host: install_on(host, args.token_file, token), missing))
        for host, why in zip(missing, answers):
            if why is None:
                installed.add(host)
            else:
                print(f"token_hosts: {host} is left out until it takes the channel's token over ssh ({why}).",
                      file=sys.stderr)
    write_installed(args.token_file, installed)
    ready = [line for line, host in zip(lines, listed) if host not in remote or host in installed]
    sys.stdout.write("".join(f"{line}\n" for line in ready))
    return 0


if __name__ == "__main__":
    sys.exit(main())
