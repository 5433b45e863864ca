"""The study's headline table (configuration, time, cost, top-1 accuracy, speed-up, savings),
rebuilt from the runs recorded in MLflow.

    transientvod compare                               every run of experiment "transientvod"
    transientvod compare --experiment NAME --baseline RUN_ID --out DIR
    transientvod compare RUN_ID RUN_ID ...             exactly these runs, in this order

Prints the table, writes DIR/compare.csv and DIR/compare.png (cost against accuracy).
Only reads the store (store.readable_client): a store that does not exist is a TrackingError
and is never created; a run or experiment that does not exist is a CompareError.
"""
from __future__ import annotations

import csv
import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from transientvod.config import DEFAULT_EXPERIMENT, DEFAULT_OUTPUT_DIR, ON_DEMAND
from transientvod.tracking.names import (
    METRIC_ACCURACY,
    METRIC_COST,
    METRIC_ON_DEMAND_COST,
    METRIC_REVOCATIONS,
    METRIC_WALL_HOURS,
    PARAM_INSTANCE_TYPE,
    PARAM_MARKET,
    PARAM_MAX_WORKERS,
    PARAM_MIN_WORKERS,
    TAG_CONFIGURATION,
)
from transientvod.tracking.store import TrackingError, readable_client, reason, redacted

CSV_NAME = "compare.csv"
PNG_NAME = "compare.png"

# One marker shape per configuration; more configurations than shapes reuse them in order.
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">")


class CompareError(TrackingError):
    """An experiment, run, baseline or output path the user named cannot be used; the message
    says which. (A store that cannot be read is store.py's TrackingError.)"""


@dataclass(frozen=True)
class RunRow:
    """One run as the table shows it. None means "not recorded" (a run still going, or one that crashed)."""

    run_id: str
    run_name: str
    configuration: str
    status: str
    revocations: int
    hours: float | None
    cost_usd: float | None
    on_demand_usd: float | None
    accuracy: float | None  # 0..1
    market: str | None = None
    max_workers: int | None = None
    # Filled in by compare_rows, relative to the baseline run.
    speedup: float | None = None
    savings_pct: float | None = None
    is_baseline: bool = False


def _int_param(params: dict, name: str) -> int | None:
    try:
        return int(params[name])
    except (KeyError, ValueError):
        return None


def _configuration(tags: dict, params: dict) -> str:
    """The label the job tagged itself with; older or foreign runs get one built from params."""
    if tags.get(TAG_CONFIGURATION):
        return tags[TAG_CONFIGURATION]
    low, high = params.get(PARAM_MIN_WORKERS), params.get(PARAM_MAX_WORKERS)
    workers = high if low in (None, high) else f"{low}-{high}"
    parts = [f"{workers} x" if workers else None, params.get(PARAM_INSTANCE_TYPE), params.get(PARAM_MARKET)]
    return " ".join(p for p in parts if p) or "unknown"


def _row(run) -> RunRow:
    # run.data.metrics holds each metric's latest value (highest step), which is what the table wants.
    metrics, params, tags = run.data.metrics, run.data.params, run.data.tags
    return RunRow(
        run_id=run.info.run_id,
        run_name=run.info.run_name or run.info.run_id[:8],
        configuration=_configuration(tags, params),
        status=run.info.status,
        revocations=int(metrics.get(METRIC_REVOCATIONS, 0)),
        hours=metrics.get(METRIC_WALL_HOURS),
        cost_usd=metrics.get(METRIC_COST),
        on_demand_usd=metrics.get(METRIC_ON_DEMAND_COST),
        accuracy=metrics.get(METRIC_ACCURACY),
        market=params.get(PARAM_MARKET),
        max_workers=_int_param(params, PARAM_MAX_WORKERS),
    )


