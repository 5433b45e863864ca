"""The testbed's state file: what `up` made (or was about to make), so `down` removes exactly
that and nothing else, even after an `up` that crashed half-way.

`up` writes the record before it creates anything; every later step only adds to what may
exist. The record lives with the testbed's keys and configs in `/run/transientvod/testbed-NAME/`
(a tmpfs: gone after a reboot, like the namespaces themselves).
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from transientvod.testbed import TestbedError
from transientvod.testbed.layout import Layout, Machine

RUN_ROOT = Path(os.environ.get("TRANSIENTVOD_TESTBED_DIR", "/run/transientvod"))
RECORD_FILE = "testbed.json"


def state_dir(name: str) -> Path:
    return RUN_ROOT / f"testbed-{name}"


@dataclass
class Record:
    name: str
    machines: list[dict]
    bandwidth: str
    namespaces: list[str]  # every namespace up may have made, switch included
    netns_dirs: list[str]  # /etc/netns/<namespace> directories (hosts files, the head's ssh config)
    made_privsep_dir: bool = False  # unused: records from before cluster.PRIVSEP_MADE_BY_TESTBED still load
    host_condition: dict[str, str] = field(default_factory=dict)  # host -> up | vanished | killed
    host_changed_at: dict[str, float] = field(default_factory=dict)  # host -> unix time of its last change
    complete: bool = False  # up finished
    # Directories each host has as its own empty tmpfs (up --private-disk); older records lack it.
    private_disk: list[str] = field(default_factory=list)
    congestion: str = ""  # every machine's TCP congestion control (Layout.congestion); older records lack it

    @property
    def directory(self) -> Path:
        return state_dir(self.name)

    @property
    def layout(self) -> Layout:
        return Layout(self.name, tuple(Machine(**m) for m in self.machines), self.bandwidth, self.congestion)

    def listed_hosts(self, now: float, lag_seconds: float = 0.0) -> list[str]:
        """The hosts a cloud's API would list as running, `lag_seconds` behind the truth."""
        listed = []
        for host in self.layout.hosts:
            condition = self.host_condition.get(host.name, "up")
            recent = now - self.host_changed_at.get(host.name, 0.0) < lag_seconds
            if (condition == "up") != recent:  # up, or gone so recently that the API still shows it
                listed.append(host.name)
        return listed

    def save(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / RECORD_FILE
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(asdict(self), indent=2) + "\n")
        os.replace(temporary, path)


def new_record(layout: Layout, private_disk: list[str] | None = None) -> Record:
    namespaces = [layout.switch] + [m.name for m in layout.machines]
    return Record(name=layout.name, machines=[asdict(m) for m in layout.machines], bandwidth=layout.bandwidth,
                  namespaces=namespaces, netns_dirs=[f"/etc/netns/{m.name}" for m in layout.machines],
                  host_condition={m.name: "up" for m in layout.hosts}, private_disk=list(private_disk or []),
                  congestion=layout.congestion)


def load_record(name: str) -> Record | None:
    path = state_dir(name) / RECORD_FILE
    try:
        return Record(**json.loads(path.read_text()))
    except FileNotFoundError:
        return None
    except (ValueError, TypeError) as e:
        raise TestbedError(f"the testbed record {path} is damaged ({e}); remove the namespaces listed by "
                           f"'ip netns' that start with {name}- by hand, then delete {path.parent}.") from None


def require_record(name: str) -> Record:
    record = load_record(name)
    if record is None:
        raise TestbedError(f"no testbed named {name!r} is up; start one with 'transientvod testbed up --hosts N'.")
    return record
