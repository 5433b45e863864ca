"""What a job whose hosts are other machines needs from the head: its address, and its services.

(Whether those hosts share a local checkpoint.dir is checkpoint/shared_disk.py's job.)

- `HeadServices`: the launcher's channel (channel/) serves the resolved config and takes
  the records; a local `sqlite:` tracking store is served through `mlflow server` on the head
  (tracking/head_server.py), and workers get its URL instead of a path they cannot open.
  The channel's token goes to every host as a file of mode 0600 (channel/token.py), through
  the wrapped discovery command, never through horovodrun's environment.
Both bind the head's cluster address (the one the hosts reach it by), on ports from
cluster.head_ports.
"""
from __future__ import annotations

import copy
import json
import secrets
import shlex
import socket
import sys
from concurrent.futures import ThreadPoolExecutor

import psutil

from transientvod.channel import token as channel_token
from transientvod.channel.server import JobChannel
from transientvod.checkpoint.shared_disk import LAUNCHER_MARKER, is_local_path, local_path
from transientvod.config import Config, to_yaml
from transientvod.spot.reach.ssh import MAX_PARALLEL

TOKEN_HOSTS_MODULE = "transientvod.launch.token_hosts"  # launch/token_hosts.py, shipped in the package


class RemoteHostsError(RuntimeError):
    """A job with remote hosts cannot start as configured; one sentence."""


def head_address(remote: list[str], interface: str = "") -> str:
    """The head's address on the cluster network: that of `interface` if given, else the one
    this machine's routing uses to reach the first remote host (no packet is sent), or with no
    host listed yet, its default route's, or with no default route, its only address."""
    if interface:
        for address in psutil.net_if_addrs().get(interface, []):
            if address.family == socket.AF_INET:
                return address.address
        raise RemoteHostsError(f"cluster.network_interface is {interface!r}, which has no IPv4 address on this "
                               "machine; name the interface the hosts reach it by.")
    try:
        # No host listed yet (a cloud's instances still joining): the default route's address.
        target = socket.gethostbyname(remote[0]) if remote else "10.255.255.255"
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
            udp.connect((target, 9))  # a UDP connect only picks the route and the source address
            return udp.getsockname()[0]
    except OSError as e:
        # No default route (a private network's machine), and no host to route to yet: a
        # machine with one address besides loopback can only be reached there.
        only = _sole_ipv4_address() if not remote else None
        if only:
            return only
        raise RemoteHostsError(f"the launcher finds no route to {remote[0] if remote else 'the hosts'} ({e}); set "
                               "cluster.network_interface to the interface the hosts reach this machine by.") from None


def _sole_ipv4_address() -> str | None:
    """This machine's IPv4 address if it has exactly one outside loopback, else None."""
    found = {a.address for addresses in psutil.net_if_addrs().values() for a in addresses
             if a.family == socket.AF_INET and not a.address.startswith("127.")}
    return found.pop() if len(found) == 1 else None


class HeadServices:
    """The channel, and the tracking store's server when the store is a local SQLite file;
    a context manager that stops both."""

    def __init__(self, config: Config, remote: list[str]):
        self.token_file = None
        self.address = head_address(remote, config.cluster.network_interface)
        self.store_server = None
        self.marker = None
        if is_local_path(config.checkpoint_dir):
            self.marker = local_path(config.checkpoint_dir) / LAUNCHER_MARKER
            self.marker.parent.mkdir(parents=True, exist_ok=True)
            self.marker.write_text("a job with remote hosts runs; its workers check that they see this file\n")
        ports = tuple(config.cluster.head_ports)
        worker_config = copy.deepcopy(config)
        if config.tracking.enabled and config.tracking.uri.startswith("sqlite:"):
            from transientvod.tracking.head_server import StoreServer

            self.store_server = StoreServer(config.tracking.uri, self.address, ports=ports,
                                            log_path=config.run_dir / "mlflow-server.log").start()
            worker_config.tracking.uri = self.store_server.url
        try:
            self.channel = JobChannel(config.run_dir, to_yaml(worker_config), self.address, ports)
            self.token_file = channel_token.token_file(secrets.token_hex(8))
            channel_token.write_token_file(self.token_file, self.channel.token)
        except BaseException:
            self.close()
            raise

    @property
    def worker_config(self) -> str:
        return self.channel.config_url

    @property
    def worker_env(self) -> dict[str, str]:
        """The token file's name (relative to each host's home); never the token."""
        return {channel_token.TOKEN_FILE_ENV: self.token_file}

    def discovery(self, command: str) -> str:
        """`command` wrapped so that each remote host gets the token file before it is listed."""
        return (f"{shlex.quote(sys.executable)} -m {TOKEN_HOSTS_MODULE} --token-file {shlex.quote(self.token_file)} "
                f"--discovery {shlex.quote(command)}")

    def _remove_token_files(self) -> None:
        """The token, here and on every host that holds it at the end (a closed channel's token
        opens nothing, but nothing of the job should be left behind). A host that left discovery
        before the end, or that cannot be reached, keeps its copy: waiting on a vanished host's
        ssh would hold the launcher's exit for its connect timeout."""
        listed = channel_token.home() / channel_token.installed_list(self.token_file)
        try:
            hosts = json.loads(listed.read_text())
        except (OSError, ValueError):
            hosts = []
        if hosts:
            with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(hosts))) as pool:
                list(pool.map(lambda host: channel_token.remove_from(host, self.token_file), hosts))
        listed.unlink(missing_ok=True)
        (channel_token.home() / self.token_file).unlink(missing_ok=True)

    def close(self) -> None:
        if getattr(self, "channel", None) is not None:
            self.channel.close()
        if self.token_file is not None:
            self._remove_token_files()
        if self.store_server is not None:
            self.store_server.stop()
        if self.marker is not None:
            self.marker.unlink(missing_ok=True)

    def __enter__(self) -> "HeadServices":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