def load_runs(tracking_uri: str, experiment: str | None = None, run_ids=()) -> list[RunRow]:
    """Exactly `run_ids` in the given order if any are given (the experiment is then ignored),
    else every run of `experiment` (default "transientvod") that is not deleted, oldest first."""
    client = readable_client(tracking_uri)
    from mlflow.entities import ViewType
    from mlflow.exceptions import MlflowException

    if run_ids:
        rows = []
        for run_id in run_ids:
            try:
                rows.append(_row(client.get_run(run_id)))
            except MlflowException as e:
                if e.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
                    raise CompareError(f"run {run_id} does not exist in {redacted(tracking_uri)}; list runs with "
                                       f"`transientvod compare --experiment NAME`.") from None
                raise CompareError(f"cannot read run {run_id} from {redacted(tracking_uri)} ({reason(e)}).") from None
        return rows

    name = experiment or DEFAULT_EXPERIMENT
    found = client.get_experiment_by_name(name)
    if found is None:
        known = ", ".join(sorted(e.name for e in client.search_experiments())) or "none"
        raise CompareError(f"experiment {name!r} does not exist in {redacted(tracking_uri)}; known experiments: {known}.")
    runs, token = [], None
    while True:  # search_runs pages its answer
        page = client.search_runs([found.experiment_id], run_view_type=ViewType.ACTIVE_ONLY,
                                  order_by=["attributes.start_time ASC"], page_token=token)
        runs.extend(page)
        token = page.token
        if not token:
            break
    if not runs:
        raise CompareError(f"experiment {name!r} in {redacted(tracking_uri)} has no runs; run a job first.")
    return [_row(run) for run in runs]


# ---------------------------------------------------------------------------------------------
# Comparing


def _default_baseline(rows: list[RunRow]) -> RunRow:
    """The smallest on-demand run, as in the study (1 K80 on-demand); else the first run."""
    on_demand = [r for r in rows if r.market == ON_DEMAND]
    if not on_demand:
        return rows[0]
    # min() keeps the first of equals, so ties go to the oldest run.
    return min(on_demand, key=lambda r: r.max_workers if r.max_workers is not None else math.inf)


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def compare_rows(rows: list[RunRow], baseline_run_id: str | None = None) -> list[RunRow]:
    """The same rows with speed-up (baseline hours / hours) and savings % (100 x (1 - cost /
    baseline cost)) against the baseline run: the one named, else the default above."""
    if not rows:
        raise CompareError("there are no runs to compare.")
    if baseline_run_id is None:
        baseline = _default_baseline(rows)
    else:
        matches = [r for r in rows if r.run_id == baseline_run_id]
        if not matches:
            raise CompareError(f"baseline run {baseline_run_id} is not among the runs compared; "
                               f"name one of: {', '.join(r.run_id for r in rows)}.")
        baseline = matches[0]
    compared = []
    for row in rows:
        speedup = _ratio(baseline.hours, row.hours)
        cost_ratio = _ratio(row.cost_usd, baseline.cost_usd)
        savings = None if cost_ratio is None else 100.0 * (1.0 - cost_ratio)
        compared.append(dataclasses.replace(row, speedup=speedup, savings_pct=savings,
                                            is_baseline=row.run_id == baseline.run_id))
    return compared


def _compared(rows: list[RunRow]) -> list[RunRow]:
    """Rows ready to print: compared against the default baseline unless already compared."""
    return rows if any(r.is_baseline for r in rows) else compare_rows(rows)


def _baseline_line(rows: list[RunRow]) -> str:
    base = next(r for r in rows if r.is_baseline)
    return f"baseline: {base.run_name} ({base.run_id}), {base.configuration}"


# ---------------------------------------------------------------------------------------------
# Output

COLUMNS = ("run", "configuration", "revocations", "time (h)", "cost ($)", "top-1 (%)", "speed-up", "savings (%)")
CSV_COLUMNS = ("run", "run_id", "configuration", "status", "revocations", "time_h", "cost_usd",
               "top1_pct", "speedup", "savings_pct", "baseline")


def _fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def _percent(accuracy: float | None) -> float | None:
    return None if accuracy is None else 100.0 * accuracy


def _cells(row: RunRow) -> tuple[str, ...]:
    return (row.run_name, row.configuration, str(row.revocations), _fmt(row.hours, ".4f"),
            _fmt(row.cost_usd, ".4f"), _fmt(_percent(row.accuracy), ".2f"), _fmt(row.speedup, ".2f", "x"),
            _fmt(row.savings_pct, ".1f"))


