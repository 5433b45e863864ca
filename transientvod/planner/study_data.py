"""The study's measurements as arrays the planner can compute with.

"Speeding up Deep Learning with Transient Servers" (Li et al., ICAC 2019) published how long
transient GCE VMs lived, how its transient K80 clusters were revoked, and how fast and how
well on-demand K80 clusters trained. Those files ship with this package
(`transientvod/spot/traces/gce-2019/`, whose README.md says what every file holds); each
loader here reads one of them, or a file of the same format given as `path`::

    lifetimes = load_lifetimes("k80")          # vm_lifetimes.csv, the K80 section
    runs = trace_runs(4)                       # k80_spot_4workers_vm_trace.csv, 32 runs
    on_demand = ondemand_runs(4)               # k80_ondemand_4workers_runs.csv
    curve = ps_curve(5)                        # k80_1ps_5workers_curve.csv

A broken file raises `PlanError`: one sentence that names the file, the line and the thing
to fix. Never imports torch or horovod.
"""
from __future__ import annotations

import csv
import math
import os
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property
from pathlib import Path

import numpy as np

from transientvod.spot.providers.provider import ProviderError
from transientvod.spot.providers.trace import SHIPPED_TRACES, TraceRun, load_trace

GPU_TYPES = ("k80", "p100", "v100")

# GCE ends every preemptible VM after 24 hours. In vm_lifetimes.csv (times to the minute)
# the lifetimes fall into two groups with a gap between them: revocations, the longest
# 23.65 h (K80), 19.63 h (P100), 23.07 h (V100); and VMs ended by that limit, 24.05 h to
# 24.72 h (GCE takes a few minutes to stop them). A VM that ended before 24 h cannot have
# met the limit, so it was revoked, even at 23.6 h; one minute is taken off the limit only
# because Start and Terminate are rounded to the minute.
GCE_MAX_LIFETIME_S = 24 * 3600.0
CENSORED_AT_S = GCE_MAX_LIFETIME_S - 60.0

LIFETIMES_FILE = "vm_lifetimes.csv"
LIFETIME_COLUMNS = ("VM name", "Start", "Terminate")
LIFETIME_TIME_FORMATS = ("%m/%d/%y %H:%M", "%m/%d/%y %H:%M:%S")  # the study's M/D/YY H:MM, or with seconds

TRACE_SIZES = (2, 4, 8)
ONDEMAND_SIZES = (1, 2, 4, 8)
CURVE_SIZES = (1, 2, 3, 4, 5, 6, 7, 8)


class PlanError(ValueError):
    """The planner's input is wrong (a broken data file, an unknown GPU type, a cluster size
    the study did not measure); one sentence naming what to fix."""


# ---- revocation delays of single VMs ------------------------------------------------------------

@dataclass(frozen=True, eq=False)  # eq=False: numpy arrays have no single truth value
class Lifetimes:
    """How long each transient VM of one GPU type lived before GCE revoked it.

    `seconds[i]` is VM i's lifetime (Terminate - Start); `censored[i]` says it was not revoked
    but ended by GCE's 24 h limit, so its revocation time is only known to lie beyond it.
    The arrays are copied and made read-only.
    """

    gpu: str
    seconds: np.ndarray
    censored: np.ndarray

    def __post_init__(self):
        seconds = np.array(self.seconds, dtype=np.float64)
        censored = np.array(self.censored, dtype=bool)
        if seconds.ndim != 1 or seconds.shape != censored.shape or seconds.size == 0:
            raise PlanError(f"{self.gpu} lifetimes need one censored flag per lifetime and at least one VM; got "
                            f"{seconds.size} lifetimes and {censored.size} flags.")
        if not (np.all(np.isfinite(seconds)) and np.all(seconds >= 0)):
            raise PlanError(f"{self.gpu} lifetimes must be finite seconds, 0 or more.")
        seconds.setflags(write=False)
        censored.setflags(write=False)
        object.__setattr__(self, "seconds", seconds)
        object.__setattr__(self, "censored", censored)

    @property
    def count(self) -> int:
        return int(self.seconds.size)

    @property
    def censored_fraction(self) -> float:
        return float(np.mean(self.censored))

    def sample(self, rng: np.random.Generator, shape) -> np.ndarray:
        """Revocation delays in seconds from a VM's start, `np.inf` where the VM outlived the
        observation (censored).

        Each draw picks one measured VM uniformly. Every censored VM ended at the 24 h cap,
        later than every revoked one, so this empirical distribution is exactly the
        Kaplan-Meier estimate: below the cap it is the revoked VMs' distribution, and the
        censored mass sits beyond it (inf). GCE would stop the VM at 24 h anyway
        (GCE_MAX_LIFETIME_S); whether that counts as a revocation is the caller's call.
        """
        delays = self._sorted_delays
        return delays[rng.integers(0, delays.size, size=shape)]

    def sample_beyond(self, rng: np.random.Generator, survived_seconds) -> np.ndarray:
        """For each element of `survived_seconds`, the absolute lifetime (>= survived) of a VM
        drawn uniformly from those that lived longer than that (censored VMs count as longer);
        inf where the drawn VM is censored or no VM lived that long. The distribution of a
        VM's revocation given that it has survived so far."""
        survived = np.asarray(survived_seconds, dtype=np.float64)
        delays = self._sorted_delays
        first_longer = np.searchsorted(delays, survived, side="right")
        longer = delays.size - first_longer
        # Capped at the last index: u * n rounds below n in floats, but say so in code too.
        pick = np.minimum(first_longer + np.floor(rng.random(survived.shape) * longer).astype(np.int64),
                          delays.size - 1)
        return np.where(longer > 0, delays[pick], np.inf)

    def revoked_fraction_within(self, seconds):
        """The fraction of all VMs revoked at or before `seconds` from their start (a float,
        or an array for an array)."""
        revoked = np.sort(self.seconds[~self.censored])
        fraction = np.searchsorted(revoked, np.asarray(seconds, dtype=np.float64), side="right") / self.count
        return float(fraction) if np.ndim(fraction) == 0 else fraction

    @cached_property
    def _sorted_delays(self) -> np.ndarray:
        """Each VM's revocation delay, censored ones as inf, ascending (what searchsorted needs)."""
        return np.sort(np.where(self.censored, np.inf, self.seconds))


