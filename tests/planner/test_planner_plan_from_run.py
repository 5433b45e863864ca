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

    job = Job(tmp_path_factory.mktemp("calib"), "calib", tracking={"enabled": True},
              train={"steps": 300, "log_every": 10})
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


def test_the_runs_own_revocations_replayed_as_a_trace(calibration_run):
    """One host left the ring at step 150 while the job went on: the trace says it was revoked
    then, and the other lasted to the end; simulate replays it. Which host Horovod made rank 0
    (the trace's master) varies from run to run, so it is read from the job's events."""
    from transientvod.planner.provisioning import fit_provisioning

    done = transientvod("simulate", "--workers", "2", "--system", "elastic", "--runs", "4", "--steps", str(STEPS),
                        "--speed-from-run", str(calibration_run.run_dir), "--trace", str(calibration_run.run_dir))
    assert done.returncode == 0, done.stderr
    trace = calibration_run.run_dir / "revocation-trace.csv"
    assert f"trace written to {trace}" in done.stdout and "2 servers, 1 revoked" in done.stdout
    lines = trace.read_text().splitlines()
    assert lines[0] == "VM_name,Uptime,Revoked" and len(lines) == 3
    vms = {name: (float(uptime), outcome) for name, uptime, outcome in (line.split(",") for line in lines[1:])}
    synced = sorted((e for e in calibration_run.rows("events.jsonl") if e["event"] == "synced"), key=lambda e: e["time"])
    first_ring = {e["rank"]: e["host"] for e in synced if e["size"] == 2 and e["step"] == synced[0]["step"]}
    stayed = {e["host"] for e in synced if e["size"] == 1}
    assert len(first_ring) == 2 and len(stayed) == 1
    names = {first_ring[0]: "calib-master", first_ring[1]: "calib-worker-0"}
    (left,) = set(first_ring.values()) - stayed
    revoked, completed = vms[names[left]], vms[names[stayed.pop()]]
    assert revoked[1] == "Revoked" and completed[1] == "Job completed"
    # When it left, from the metrics the job logged: after its last row at 2 workers, before the first at 1.
    rows = [r for r in calibration_run.rows("metrics.jsonl") if "world_size" in r]
    start, provisioning = synced[0]["time"], fit_provisioning().seconds(2)
    last_two = max(r["time"] for r in rows if r["world_size"] == 2)
    first_one = min(r["time"] for r in rows if r["world_size"] == 1)
    ms = 1e-3  # the trace's uptimes are written to the millisecond
    assert last_two - start + provisioning - ms <= revoked[0] <= first_one - start + provisioning + ms
    assert completed[0] >= max(r["time"] for r in rows) - start + provisioning - ms
    # Every simulated run replays it. A job that ends between the two uptimes (at the run's speeds,
    # no recovery pause) meets exactly the one revocation in every run, and survives it.
    speeds = {int(k): float(v) for k, v in re.findall(r"k=(\d+): ([\d.]+) steps/s", done.stdout)}
    before = (revoked[0] - provisioning) * speeds[2]
    steps = int(before + (completed[0] - revoked[0]) / 2 * speeds[1])
    done = transientvod("simulate", "--workers", "2", "--system", "elastic", "--runs", "20", "--steps", str(steps),
                        "--recovery-seconds", "0", "--speed-from-run", str(calibration_run.run_dir),
                        "--trace", str(calibration_run.run_dir))
    assert done.returncode == 0, done.stderr
    row = next(line for line in done.stdout.splitlines() if line.startswith("2 x k80 spot (elastic"))
    assert row.split()[5:7] == ["0.0", "1.00"], row  # fail %, revocations
