"""--speed-from-run: one server's speed from a run logged in a real SQLite MLflow store, filled
through MlflowClient with the names the training loop uses."""
from __future__ import annotations

import subprocess

import pytest
from mlflow import MlflowClient

from conftest import REPO, TRANSIENTVOD
from transientvod.planner.run_speed import speed_from_run
from transientvod.planner.speed import calibrate_k80
from transientvod.planner.study_data import PlanError
from transientvod.tracking.names import METRIC_THROUGHPUT, METRIC_WORKERS, PARAM_BATCH_SIZE


@pytest.fixture(autouse=True)
def _no_telemetry(monkeypatch):
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    env = pytest.MonkeyPatch()
    env.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    uri = f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    experiment = client.create_experiment("transientvod")
    runs = {}
    for name, params, metrics in [
        # 2 workers of batch 32: a slow first interval, then 512 samples/s; one worker from step 300.
        ("short", {PARAM_BATCH_SIZE: "32"}, {METRIC_THROUGHPUT: [(50, 100.0), (100, 512.0), (150, 512.0),
                                                                  (200, 512.0), (350, 262.0)],
                                              METRIC_WORKERS: [(0, 2.0), (300, 1.0)]}),
        ("no-throughput", {PARAM_BATCH_SIZE: "32"}, {METRIC_WORKERS: [(0, 1.0)]}),
    ]:
        run_id = client.create_run(experiment, run_name=name).info.run_id
        for key, value in params.items():
            client.log_param(run_id, key, value)
        for key, history in metrics.items():
            for step, value in history:
                client.log_metric(run_id, key, value, step=step)
        client.set_terminated(run_id, "FINISHED")
        runs[name] = run_id
    env.undo()
    return uri, runs


@pytest.fixture(scope="module")
def shape():
    k80 = calibrate_k80()
    return k80.steps_per_second / k80.steps_per_second[1]


def test_one_servers_speed_is_the_median_per_server_rate(store, shape):
    uri, runs = store
    speed, source = speed_from_run(uri, runs["short"], shape)
    # Per point: 100/32/s2, 512/32/s2 (x3), 262/32/1; the median is 16/s2 (s2 = 2 K80s' scaling).
    assert speed == pytest.approx(512 / 32 / shape[2])
    assert runs["short"] in source and "median over 5 points" in source


def test_errors_are_one_sentence(store, shape):
    uri, runs = store
    with pytest.raises(PlanError, match="does not exist in"):
        speed_from_run(uri, "0123456789abcdef0123456789abcdef", shape)
    with pytest.raises(PlanError, match=f"logged no {METRIC_THROUGHPUT}"):
        speed_from_run(uri, runs["no-throughput"], shape)


def transientvod(*args):
    return subprocess.run(TRANSIENTVOD + list(args), capture_output=True, text=True, timeout=300, cwd=REPO)


def test_simulate_calibrated_from_a_run(store, shape):
    uri, runs = store
    done = transientvod("simulate", "--gpu", "v100", "--workers", "1", "--market", "on-demand", "--system", "study",
                        "--runs", "10", "--tracking-uri", uri, "--speed-from-run", runs["short"])
    assert done.returncode == 0, done.stderr
    row = next(line for line in done.stdout.splitlines() if line.startswith("1 x v100 on-demand"))
    assert row.split()[-2] == f"{64000 / (512 / 32 / shape[2]) / 3600:.3f}", row
    assert done.stdout.startswith("v100: ")  # says where the speed came from


@pytest.mark.parametrize("run, fragment", [("0123456789abcdef0123456789abcdef", "does not exist in"),
                                           ("no-throughput", "logged no samples_per_s")])
def test_bad_run_from_the_command_line(store, run, fragment):
    uri, runs = store
    done = transientvod("simulate", "--tracking-uri", uri, "--speed-from-run", runs.get(run, run), "--runs", "10")
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0] and "Traceback" not in done.stderr, done.stderr
