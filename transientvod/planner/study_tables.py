"""The study's published tables, read from the data README that ships with its files.

    rows = published_rows()          # {"1 P100 transient": Published(1.50, 0.83, 6.66), ...}
    overheads = published_overheads()  # {(2, 1): (61.7, 14.8), (4, 2): (48.0, 9.6), ...}

The P100 and V100 speeds come from here (the study timed them in single-server runs and
published only the table); tests compare the planner with the same rows. The README's
tables are Markdown (`| configuration | time h | cost $ | top-1 % |`); "2 / 4 / 8 K80
on-demand" rows are split into one row per size. Never imports torch or horovod.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from transientvod.planner.study_data import PlanError
from transientvod.spot.providers.trace import SHIPPED_TRACES

README = "README.md"
_NUMBER = r"(\d+(?:\.\d+)?)"


@dataclass(frozen=True)
class Published:
    time_h: float | None  # None where the study printed "—"
    cost_usd: float | None
    failed_pct: float | None  # "(6.66 % of runs failed)" in the accuracy column


def _readme(path) -> tuple[Path, str]:
    path = Path(path) if path is not None else SHIPPED_TRACES / README
    try:
        return path, path.read_text(encoding="utf-8")
    except OSError as e:
        raise PlanError(f"the study's data README {path} cannot be read ({e.strerror}).") from None


def _value(cell: str) -> float | None:
    cell = cell.strip()
    return None if cell in ("—", "-", "") else float(cell)


def published_rows(path: str | os.PathLike | None = None) -> dict[str, Published]:
    """Every row of the README's `| configuration | time h | cost $ | top-1 % |` tables."""
    path, text = _readme(path)
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) != 4 or cells[0] in ("configuration", "---") \
                or not re.fullmatch(r"[\d.—/ -]+", cells[1] + cells[2]):
            continue
        failed = re.search(_NUMBER + r" % of runs failed", cells[3])
        failed_pct = float(failed.group(1)) if failed else None
        sizes = re.fullmatch(r"([\d /]+) (K80 .+)", cells[0])
        if sizes and "/" in sizes.group(1):  # "2 / 4 / 8 K80 on-demand | — | 3.16 / 3.02 / 3.01"
            ns = sizes.group(1).split("/")
            times = cells[1].split("/") if "/" in cells[1] else [cells[1]] * len(ns)
            costs = cells[2].split("/")
            if len(costs) != len(ns) or len(times) != len(ns):
                raise PlanError(f"{path}: the row {cells[0]!r} lists {len(ns)} sizes but not as many values.")
            for n, t, c in zip(ns, times, costs):
                rows[f"{n.strip()} {sizes.group(2)}"] = Published(_value(t), _value(c), failed_pct)
        else:
            rows[cells[0]] = Published(_value(cells[1]), _value(cells[2]), failed_pct)
    if not rows:
        raise PlanError(f"the study's data README {path} has no table of configuration, time h, cost $ and top-1 %.")
    return rows


def published_overheads(path: str | os.PathLike | None = None) -> dict[tuple[int, int], tuple[float, float]]:
    """(cluster size, revocations) -> (time %, cost %) overhead against the same cluster with none,
    from the README's sentence "one revocation (r = 1): 2 K80 61.7 % / 14.8 %, ...; two (r = 2): ..."."""
    path, text = _readme(path)
    text = " ".join(text.split())
    overheads = {}
    for r, clause in re.findall(r"\(r = (\d)\):(.*?)(?=\(r = \d\)|\. |$)", text):
        for n, time_pct, cost_pct in re.findall(r"(\d+) K80 " + _NUMBER + " % / " + _NUMBER + " %", clause):
            overheads[(int(n), int(r))] = (float(time_pct), float(cost_pct))
    if not overheads:
        raise PlanError(f"the study's data README {path} states no revocation overheads '(r = 1): 2 K80 61.7 % / "
                        "14.8 %'.")
    return overheads


def published_dynamic_cluster(path: str | os.PathLike | None = None) -> tuple[float, float]:
    """(% faster, % cheaper) of the study's dynamic cluster (one K80 added every 16K steps)
    against staying on one K80: "finished 40.8% faster and 21.5% cheaper"."""
    path, text = _readme(path)
    found = re.search(_NUMBER + r" ?% faster and " + _NUMBER + r" ?% cheaper", " ".join(text.split()))
    if not found:
        raise PlanError(f"the study's data README {path} states no dynamic-cluster result '40.8% faster and 21.5% "
                        "cheaper'.")
    return float(found.group(1)), float(found.group(2))
