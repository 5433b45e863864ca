"""--speed-from-run: the speed at every world size from a run logged in a real SQLite MLflow store,
filled through MlflowClient with the names the training loop uses (a real job's run is in
test_planner_plan_from_run.py)."""
from __future__ import annotations

import subprocess

import pytest
from mlflow import MlflowClient

from conftest import REPO, TRANSIENTVOD
from transientvod.planner.run_speed import MIN_POINTS, measured_model, run_in_directory, speeds_by_size
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
                                                                  (200, 512.0), (350, 262.0), (400, 262.0),
                                                                  (450, 250.0)],
                                              METRIC_WORKERS: [(0, 2.0), (300, 1.0)]}),
        # The same, but it ended soon after losing a worker: one point with one worker.
        ("ended-early", {PARAM_BATCH_SIZE: "32"}, {METRIC_THROUGHPUT: [(50, 512.0), (100, 512.0), (150, 512.0),
                                                                        (350, 262.0)],
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


def test_each_world_size_is_the_median_of_its_points(store, shape):
    uri, runs = store
    measured, source = speeds_by_size(uri, runs["short"])
    # Size 2: 100, 512, 512, 512 samples/s over batch 32, median 16; size 1: 262, 262, 250, median 262/32.
    assert measured == {1: pytest.approx(262 / 32), 2: pytest.approx(512 / 32)}
    assert f"median over 4 points of run {runs['short']}" in source and "median over 3 points" in source
    model = measured_model("v100", measured, shape, source)
    assert model.throughput(1) == pytest.approx(262 / 32) and model.throughput(2) == pytest.approx(16.0)
    # Sizes the run did not train at: the nearest measured one times K80's scaling between them.
    assert model.throughput(4) == pytest.approx(16.0 * shape[4] / shape[2])
    assert model.throughput(3) == pytest.approx(16.0 * shape[3] / shape[2])
    assert model.max_workers == shape.size - 1


def test_errors_are_one_sentence(store, shape, tmp_path):
    uri, runs = store
    with pytest.raises(PlanError, match="does not exist in"):
        speeds_by_size(uri, "0123456789abcdef0123456789abcdef")
    with pytest.raises(PlanError, match=f"logged no {METRIC_THROUGHPUT}"):
        speeds_by_size(uri, runs["no-throughput"])
    with pytest.raises(PlanError, match=f"trained too few steps with 1 workers \\(1 logged {METRIC_THROUGHPUT} "
                                        f"point, {MIN_POINTS} needed\\)"):
        speeds_by_size(uri, runs["ended-early"])
    with pytest.raises(PlanError, match="is not a transientvod run directory \\(it has no config.yaml\\)"):
        run_in_directory(tmp_path)
    (tmp_path / "config.yaml").write_text("run:\n  name: untracked\ntracking:\n  uri: ''\n")
    with pytest.raises(PlanError, match="logged no metrics to MLflow"):
        run_in_directory(tmp_path)


def test_a_run_directory_names_its_store_and_run(store, tmp_path):
    uri, runs = store
    (tmp_path / "config.yaml").write_text(f"tracking:\n  uri: {uri}\n  run_id: {runs['short']}\n")
    assert run_in_directory(tmp_path) == (uri, runs["short"])


def transientvod(*args):
    return subprocess.run(TRANSIENTVOD + list(args), capture_output=True, text=True, timeout=300, cwd=REPO)


def test_simulate_calibrated_from_a_run(store, shape):
    uri, runs = store
    done = transientvod("simulate", "--gpu", "v100", "--workers", "1", "--market", "on-demand", "--system", "study",
                        "--runs", "10", "--tracking-uri", uri, "--speed-from-run", runs["short"])
    assert done.returncode == 0, done.stderr
    row = next(line for line in done.stdout.splitlines() if line.startswith("1 x v100 on-demand"))
    assert row.split()[-2] == f"{64000 / (262 / 32) / 3600:.3f}", row
    assert done.stdout.startswith("V100 steps/s from a run")  # says where the speed came from


@pytest.mark.parametrize("run, fragment", [("0123456789abcdef0123456789abcdef", "does not exist in"),
                                           ("no-throughput", "logged no samples_per_s"),
                                           ("ended-early", "trained too few steps with 1 workers"),
                                           ("runs/no-such-run", "is not a transientvod run directory")])
def test_bad_run_from_the_command_line(store, run, fragment):
    uri, runs = store
    done = transientvod("simulate", "--tracking-uri", uri, "--speed-from-run", runs.get(run, run), "--runs", "10")
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0] and "Traceback" not in done.stderr, done.stderr


def test_a_run_directory_without_a_revocation_log(tmp_path):
    from transientvod.planner.run_trace import trace_from_run

    with pytest.raises(PlanError, match="holds no revocation log \\(events.jsonl has no synced events\\)"):
        trace_from_run(tmp_path)
    (tmp_path / "events.jsonl").write_text('{"event": "synced"\n')
    with pytest.raises(PlanError, match="events.jsonl, line 1, is not JSON"):
        trace_from_run(tmp_path)
    done = transientvod("simulate", "--runs", "10", "--trace", str(tmp_path))
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "is not JSON" in done.stderr, done.stderr
