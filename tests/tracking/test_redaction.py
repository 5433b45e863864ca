"""A tracking URI with a password in it (http://user:PASSWORD@host, postgresql://user:PASSWORD@host/db)
shows redacted wherever transientvod prints or logs it: the launcher's and the sender's log lines,
the one-sentence errors, the resolved config logged to MLflow as an artifact, and the summary.
The stores are real: a `mlflow server` on 127.0.0.1 (which takes, and ignores, basic auth), and
a port where nothing listens."""
from __future__ import annotations

import logging

import pytest
from mlflow import MlflowClient

from conftest import explain, free_port, mlflow_browser, new_mlflow_store, wait_until
from transientvod.config import load_config
from transientvod.tracking import names
from transientvod.tracking.compare import load_runs
from transientvod.tracking.run import close_run, open_run
from transientvod.tracking.sender import MetricSender
from transientvod.tracking.store import TrackingError, redacted

PASSWORD = "s3cr:et-Pa55"


@pytest.mark.parametrize("text, shown", [
    (f"http://alice:{PASSWORD}@mlflow.example:5000", "http://alice:***@mlflow.example:5000"),
    (f"postgresql+psycopg2://bob:{PASSWORD}@db.internal/mlflow", "postgresql+psycopg2://bob:***@db.internal/mlflow"),
    (f"https://:{PASSWORD}@h/x and http://u:p@k.", "https://:***@h/x and http://u:***@k."),
    # Nothing to hide: no password, or a port and a path that merely hold ':' and '@'.
    ("http://alice@mlflow.example:5000", "http://alice@mlflow.example:5000"),
    ("http://mlflow.example:5000/a@b", "http://mlflow.example:5000/a@b"),
    ("sqlite:////srv/runs/mlflow.db?timeout=5", "sqlite:////srv/runs/mlflow.db?timeout=5"),
    ("no URL at all: user:pw@host", "no URL at all: user:pw@host"),
])
def test_redacted_hides_the_password_of_every_url_and_nothing_else(text, shown):
    assert redacted(text) == shown


def test_a_run_on_a_server_with_a_password_logs_and_stores_it_redacted(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    store, port = new_mlflow_store(tmp_path), free_port()
    with mlflow_browser().serve_mlflow(store, port) as base:
        uri = base.replace("http://", f"http://alice:{PASSWORD}@")
        config = load_config(None, [f"run.output_dir={tmp_path / 'runs'}", "run.name=secret",
                                    f"tracking.uri={uri}"])
        run_id = open_run(config)  # through the URI with its password: the server answers
        close_run(config, {"steps": 1, "test_accuracy": 0.5, "wall_seconds": 1.0}, succeeded=True)
        client = MlflowClient(base)
        assert client.get_run(run_id).info.status == "FINISHED"
        logged_config = client.download_artifacts(run_id, names.ARTIFACT_CONFIG, str(tmp_path / "artifacts"))
        config_text = open(logged_config).read()

    assert f"uri: http://alice:***@127.0.0.1:{port}" in config_text and PASSWORD not in config_text
    lines = [record.getMessage() for record in caplog.records]
    assert any(f"at http://alice:***@127.0.0.1:{port}" in line for line in lines), lines
    assert not any(PASSWORD in line for line in lines), lines
    # The workers still get the URI they can log in with, in the resolved config on disk.
    assert config.tracking.uri == uri


@pytest.mark.slow
def test_a_job_logging_to_a_server_with_a_password_never_shows_it(job, tmp_path, monkeypatch):
    store, port = new_mlflow_store(tmp_path), free_port()
    with mlflow_browser().serve_mlflow(store, port) as base:
        uri = base.replace("http://", f"http://alice:{PASSWORD}@")
        # In the launcher's environment: horovodrun does not get it (it would put it on ssh
        # command lines); the workers log through the resolved config's tracking.uri instead.
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
        j = job("secret", tracking={"enabled": True}, train={"steps": 60}, cluster={"min_np": 1, "max_np": 1, "network_interface": "lo"})
        done = j.run(j.discovery("0=localhost:1"))
        assert done.returncode == 0, explain(done)
        summary = j.summary()
        client = MlflowClient(base)
        run = client.get_run(summary["mlflow"]["run_id"])
        artifacts = tmp_path / "artifacts"
        texts = [open(client.download_artifacts(run.info.run_id, name, str(artifacts))).read()
                 for name in (names.ARTIFACT_CONFIG, names.ARTIFACT_SUMMARY)]
        losses = client.get_metric_history(run.info.run_id, names.METRIC_LOSS)

    # The job logged through the password (rank 0's metrics arrived), and showed it nowhere.
    assert run.info.status == "FINISHED" and run.data.metrics[names.METRIC_ACCURACY] == summary["test_accuracy"]
    assert summary["mlflow"]["tracking_uri"] == f"http://alice:***@127.0.0.1:{port}"
    assert f"in http://alice:***@127.0.0.1:{port}" in done.stdout  # the printed summary
    assert "MLFLOW_TRACKING_URI (it has a password) stay in the launcher" in done.stderr
    assert len(losses) > 1  # rank 0 logged as it went
    for text in (done.stdout, done.stderr, *texts, *(str(v) for v in run.data.params.values())):
        assert PASSWORD not in text


def test_a_store_that_does_not_answer_is_named_without_its_password(tmp_path, caplog):
    uri = f"http://alice:{PASSWORD}@127.0.0.1:{free_port()}"
    with pytest.raises(TrackingError) as caught:
        load_runs(uri)
    assert f"http://alice:***@127.0.0.1:" in str(caught.value) and PASSWORD not in str(caught.value)

    caplog.set_level(logging.INFO, logger="transientvod.tracking.sender")
    sender = MetricSender(uri, "0" * 32, tmp_path / "unsent.jsonl", retry_seconds=0.2)
    sender.log({names.METRIC_LOSS: 1.0}, 1)
    wait_until(lambda: any("does not answer" in r.getMessage() for r in caplog.records), 30,
               "the sender's warning")
    assert sender.close(timeout=1) == 1  # its "left for the launcher" warning names the store too
    lines = [record.getMessage() for record in caplog.records]
    assert sum("alice:***@127.0.0.1" in line for line in lines) >= 2, lines
    assert not any(PASSWORD in line for line in lines), lines
