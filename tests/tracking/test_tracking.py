"""tracking/run.py and sender.py against real stores: a SQLite file, and a real `mlflow server` on
127.0.0.1 that the tests stop and start again while metrics are being logged."""
from __future__ import annotations

import json
import logging
import subprocess

import pytest
from mlflow import MlflowClient

import transientvod
from conftest import REPO, free_port, mlflow_browser, new_mlflow_store, wait_until
from transientvod.tracking import names
from transientvod.tracking.run import close_run, open_run, tracking_uri
from transientvod.tracking.sender import UNSENT_FILE, MetricSender, resend_unsent
from transientvod.tracking.store import TrackingError, check_writable
from transientvod.config import load_config


def unreachable_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and "does not answer" in r.getMessage()]


def test_metrics_wait_while_the_server_is_down_and_go_out_when_it_returns(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="transientvod.tracking.sender")
    serve_mlflow = mlflow_browser().serve_mlflow
    store, port = new_mlflow_store(tmp_path), free_port()
    with serve_mlflow(store, port) as base:
        client = MlflowClient(base)
        run_id = client.create_run(client.create_experiment("sender")).info.run_id
        sender = MetricSender(base, run_id, tmp_path / "unsent.jsonl", retry_seconds=0.3)
        for step in range(1, 6):
            sender.log({names.METRIC_LOSS: 1.0 / step}, step)
        wait_until(lambda: sender.pending() == 0, 30, "the first metrics to be sent")

    # The server is gone: logging still returns at once and keeps everything, with one warning.
    for step in range(6, 11):
        sender.log({names.METRIC_LOSS: 1.0 / step}, step)
    wait_until(lambda: unreachable_warnings(caplog), 30, "the sender to notice the server is gone")
    assert sender.pending() == 5

    with serve_mlflow(store, port) as base:
        wait_until(lambda: sender.pending() == 0, 60, "the buffered metrics to be sent")
        history = MlflowClient(base).get_metric_history(run_id, names.METRIC_LOSS)
    assert sorted((m.step, m.value) for m in history) == [(s, 1.0 / s) for s in range(1, 11)]
    assert len(unreachable_warnings(caplog)) == 1, "one warning per outage, not one per retry"
    assert sender.close(timeout=5) == 0
    assert not (tmp_path / "unsent.jsonl").exists()


def test_metrics_unsent_at_the_end_are_written_locally_and_sent_later(tmp_path):
    serve_mlflow = mlflow_browser().serve_mlflow
    store, port = new_mlflow_store(tmp_path), free_port()
    with serve_mlflow(store, port) as base:
        client = MlflowClient(base)
        run_id = client.create_run(client.create_experiment("late")).info.run_id
    unsent = tmp_path / UNSENT_FILE
    sender = MetricSender(f"http://127.0.0.1:{port}", run_id, unsent, retry_seconds=0.3)
    for step in (10, 20, 30):
        sender.log({names.METRIC_COST: step / 1000}, step)
    assert sender.close(timeout=2) == 3
    rows = [json.loads(line) for line in unsent.read_text().splitlines()]
    assert [(r["key"], r["step"], r["value"]) for r in rows] == [(names.METRIC_COST, s, s / 1000) for s in (10, 20, 30)]

    with serve_mlflow(store, port) as base:
        client = MlflowClient(base)
        assert resend_unsent(client, run_id, unsent) == 3
        history = client.get_metric_history(run_id, names.METRIC_COST)
    assert sorted((m.step, m.value) for m in history) == [(s, s / 1000) for s in (10, 20, 30)]
    assert not unsent.exists()


def test_a_run_opened_and_closed_in_a_sqlite_store(tmp_path):
    config = load_config(None, [f"run.output_dir={tmp_path / 'runs'}", "run.name=unit", "cost.market=on-demand"])
    run_id = open_run(config)
    uri = tracking_uri(config)
    assert uri == f"sqlite:///{(tmp_path / 'runs' / 'mlflow.db').resolve()}"
    assert config.tracking.run_id == run_id and config.tracking.uri == uri

    sender = MetricSender(uri, run_id, tmp_path / "unsent.jsonl")
    for step, accuracy, cost in ((100, 0.5, 0.01), (200, 0.8, 0.02)):
        sender.log({names.METRIC_ACCURACY: accuracy, names.METRIC_COST: cost,
                    names.METRIC_ON_DEMAND_COST: cost * 2}, step)
    assert sender.close() == 0
    summary = {"steps": 200, "test_accuracy": 0.8, "wall_seconds": 720.0,
               "cost": {"cost_usd": 0.02, "on_demand_usd": 0.04, "savings_pct": 50.0}}
    close_run(config, summary, succeeded=True)

    client = MlflowClient(uri)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params[names.PARAM_MARKET] == "on-demand"
    assert run.data.tags[names.TAG_CONFIGURATION] == "1-2 x k80 on-demand"
    # The package runs from this checkout (an editable install): its commit, and the version.
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
    assert run.data.tags[names.TAG_GIT_COMMIT] == head.stdout.strip()
    assert run.data.tags[names.TAG_VERSION] == transientvod.__version__
    metrics = run.data.metrics
    assert metrics[names.METRIC_WALL_HOURS] == pytest.approx(0.2)
    assert metrics[names.METRIC_SAVINGS_PCT] == pytest.approx(50.0)
    assert metrics[names.METRIC_USD_PER_POINT] == pytest.approx(0.02 / 80)
    artifacts = {a.path for a in client.list_artifacts(run_id)}
    assert artifacts == {names.ARTIFACT_CONFIG, names.ARTIFACT_SUMMARY, names.ARTIFACT_FIGURE}
    # Artifacts live next to the database, not in ./mlruns of wherever the job started.
    assert run.info.artifact_uri.startswith((tmp_path / "runs" / "mlartifacts").resolve().as_uri())


def test_unwritable_store_directory_is_one_sentence(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(TrackingError, match="is not writable") as caught:
        check_writable(f"sqlite:///{blocker}/sub/mlflow.db")
    assert str(blocker) in str(caught.value) and "\n" not in str(caught.value)
