"""Every host revoked: a new horovodrun on new hosts resumes from the gs:// checkpoint.

The job's checkpoints go to gs://ckpt/job on gcp-storage-emulator (real google-cloud-storage,
real HTTP on 127.0.0.1, the server in this process); the launcher and every worker find it
through STORAGE_EMULATOR_HOST. The first job is killed whole (driver and every worker at
once: all servers revoked); the second one has a fresh run directory, as new servers would,
and only the bucket in common with the first.
"""
from __future__ import annotations

import os
import signal
import time

import pytest

from conftest import Job, explain

pytestmark = pytest.mark.slow
BOTH = "localhost:1,127.0.0.1:1"


def saved_steps(bucket, prefix: str) -> list[int]:
    return sorted(int(blob.name.split("/")[1].split("-")[1]) for blob in bucket.client.list_blobs(
        bucket.name, prefix=prefix + "/") if blob.name.endswith("manifest.json"))


def test_job_whose_hosts_were_all_revoked_resumes_from_gs_on_new_hosts(tmp_path, monkeypatch):
    from gcp_storage_emulator.server import create_server
    from google.cloud import storage

    server = create_server("127.0.0.1", 0, in_memory=True, default_bucket="ckpt")
    server.start()
    try:
        # Inherited by the launcher and, through its allow-list, by every worker.
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{server._api._httpd.server_address[1]}")
        monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "tvd-test")
        bucket = storage.Client().bucket("ckpt")
        checkpoint = {"dir": "gs://ckpt/job"}
        (tmp_path / "cluster-1").mkdir()
        first = Job(tmp_path / "cluster-1", "job", train={"steps": 500}, checkpoint=checkpoint)
        proc = first.start(first.discovery(f"0={BOTH}"), tmp_path / "first.log")
        try:
            deadline = time.monotonic() + 120
            while not [s for s in saved_steps(bucket, "job") if s >= 150]:
                assert proc.poll() is None, (tmp_path / "first.log").read_text()[-4000:]
                assert time.monotonic() < deadline, "no checkpoint at step 150 in the bucket after 120 s"
                time.sleep(0.5)
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        saved = max(saved_steps(bucket, "job"))
        assert saved < 500

        (tmp_path / "cluster-2").mkdir()  # new servers: nothing local survives
        second = Job(tmp_path / "cluster-2", "job", train={"steps": 500}, checkpoint=checkpoint)
        done = second.run(second.discovery(f"0={BOTH}"))
        assert done.returncode == 0, explain(done)
        assert f"resumed from the durable checkpoint gs://ckpt/job/step-{saved:09d}" in done.stderr
        assert second.rows("events.jsonl")[0]["step"] == saved
        assert second.summary()["steps"] == 500
        assert second.summary()["checkpoint"] == "gs://ckpt/job"
        assert max(saved_steps(bucket, "job")) == 500
    finally:
        server.stop()