def load_lifetimes(gpu: str, path: str | os.PathLike | None = None) -> Lifetimes:
    """The lifetimes of one GPU type's VMs in vm_lifetimes.csv (or a file of its format).

    The file has one section per GPU type: a line `K80,,` (or `P100,,`, `V100,,`), a header
    `VM name,Start,Terminate`, then one line per VM with `M/D/YY H:MM` times. Reading stops at
    the line `Previous experiments,,`: the older 2018 runs below it are grouped by day and do
    not say which GPU type each VM had, and their times lack dates.
    """
    gpu = gpu_type(gpu)
    path = Path(path) if path is not None else SHIPPED_TRACES / LIFETIMES_FILE
    sections = _lifetime_sections(path)
    if gpu not in sections:
        known = ", ".join(g.upper() for g in sections) or "none"
        raise PlanError(f"lifetimes file {path} has no {gpu.upper()} section (a line '{gpu.upper()},,' followed by "
                        f"VM lines); its sections are {known}.")
    seconds = np.array(sections[gpu], dtype=np.float64)
    if seconds.size == 0:
        raise PlanError(f"lifetimes file {path}: the {gpu.upper()} section has no VM lines.")
    return Lifetimes(gpu=gpu, seconds=seconds, censored=seconds >= CENSORED_AT_S)


def _lifetime_sections(path: Path) -> dict[str, list[float]]:
    """GPU type -> lifetimes in seconds, for every section above 'Previous experiments'."""
    sections: dict[str, list[float]] = {}
    current = None
    at = None  # column -> index, from the latest header line
    for line, fields in _rows(path, "lifetimes"):
        first, rest = fields[0], fields[1:]
        if first.lower() == "previous experiments":
            break
        if not any(rest):
            if first.lower() not in GPU_TYPES:
                raise PlanError(f"lifetimes file {path} line {line}: {first!r} is neither a VM line with Start and "
                                f"Terminate nor a section line naming one of {', '.join(g.upper() for g in GPU_TYPES)}.")
            if first.lower() in sections:
                raise PlanError(f"lifetimes file {path} line {line}: a second {first.upper()} section; merge the two.")
            current = sections.setdefault(first.lower(), [])
            continue
        if first.lower() == LIFETIME_COLUMNS[0].lower():
            at = _column_indexes(fields, LIFETIME_COLUMNS, f"lifetimes file {path} line {line}: the header")
            continue
        if current is None:
            raise PlanError(f"lifetimes file {path} line {line}: a VM line comes before any section line such as "
                            "'K80,,'.")
        # The study's V100 section has no header line of its own: its lines keep the
        # layout of the header above, which is why `at` carries over between sections.
        if at is None:
            raise PlanError(f"lifetimes file {path} line {line}: a VM line comes before the header line "
                            f"{','.join(LIFETIME_COLUMNS)}.")
        if len(fields) <= max(at.values()):
            raise PlanError(f"lifetimes file {path} line {line}: it has {len(fields)} fields, fewer than the header "
                            f"{','.join(LIFETIME_COLUMNS)}.")
        vm = fields[at["VM name"]]
        start = _lifetime_time(fields[at["Start"]], path, line, "Start", vm)
        terminate = _lifetime_time(fields[at["Terminate"]], path, line, "Terminate", vm)
        if terminate < start:
            raise PlanError(f"lifetimes file {path} line {line}: VM {vm!r} terminates ({fields[at['Terminate']]}) "
                            f"before it starts ({fields[at['Start']]}); fix the times.")
        current.append((terminate - start).total_seconds())
    return sections


