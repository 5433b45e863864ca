"""Hosts as a provider sees them, and the host-state file that carries them to discovery.

The watcher (`transientvod watch`) asks a provider (trace replay, AWS) every few seconds
and writes the answer here; `launch/spot_hosts.py` reads it each second for Horovod. The
file is JSON, replaced atomically, so a reader never sees half of it::

    {"format": 1, "provider": "trace", "written_at": 1796009042.1,
     "hosts": [{"name": "localhost", "slots": 1, "state": "usable", "instance_id": "run3-master",
                "notice_at": null, "terminate_at": null}, ...]}
"""
from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

FORMAT = 1
USABLE = "usable"  # running, no notice: give it work
NOTICED = "noticed"  # an interruption notice arrived: take it out of discovery now
GONE = "gone"  # revoked or terminated
JOINING = "joining"  # running, but it does not take the launcher's SSH login yet (spot/reach/gate.py)
STATES = (USABLE, NOTICED, GONE, JOINING)


class HostStateError(ValueError):
    """The host-state file is missing, unreadable or not in this format; one sentence."""


@dataclass(frozen=True)
class HostStatus:
    name: str  # the host name horovodrun connects to
    slots: int
    state: str = USABLE
    instance_id: str = ""  # the provider's name for the server (EC2 instance id, trace VM name)
    notice_at: float | None = None  # unix time the interruption notice arrived
    terminate_at: float | None = None  # unix time the provider will take it (when known)

    def __post_init__(self):
        if self.state not in STATES:
            raise ValueError(f"host {self.name}: state {self.state!r} is not one of {', '.join(STATES)}.")
        if self.slots < 1:
            raise ValueError(f"host {self.name}: slots is {self.slots}; it must be at least 1.")


@dataclass
class HostState:
    provider: str
    written_at: float
    hosts: list[HostStatus] = field(default_factory=list)

    def usable(self) -> list[HostStatus]:
        return [h for h in self.hosts if h.state == USABLE]


def write_host_state(path: str | os.PathLike, state: HostState) -> None:
    """Replace the file atomically: temp file in the same directory, fsync, rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    body = json.dumps({"format": FORMAT, "provider": state.provider, "written_at": state.written_at,
                       "hosts": [asdict(h) for h in state.hosts]}, indent=1)
    fd, tmp = tempfile.mkstemp(prefix=".hosts-", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_host_state(path: str | os.PathLike) -> HostState:
    path = Path(path)
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise HostStateError(f"host-state file {path} does not exist; start the watcher (transientvod watch).") from None
    except OSError as e:
        raise HostStateError(f"host-state file {path} cannot be read ({e.strerror}).") from None
    except json.JSONDecodeError:
        raise HostStateError(f"host-state file {path} is not valid JSON; delete it and restart the watcher.") from None
    try:
        if raw.get("format") != FORMAT:
            raise HostStateError(f"host-state file {path} has format {raw.get('format')!r}, not {FORMAT}; "
                                 "restart the watcher from this version.")
        hosts = [HostStatus(**h) for h in raw["hosts"]]
        return HostState(provider=str(raw["provider"]), written_at=float(raw["written_at"]), hosts=hosts)
    except HostStateError:
        raise
    except (AttributeError, KeyError, TypeError, ValueError) as e:
        raise HostStateError(f"host-state file {path} is not a host-state file ({e}); delete it and restart the watcher.") from None


# ---------------------------------------------------------------------------------------------
# Worker registration: a replayed revocation must kill the worker processes of its host, as
# the cloud would. Each worker that watches a host-state file leaves an empty file named
# <host>@<pid> in <state file>.workers/; the replayer kills those pids when the host is revoked.

def workers_dir(state_file: str | os.PathLike) -> Path:
    path = Path(state_file)
    return path.with_name(path.name + ".workers")


def register_worker(state_file: str | os.PathLike, host: str, pid: int) -> None:
    directory = workers_dir(state_file)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{host}@{pid}").touch()


def registered_workers(state_file: str | os.PathLike, host: str) -> list[int]:
    directory = workers_dir(state_file)
    if not directory.is_dir():
        return []
    pids = []
    for entry in directory.iterdir():
        name, at, pid = entry.name.rpartition("@")
        if at and name == host and pid.isdigit():
            pids.append(int(pid))
    return sorted(pids)
