"""The GPU checks' own scripts, rehearsed on this machine's CPU so that they do not rot
between the rare sessions that are lent a GPU (tests/gpu/run_checks.sh runs them there)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.parametrize("task", ["builtin", "quickstart"])
def test_the_gpu_job_check_trains_every_step_on_the_cpu(task):
    """tests/gpu/job_check.sh cpu [task]: one local host (no second host to probe for the
    interface), staleness 2 (the built-in task at fp16, the quickstart task file at int8), MLflow
    off; the script checks the summary's steps and the checkpoints."""
    done = subprocess.run(["bash", str(REPO / "tests" / "gpu" / "job_check.sh"), "cpu", task], cwd=REPO,
                          env={**os.environ, "PYTHON": sys.executable}, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "job_check: PASSED (200 steps on cpu)" in done.stdout
    assert '"steps": 200' in done.stdout and '"world_sizes_seen": [\n    1\n  ]' in done.stdout
    expected = "transientvod.tasks.resnet" if task == "builtin" else str(REPO / "examples/quickstart/task.py")
    assert f'"task": "{expected}"' in done.stdout


def test_the_gpu_job_check_names_the_device_it_needs():
    done = subprocess.run(["bash", str(REPO / "tests" / "gpu" / "job_check.sh"), "tpu"], cwd=REPO,
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 2
    assert done.stdout.strip() == "job_check: say cuda or cpu (the device to train on)."