def _lifetime_time(text: str, path: Path, line: int, column: str, vm: str) -> datetime:
    for time_format in LIFETIME_TIME_FORMATS:
        try:
            return datetime.strptime(text, time_format)
        except ValueError:
            pass
    raise PlanError(f"lifetimes file {path} line {line}: {column} {text!r} of VM {vm!r} is not a time in M/D/YY H:MM "
                    "form (2/18/19 23:40).")


# ---- revocation traces of training clusters -----------------------------------------------------

def trace_runs(workers: int, path: str | os.PathLike | None = None) -> list[TraceRun]:
    """The runs of a revocation trace: k80_spot_{2,4,8}workers_vm_trace.csv (32 runs each), or
    your own trace at `path` (format: transientvod.spot.providers.trace). In the study's traces the
    master is one of the `workers` (TensorFlow's chief worker), so a run has `workers` VMs."""
    workers = _cluster_size(workers)
    if path is None:
        if workers not in TRACE_SIZES:
            raise PlanError(f"the study measured transient K80 clusters of {_sizes(TRACE_SIZES)} workers, not "
                            f"{workers}; give the path of your own trace for other sizes.")
        path = SHIPPED_TRACES / f"k80_spot_{workers}workers_vm_trace.csv"
    try:
        runs = list(load_trace(path).values())
    except ProviderError as e:
        raise PlanError(str(e)) from None
    for run in runs:
        if len(run.vms) != workers:
            raise PlanError(f"trace {Path(path).name}: run {run.run_id!r} has {len(run.vms)} VMs (master and workers), "
                            f"not the {workers} asked for.")
    return runs


# ---- on-demand runs and accuracy curves ---------------------------------------------------------

@dataclass(frozen=True, eq=False)
class OnDemandRuns:
    """Full training jobs (64K steps, one parameter server) on on-demand K80 servers."""

    workers: int
    durations_s: np.ndarray
    accuracy: np.ndarray  # top-1, 0..1
    cost_usd: np.ndarray | None  # None where the file has no Cost column (the 1-worker one)

    @property
    def mean_duration_s(self) -> float:
        return float(np.mean(self.durations_s))


def ondemand_runs(workers: int, path: str | os.PathLike | None = None) -> OnDemandRuns:
    """k80_ondemand_1worker_runs.csv or k80_ondemand_{2,4,8}workers_runs.csv (or a file with
    columns Duration, Accuracy and optionally Cost at `path`)."""
    workers = _cluster_size(workers)
    if path is None:
        if workers not in ONDEMAND_SIZES:
            raise PlanError(f"the study measured on-demand K80 clusters of {_sizes(ONDEMAND_SIZES)} workers, "
                            f"not {workers}.")
        name = "k80_ondemand_1worker_runs.csv" if workers == 1 else f"k80_ondemand_{workers}workers_runs.csv"
        path = SHIPPED_TRACES / name
    path = Path(path)
    columns = {"Duration": ("duration",), "Accuracy": ("accuracy",), "Cost": ("cost",)}
    table = _table(path, "on-demand runs", columns, optional=("Cost",))
    durations, accuracy, cost = [], [], []
    for line, row in table:
        durations.append(_number(row["Duration"], path, line, "Duration", "a positive number of seconds",
                                 lambda x: x > 0))
        accuracy.append(_number(row["Accuracy"], path, line, "Accuracy", "a fraction from 0 to 1",
                                lambda x: 0 <= x <= 1))
        if "Cost" in row:
            cost.append(_number(row["Cost"], path, line, "Cost", "dollars, 0 or more", lambda x: x >= 0))
    return OnDemandRuns(workers=workers, durations_s=np.array(durations), accuracy=np.array(accuracy),
                        cost_usd=np.array(cost) if cost else None)


@dataclass(frozen=True, eq=False)
class Curve:
    """Test accuracy against global step and wall time, one run with one parameter server."""

    workers: int
    wall_s: np.ndarray  # unix seconds
    step: np.ndarray
    accuracy: np.ndarray

    @property
    def steps_per_second(self) -> float:
        """Mean training speed between the first and the last evaluation."""
        return float((self.step[-1] - self.step[0]) / (self.wall_s[-1] - self.wall_s[0]))


