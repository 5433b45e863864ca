"""Replay a measured revocation trace onto local hosts: the `trace` spot provider.

The study "Speeding up Deep Learning with Transient Servers" (Li et al., ICAC 2019,
arXiv 1903.00045) trained on transient K80 clusters on GCE and recorded, for each of 32
runs per cluster size, when each VM ended and why. Those traces ship with this package
(`traces/gce-2019/`, see its PROVENANCE.md); `shipped_trace` finds them::

    runs = load_trace(shipped_trace("k80_spot_4workers_vm_trace.csv"))
    provider = TraceProvider(select_run(runs, 3), ["localhost", "127.0.0.1", "h2", "h3"],
                             start_time=time.time(), time_scale=60)

Trace format (the study's, and the one to write for your own traces): a CSV file whose
header names the columns `VM_name,Uptime,Revoked` (other columns are ignored), one line
per VM::

    VM_name,Uptime,Revoked
    myrun1-master,3600,Job completed
    myrun1-worker-0,1454.5,Revoked

- `VM_name` is `<run id>-master` or `<run id>-worker-<i>`; the lines sharing a run id are
  one run. Every run has one master and workers numbered 0, 1, 2, ... without gaps.
- `Uptime` is seconds from the cluster's start until the VM ended (0 or more).
- `Revoked` is the VM's outcome, in any letter case: `Job completed` (it lasted the whole
  run), `Revoked` (the cloud took it at Uptime), or `Manually stopped due to revoked master`.
  The study stopped every worker by hand when its master was revoked, because the master
  held the checkpoints; this system survives losing any host, so on a worker line that
  outcome means "not revoked" and on the master line it means the master was revoked.

Replay maps the VM with index k (master 0, worker-i i+1) to the k-th given host. Trace
second u happens at `start_time + u / time_scale`; a revoked VM's notice arrives
`notice_seconds` (trace seconds: 30 on GCE, 120 on EC2) before it goes.
"""
from __future__ import annotations

import csv
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from transientvod.spot.hosts import GONE, NOTICED, USABLE, HostStatus
from transientvod.spot.providers.provider import ProviderError, SpotProvider

SHIPPED_TRACES = Path(__file__).resolve().parents[1] / "traces" / "gce-2019"  # spot/traces/
COLUMNS = ("VM_name", "Uptime", "Revoked")

COMPLETED = "completed"
REVOKED = "revoked"
STOPPED = "stopped"  # manually stopped by the study's operators because the master was revoked
# The trace's words (lower case, single spaces) for each outcome.
OUTCOME_WORDS = {
    "job completed": COMPLETED,
    "revoked": REVOKED,
    "manually stopped due to revoked master": STOPPED,
}

VM_NAME = re.compile(r"^(?P<run>.+?)-(?:(?P<master>master)|worker-(?P<worker>\d+))$")


@dataclass(frozen=True)
class VmLife:
    """One VM of one measured run: how long it lived and how it ended."""

    vm: str  # the VM name in the trace
    role: str  # "master" | "worker"
    index: int  # 0 for the master, i+1 for worker-i: the order hosts are assigned in
    uptime_s: float
    outcome: str  # "completed" | "revoked" | "stopped"

    @property
    def revoked(self) -> bool:
        # A worker "stopped due to revoked master" was healthy; only the master's stop was a revocation.
        return self.outcome == REVOKED or (self.role == "master" and self.outcome == STOPPED)


@dataclass
class TraceRun:
    """One measured training run: its VMs, master first."""

    run_id: str
    vms: list[VmLife] = field(default_factory=list)

    def revoked_vms(self) -> list[VmLife]:
        return [vm for vm in self.vms if vm.revoked]


def shipped_trace(name: str) -> Path:
    """The path of a revocation trace shipped with this package, e.g.
    `shipped_trace("k80_spot_4workers_vm_trace.csv")`."""
    names = sorted(p.name for p in SHIPPED_TRACES.glob("*_vm_trace.csv"))
    if name not in names:
        raise ProviderError(f"no shipped trace is named {name!r}; the shipped traces are {', '.join(names) or 'none'}.")
    return SHIPPED_TRACES / name


