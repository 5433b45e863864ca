"""Draws `transientvod compare`'s cost-against-accuracy figure for the cost page.

    .venv/bin/python docs/compare_figure.py            # writes docs/compare.png
    .venv/bin/python docs/compare_figure.py --backend-store-uri sqlite:///runs/mlflow.db --out runs/compare.png

With no store named, the runs are the three the cost page's table shows (the demo, and its job
on one and on two on-demand hosts: benchmarks/results/demo_runs.json). They are logged into a
fresh SQLite MLflow store in a temporary directory, as a job logs them (params, the
configuration tag, the final metrics), and the figure is drawn from that store by compare's
own code (tracking/compare.py: load_runs, compare_rows, write_scatter), so the picture is what
`transientvod compare` writes for those runs. With a store, its runs are drawn instead.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from transientvod.tracking.compare import compare_rows, load_runs, write_scatter  # noqa: E402
from transientvod.tracking.names import (  # noqa: E402
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
from transientvod.tracking.store import TrackingError  # noqa: E402

RUNS = REPO / "benchmarks" / "results" / "demo_runs.json"
OUT = REPO / "docs" / "compare.png"
WIDTH, HEIGHT = 700, 500  # write_scatter's size
EXPERIMENT = "transientvod"
START_MS = 1_700_000_000_000  # start times in table order, so compare lists the runs in that order


def recorded_runs(path=RUNS) -> list[dict]:
    """The recorded runs, one dict per row, keyed by the JSON's column names."""
    run = json.loads(Path(path).read_text())["runs"][-1]
    return [dict(zip(run["columns"], row)) for row in run["rows"]]


def fill_store(tracking_uri: str, runs: list[dict], experiment: str = EXPERIMENT) -> list[str]:
    """Log `runs` into the store as finished runs of `experiment`; their run ids."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    found = client.get_experiment_by_name(experiment)
    experiment_id = found.experiment_id if found else client.create_experiment(experiment)
    ids = []
    for i, r in enumerate(runs):
        run_id = client.create_run(experiment_id, start_time=START_MS + 1000 * i, run_name=r["run"],
                                   tags={TAG_CONFIGURATION: r["configuration"]}).info.run_id
        for key, column in ((PARAM_INSTANCE_TYPE, "instance type"), (PARAM_MARKET, "market"),
                            (PARAM_MIN_WORKERS, "min workers"), (PARAM_MAX_WORKERS, "max workers")):
            client.log_param(run_id, key, r[column])
        for key, value in ((METRIC_COST, r["cost ($)"]), (METRIC_ON_DEMAND_COST, r["on-demand cost ($)"]),
                           (METRIC_ACCURACY, r["top-1 (%)"] / 100), (METRIC_REVOCATIONS, r["revocations"]),
                           (METRIC_WALL_HOURS, r["time (h)"])):
            client.log_metric(run_id, key, value, step=0)
        client.set_terminated(run_id, "FINISHED")
        ids.append(run_id)
    return ids


def draw(out=OUT, tracking_uri: str | None = None, experiment: str = EXPERIMENT) -> Path:
    """compare's figure of the store's runs (of the recorded runs, in a fresh store, if None)."""
    if tracking_uri is not None:
        return write_scatter(compare_rows(load_runs(tracking_uri, experiment)), out)
    with tempfile.TemporaryDirectory() as tmp:
        uri = f"sqlite:///{Path(tmp) / 'mlflow.db'}"
        fill_store(uri, recorded_runs())
        return write_scatter(compare_rows(load_runs(uri, experiment)), out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend-store-uri", help="draw this store's runs (default: the recorded demo runs)")
    parser.add_argument("--experiment", default=EXPERIMENT, help="its experiment (default: %(default)s)")
    parser.add_argument("--out", default=str(OUT), help="the PNG to write (default: %(default)s)")
    args = parser.parse_args(argv)
    try:
        print(draw(args.out, args.backend_store_uri, args.experiment))
    except TrackingError as e:
        print(f"compare_figure: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