def ps_curve(workers: int, path: str | os.PathLike | None = None) -> Curve:
    """k80_1ps_{2..8}workers_curve.csv (columns Wall Time,Step,Accuracy) or, for 1 worker,
    k80_1worker_accuracy_curve.csv (Wall time,Step,Value); or a file like them at `path`."""
    workers = _cluster_size(workers)
    if path is None:
        if workers not in CURVE_SIZES:
            raise PlanError(f"the study recorded accuracy curves for {_sizes(CURVE_SIZES)} K80 workers, not {workers}.")
        name = "k80_1worker_accuracy_curve.csv" if workers == 1 else f"k80_1ps_{workers}workers_curve.csv"
        path = SHIPPED_TRACES / name
    path = Path(path)
    # The 1-worker file calls the accuracy column Value and writes "Wall time" in lower case.
    columns = {"Wall Time": ("wall time",), "Step": ("step",), "Accuracy": ("accuracy", "value")}
    wall, step, accuracy = [], [], []
    for line, row in _table(path, "accuracy curve", columns):
        wall.append(_number(row["Wall Time"], path, line, "Wall Time", "unix seconds", lambda x: True))
        step.append(_number(row["Step"], path, line, "Step", "a step number, 0 or more", lambda x: x >= 0))
        accuracy.append(_number(row["Accuracy"], path, line, "Accuracy", "a fraction from 0 to 1",
                                lambda x: 0 <= x <= 1))
        if len(wall) > 1 and (wall[-1] <= wall[-2] or step[-1] < step[-2]):
            raise PlanError(f"accuracy curve {path} line {line}: Wall Time and Step must grow from line to line.")
    if len(wall) < 2:
        raise PlanError(f"accuracy curve {path} has {len(wall)} data lines; a speed needs at least 2.")
    return Curve(workers=workers, wall_s=np.array(wall), step=np.array(step), accuracy=np.array(accuracy))


# ---- reading CSV files --------------------------------------------------------------------------

def gpu_type(gpu: str) -> str:
    """`gpu` in lower case, if the study measured it."""
    name = str(gpu).strip().lower()
    if name not in GPU_TYPES:
        raise PlanError(f"GPU type {gpu!r} is unknown; the study measured {', '.join(GPU_TYPES)}.")
    return name


def _cluster_size(workers) -> int:
    if isinstance(workers, bool) or not isinstance(workers, (int, np.integer)) or workers < 1:
        raise PlanError(f"workers is {workers!r}; give a whole number of workers, 1 or more.")
    return int(workers)


def _sizes(sizes: tuple[int, ...]) -> str:
    return ", ".join(map(str, sizes[:-1])) + f" and {sizes[-1]}"


def _rows(path: Path, what: str) -> list[tuple[int, list[str]]]:
    """Every non-blank line of a CSV file as (line number, fields without surrounding spaces)."""
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            reader = csv.reader(f)
            return [(reader.line_num, [x.strip() for x in fields]) for fields in reader if any(x.strip() for x in fields)]
    except FileNotFoundError:
        raise PlanError(f"{what} file {path} does not exist.") from None
    except IsADirectoryError:
        raise PlanError(f"{what} file {path} is a directory; give the path of a CSV file.") from None
    except UnicodeDecodeError:
        raise PlanError(f"{what} file {path} is not UTF-8 text; give a CSV file.") from None
    except csv.Error as e:
        raise PlanError(f"{what} file {path} is not valid CSV ({e}).") from None
    except OSError as e:
        raise PlanError(f"{what} file {path} cannot be read ({e.strerror}).") from None


def _column_indexes(header: list[str], columns, where: str, aliases=None, optional=()) -> dict[str, int]:
    """Column -> index in `header`, matched case-insensitively against the column's aliases."""
    names = [h.lower() for h in header]
    at = {}
    for column in columns:
        for alias in (aliases or {}).get(column, (column.lower(),)):
            if alias in names:
                at[column] = names.index(alias)
                break
        else:
            if column not in optional:
                required = ",".join(c for c in columns if c not in optional)
                raise PlanError(f"{where} has no column {column!r}; it must name {required}.")
    return at


def _table(path: Path, what: str, aliases: dict[str, tuple[str, ...]], optional=()):
    """(line number, {column: text}) for every data line of a CSV file with a header line."""
    rows = _rows(path, what)
    if not rows:
        raise PlanError(f"{what} file {path} is empty; it needs a header line and one line per measurement.")
    header_line, header = rows[0]
    at = _column_indexes(header, list(aliases), f"{what} file {path} line {header_line}", aliases, optional)
    if len(rows) == 1:
        raise PlanError(f"{what} file {path} has a header but no data lines.")
    table = []
    for line, fields in rows[1:]:
        if len(fields) <= max(at.values()):
            raise PlanError(f"{what} file {path} line {line}: it has {len(fields)} fields, fewer than its header.")
        table.append((line, {column: fields[index] for column, index in at.items()}))
    return table


def _number(text: str, path: Path, line: int, column: str, should_be: str, valid) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and valid(value)):
        raise PlanError(f"{path} line {line}: {column} {text!r} is not {should_be}.")
    return value