def format_table(rows: list[RunRow]) -> str:
    rows = _compared(rows)
    table = [COLUMNS] + [_cells(r) for r in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(COLUMNS))]
    # Names and labels read left to right; numbers line up on the right.
    text_columns = 2

    def line(cells):
        return "  ".join(c.ljust(w) if i < text_columns else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    lines = [line(table[0]), "  ".join("-" * w for w in widths)] + [line(cells) for cells in table[1:]]
    return "\n".join(lines + [_baseline_line(rows)]) + "\n"


def _writable(path: Path) -> Path:
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CompareError(f"cannot create the directory for {path}: {e.strerror or e}.") from None
    return path


def write_csv(rows: list[RunRow], path) -> Path:
    """The table as numbers (full precision, empty where not recorded), one line per run."""
    rows, path = _compared(rows), _writable(path)

    def number(value):
        return "" if value is None else repr(float(value))

    try:
        with open(path, "w", newline="") as f:
            out = csv.writer(f)
            out.writerow(CSV_COLUMNS)
            for r in rows:
                out.writerow((r.run_name, r.run_id, r.configuration, r.status, r.revocations, number(r.hours),
                              number(r.cost_usd), number(_percent(r.accuracy)), number(r.speedup),
                              number(r.savings_pct), int(r.is_baseline)))
    except OSError as e:
        raise CompareError(f"cannot write {path}: {e.strerror or e}.") from None
    return path


def write_scatter(rows: list[RunRow], path) -> Path:
    """Cost against top-1 accuracy, one marker shape per configuration, each point named.
    A run with no cost or no accuracy yet has no point."""
    path = _writable(path)
    # A bare Figure with the Agg canvas: no pyplot, so no global backend or figure state is touched.
    # A fixed 700 x 500 pixels (constrained, not a tight bounding box) and no Software entry:
    # the same runs give the same PNG (docs/compare.png is one).
    figure = Figure(figsize=(7, 5), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    ax = figure.add_subplot()
    plotted = [r for r in rows if r.cost_usd is not None and r.accuracy is not None]
    configurations = list(dict.fromkeys(r.configuration for r in plotted))
    for i, configuration in enumerate(configurations):
        group = [r for r in plotted if r.configuration == configuration]
        ax.scatter([r.cost_usd for r in group], [_percent(r.accuracy) for r in group],
                   marker=MARKERS[i % len(MARKERS)], s=50, label=configuration)
        for r in group:
            ax.annotate(r.run_name, (r.cost_usd, _percent(r.accuracy)), xytext=(5, 4),
                        textcoords="offset points", fontsize=8)
    if configurations:
        ax.legend(fontsize=8, loc="best")
    else:
        ax.text(0.5, 0.5, "no run has both a cost and an accuracy yet", ha="center", transform=ax.transAxes)
    ax.margins(x=0.2, y=0.15)  # room inside the axes for the names beside the points
    ax.set_xlabel("cost ($)")
    ax.set_ylabel("top-1 accuracy (%)")
    ax.set_title("cost against accuracy, one point per run")
    ax.grid(True, alpha=0.3)
    try:
        figure.savefig(path, format="png", metadata={"Software": None})
    except OSError as e:
        raise CompareError(f"cannot write {path}: {e.strerror or e}.") from None
    return path


def run_compare(tracking_uri: str, experiment: str | None = None, run_ids=(), baseline: str | None = None,
                out_dir=Path(DEFAULT_OUTPUT_DIR) / "compare") -> int:
    """The `transientvod compare` command: table on stdout, CSV and PNG under out_dir."""
    rows = compare_rows(load_runs(tracking_uri, experiment, run_ids), baseline)
    out_dir = Path(out_dir)
    # The table first: a user whose output directory turns out unwritable has still seen it.
    print(format_table(rows), end="", flush=True)
    csv_path = write_csv(rows, out_dir / CSV_NAME)
    png_path = write_scatter(rows, out_dir / PNG_NAME)
    print(f"wrote {csv_path}")
    print(f"wrote {png_path}")
    return 0