def load_trace(path: str | os.PathLike) -> dict[str, TraceRun]:
    """Every run of a trace file (format in the module docstring), run id -> run, in the
    order the runs first appear in the file."""
    path = Path(path)
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            return _parse_trace(path.name, csv.reader(f))
    except FileNotFoundError:
        raise ProviderError(f"trace file {path} does not exist; give the path of a CSV trace with columns "
                            f"{','.join(COLUMNS)} or a shipped trace.") from None
    except IsADirectoryError:
        raise ProviderError(f"trace file {path} is a directory; give the path of a CSV trace file.") from None
    except UnicodeDecodeError:
        raise ProviderError(f"trace file {path} is not UTF-8 text; give a CSV trace with columns {','.join(COLUMNS)}.") from None
    except csv.Error as e:
        raise ProviderError(f"trace file {path} is not valid CSV ({e}).") from None
    except OSError as e:
        raise ProviderError(f"trace file {path} cannot be read ({e.strerror}).") from None


def _parse_trace(name: str, rows) -> dict[str, TraceRun]:
    header = next(rows, None)
    if header is None:
        raise ProviderError(f"trace {name} is empty; it needs a header line {','.join(COLUMNS)} and one line per VM.")
    header = [h.strip() for h in header]
    for column in COLUMNS:
        if column not in header:
            raise ProviderError(f"trace {name} has no column {column!r}; its header must name {', '.join(COLUMNS)}.")
    at = {column: header.index(column) for column in COLUMNS}
    width = max(at.values()) + 1

    runs: dict[str, TraceRun] = {}
    seen: set[str] = set()
    for fields in rows:
        line = rows.line_num
        if not any(f.strip() for f in fields):
            continue  # blank line
        if len(fields) < width:
            raise ProviderError(f"trace {name} line {line}: it has {len(fields)} fields, fewer than the "
                                f"header's {','.join(COLUMNS)}.")
        vm, uptime_text, outcome_text = (fields[at[c]].strip() for c in COLUMNS)

        match = VM_NAME.match(vm)
        if match is None:
            raise ProviderError(f"trace {name} line {line}: VM_name {vm!r} does not end in -master or "
                                "-worker-<number>.")
        if vm in seen:
            raise ProviderError(f"trace {name} line {line}: VM {vm!r} appears a second time.")
        seen.add(vm)

        try:
            uptime = float(uptime_text)
        except ValueError:
            uptime = math.nan
        if not math.isfinite(uptime):
            raise ProviderError(f"trace {name} line {line}: Uptime {uptime_text!r} is not a number of seconds.")
        if uptime < 0:
            raise ProviderError(f"trace {name} line {line}: Uptime {uptime_text} is negative; it counts "
                                "seconds from the cluster's start.")

        outcome = OUTCOME_WORDS.get(" ".join(outcome_text.lower().split()))
        if outcome is None:
            raise ProviderError(f"trace {name} line {line}: Revoked {outcome_text!r} is not one of "
                                "'Job completed', 'Revoked', 'Manually stopped due to revoked master'.")

        if match["master"]:
            role, index = "master", 0
        else:
            role, index = "worker", int(match["worker"]) + 1
        run_id = match["run"]
        runs.setdefault(run_id, TraceRun(run_id)).vms.append(
            VmLife(vm=vm, role=role, index=index, uptime_s=uptime, outcome=outcome))

    if not runs:
        raise ProviderError(f"trace {name} has a header but no VM lines.")
    for run in runs.values():
        run.vms.sort(key=lambda v: v.index)
        # Index k goes to the k-th host, so a missing master or worker would leave a host idle.
        if run.vms[0].role != "master":
            raise ProviderError(f"trace {name}: run {run.run_id!r} has no {run.run_id}-master line.")
        for expected, vm in enumerate(run.vms):
            if vm.index != expected:
                raise ProviderError(f"trace {name}: run {run.run_id!r} has no {run.run_id}-worker-{expected - 1} "
                                    "line; number the workers 0, 1, 2, ... without gaps.")
    return runs


