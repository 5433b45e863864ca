"""The environment horovodrun starts with: a tracking URI with a password stays in the launcher
(it would stand on every worker's ssh command line), one without is passed on."""
from __future__ import annotations

import logging

from transientvod.head.worker_env import worker_environment


def test_a_tracking_uri_with_a_password_stays_in_the_launcher(caplog):
    caplog.set_level(logging.WARNING, logger="transientvod.head.worker_env")
    env = worker_environment({"PATH": "/usr/bin", "MLFLOW_TRACKING_URI": "http://alice:s3cret@mlflow.internal:5000"})
    assert env == {"PATH": "/usr/bin"}
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "MLFLOW_TRACKING_URI (it has a password)" in warnings[0]
    assert "s3cret" not in warnings[0]


def test_a_tracking_uri_without_a_password_is_passed_on(caplog):
    caplog.set_level(logging.WARNING, logger="transientvod.head.worker_env")
    for uri in ("http://mlflow.internal:5000", "sqlite:////srv/runs/mlflow.db", "http://alice@mlflow.internal:5000"):
        assert worker_environment({"MLFLOW_TRACKING_URI": uri}) == {"MLFLOW_TRACKING_URI": uri}
    assert caplog.records == []


def test_openmp_settings_reach_the_workers():
    # How idle OpenMP threads wait decides how much CPU a worker burns between its parallel
    # regions (benchmarks/exchange.py); a user's setting must reach the workers, not stop here.
    openmp = {"OMP_NUM_THREADS": "4", "OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": "1000", "KMP_BLOCKTIME": "0",
              "MKL_NUM_THREADS": "4"}
    assert worker_environment({**openmp, "EDITOR": "vi"}) == openmp


def test_cloud_storage_settings_reach_the_workers_and_the_key_file_does_not(caplog):
    # A gs:// checkpoint.dir is written by rank 0 wherever it runs: the project and an
    # emulator's address are settings; a key file stays with the launcher.
    caplog.set_level(logging.WARNING, logger="transientvod.head.worker_env")
    settings = {"GOOGLE_CLOUD_PROJECT": "tvd-study", "STORAGE_EMULATOR_HOST": "http://127.0.0.1:9023"}
    assert worker_environment({**settings, "GOOGLE_APPLICATION_CREDENTIALS": "/home/u/key.json"}) == settings
    assert "GOOGLE_APPLICATION_CREDENTIALS" in caplog.records[0].getMessage()
