"""`transientvod compare`: the study's table, CSV and figure from the runs in MLflow."""
from __future__ import annotations

from pathlib import Path

from transientvod.config import DEFAULT_EXPERIMENT, DEFAULT_OUTPUT_DIR


def add_parser(subparsers) -> None:
    compare = subparsers.add_parser("compare", help="compare runs recorded in MLflow: time, cost, accuracy")
    compare.add_argument("runs", nargs="*", metavar="RUN_ID", help="these runs, in this order (default: the experiment's)")
    compare.add_argument("--experiment", help=f"the MLflow experiment (default: {DEFAULT_EXPERIMENT})")
    compare.add_argument("--baseline", metavar="RUN_ID",
                         help="speed-up and savings relative to this run (default: the smallest on-demand run)")
    compare.add_argument("--out", default=str(Path(DEFAULT_OUTPUT_DIR) / "compare"),
                         help="where compare.csv and compare.png go")
    compare.add_argument("--tracking-uri", help="the MLflow store (default: $MLFLOW_TRACKING_URI, else "
                         f"sqlite:///{DEFAULT_OUTPUT_DIR}/mlflow.db)")
    compare.set_defaults(func=cmd_compare)


def cmd_compare(args) -> int:
    from transientvod.tracking.compare import run_compare
    from transientvod.tracking.store import store_uri

    return run_compare(store_uri(args.tracking_uri or ""), args.experiment, args.runs, args.baseline, args.out)