def select_run(runs: dict[str, TraceRun], run: str | int) -> TraceRun:
    """The N-th run (1-based, file order) for an int or a digit string, else the run with that id."""
    ids = list(runs)
    if isinstance(run, int) or (isinstance(run, str) and run.strip().isdigit()):
        number = int(run)
        if 1 <= number <= len(ids):
            return runs[ids[number - 1]]
        raise ProviderError(f"run number {number} is out of range; this trace has {len(ids)} runs, "
                            f"numbered 1 to {len(ids)}.")
    if run in runs:
        return runs[run]
    raise ProviderError(f"run {run!r} is not in this trace; give a number 1 to {len(ids)} or one of its run ids, "
                        f"such as {', '.join(ids[:3])}.")


@dataclass(frozen=True)
class Revocation:
    """When a replayed host gets its notice and when it goes, in unix time."""

    host: str
    instance_id: str  # the VM name in the trace
    notice_at: float
    revoke_at: float


class TraceProvider(SpotProvider):
    """One measured run replayed on real hosts: VM k's fate happens to hosts[k].

    `notices=False` replays a hard kill: the host stays usable until it is gone, as when a
    job misses the notice. Hosts beyond the run's VMs are not part of the replay.
    """

    name = "trace"

    def __init__(self, run: TraceRun, hosts: list[str], start_time: float, time_scale: float = 1.0,
                 notice_seconds: float = 30.0, slots: int = 1, notices: bool = True):
        if not (time_scale > 0 and math.isfinite(time_scale)):
            raise ValueError(f"time_scale is {time_scale}; it must be a positive number (60 replays a trace minute in a second).")
        if not notice_seconds >= 0:
            raise ValueError(f"notice_seconds is {notice_seconds}; it must be 0 or more (30 on GCE, 120 on EC2).")
        if slots < 1:
            raise ValueError(f"slots is {slots}; each host needs at least 1 slot.")
        hosts = list(hosts)
        if len(hosts) < len(run.vms):
            raise ProviderError(f"trace run {run.run_id} has {len(run.vms)} VMs (a master and {len(run.vms) - 1} "
                                f"workers) and needs {len(run.vms)} hosts, but got {len(hosts)}.")
        used = hosts[:len(run.vms)]
        if len(set(used)) < len(used):
            raise ProviderError(f"hosts {', '.join(used)} repeat a name; each VM of run {run.run_id} needs its own host.")
        self.run = run
        self.hosts = used
        self.start_time = float(start_time)
        self.time_scale = float(time_scale)
        self.notice_seconds = float(notice_seconds)
        self.slots = slots
        self.notices = notices
        self._revocations = {}
        for vm in run.revoked_vms():
            revoke_at = self.start_time + vm.uptime_s / self.time_scale
            notice_at = max(self.start_time, revoke_at - self.notice_seconds / self.time_scale)
            self._revocations[vm.index] = Revocation(host=self.hosts[vm.index], instance_id=vm.vm,
                                                     notice_at=notice_at, revoke_at=revoke_at)

    def revocations(self) -> list[Revocation]:
        return sorted(self._revocations.values(), key=lambda r: (r.revoke_at, r.host))

    def poll(self, now: float) -> list[HostStatus]:
        statuses = []
        for vm in self.run.vms:
            host = self.hosts[vm.index]
            revocation = self._revocations.get(vm.index)
            state, notice_at, terminate_at = USABLE, None, None
            if revocation is not None:
                if now >= revocation.revoke_at:
                    state, terminate_at = GONE, revocation.revoke_at
                    notice_at = revocation.notice_at if self.notices else None
                elif self.notices and now >= revocation.notice_at:
                    state, notice_at, terminate_at = NOTICED, revocation.notice_at, revocation.revoke_at
            statuses.append(HostStatus(name=host, slots=self.slots, state=state, instance_id=vm.vm,
                                       notice_at=notice_at, terminate_at=terminate_at))
        return statuses
