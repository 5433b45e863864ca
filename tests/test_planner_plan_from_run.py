"""`plan --speed-from-run runs/NAME` end to end: a real job through horovodrun trains at 2 workers
and then 1, logs to its default MLflow store, and the planner takes its speed at both sizes from
the run directory."""
from __future__ import annotations

import re
import subprocess

import numpy as np
import pytest
from mlflow import MlflowClient

from conftest import REPO, TRANSIENTVOD, explain
from transientvod.tracking import names

pytestmark = pytest.mark.slow

BOTH = "localhost:1,127.0.0.1:1"
STEPS = 2_000_000  # long enough that 3 decimals of hours resolve the speed to 0.1 %


def transientvod(*args):
    return subprocess.run(TRANSIENTVOD + list(args), capture_output=True, text=True, timeout=300, cwd=REPO)


@pytest.fixture(scope="module")
def calibration_run(tmp_path_factory):
    from conftest import Job

    job = Job(tmp_path_factory.mktemp("calib"), "calib", train={"steps": 300, "log_every": 10})
    done = job.run(job.discovery(f"0={BOTH}", "150=localhost:1"))
    assert done.returncode == 0, explain(done)
    return job


def median_steps_per_s(job, workers: int) -> float:
    """The run's samples/s over its batch at a world size, read straight from MLflow."""
    summary = job.summary()["mlflow"]
    client = MlflowClient(summary["tracking_uri"])
    run = client.get_run(summary["run_id"])
    batch = int(run.data.params[names.PARAM_BATCH_SIZE])
    sizes = sorted((m.step, m.value) for m in client.get_metric_history(summary["run_id"], names.METRIC_WORKERS))
    values = []
    for m in client.get_metric_history(summary["run_id"], names.METRIC_THROUGHPUT):
        size = [v for step, v in sizes if step <= m.step][-1]
        if size == workers:
            values.append(m.value / batch)
    assert len(values) >= 3, values
    return float(np.median(values))


def test_simulate_trains_at_the_runs_speed_for_each_size(calibration_run):
    printed = {}
    for workers in (1, 2):
        done = transientvod("simulate", "--workers", str(workers), "--market", "on-demand", "--system", "study",
                            "--parameter-servers", "0", "--runs", "10", "--steps", str(STEPS),
                            "--speed-from-run", str(calibration_run.run_dir))
        assert done.returncode == 0, done.stderr
        printed = {int(k): float(v) for k, v in re.findall(r"k=(\d+): ([\d.]+) steps/s", done.stdout)}
        row = next(line for line in done.stdout.splitlines() if line.startswith(f"{workers} x k80 on-demand"))
        speed = median_steps_per_s(calibration_run, workers)
        assert printed[workers] == pytest.approx(speed, rel=1e-3)
        assert float(row.split()[-2]) == pytest.approx(STEPS / speed / 3600, rel=2e-3), row
    assert set(printed) == {1, 2}


def test_plan_from_the_run_directory(calibration_run):
    done = transientvod("plan", "--figure", "", "--budget", "50", "--gpus", "k80", "--max-workers", "4",
                        "--runs", "200",
                        "--steps", str(STEPS), "--speed-from-run", str(calibration_run.run_dir))
    assert done.returncode == 0, done.stderr
    assert "K80 steps/s from a run" in done.stdout and " wins: the fastest" in done.stdout
    assert f"of run {calibration_run.summary()['mlflow']['run_id']}'s samples_per_s" in done.stdout
