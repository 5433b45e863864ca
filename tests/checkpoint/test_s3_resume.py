"""Every host revoked: a new horovodrun on new hosts resumes from the S3 checkpoint.

The job's checkpoints go to s3://bucket/job on a moto server (real boto3, real HTTP on
127.0.0.1). The first job is killed whole (driver and every worker at once: all servers
revoked); the second one has a fresh run directory, as new servers would, and only the
bucket in common with the first.
"""
from __future__ import annotations

import os
import signal
import time

import boto3
import pytest

from conftest import Job, explain, moto_aws

pytestmark = pytest.mark.slow
BOTH = "localhost:1,127.0.0.1:1"


def saved_steps(s3, bucket: str, prefix: str) -> list[int]:
    found = s3.list_objects_v2(Bucket=bucket, Prefix=prefix + "/").get("Contents", [])
    return sorted(int(o["Key"].split("/")[1].split("-")[1]) for o in found if o["Key"].endswith("manifest.json"))


def test_job_whose_hosts_were_all_revoked_resumes_from_s3_on_new_hosts(tmp_path, monkeypatch):
    with moto_aws(tmp_path) as endpoint:
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)  # inherited by the launcher and every worker
        s3 = boto3.session.Session().client("s3")
        s3.create_bucket(Bucket="ckpt")
        checkpoint = {"dir": "s3://ckpt/job"}
        (tmp_path / "cluster-1").mkdir()
        first = Job(tmp_path / "cluster-1", "job", train={"steps": 500}, checkpoint=checkpoint)
        proc = first.start(first.discovery(f"0={BOTH}"), tmp_path / "first.log")
        try:
            deadline = time.monotonic() + 120
            while not [s for s in saved_steps(s3, "ckpt", "job") if s >= 150]:
                assert proc.poll() is None, (tmp_path / "first.log").read_text()[-4000:]
                assert time.monotonic() < deadline, "no checkpoint at step 150 in S3 after 120 s"
                time.sleep(0.5)
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        saved = max(saved_steps(s3, "ckpt", "job"))
        assert saved < 500

        (tmp_path / "cluster-2").mkdir()  # new servers: nothing local survives
        second = Job(tmp_path / "cluster-2", "job", train={"steps": 500}, checkpoint=checkpoint)
        done = second.run(second.discovery(f"0={BOTH}"))
        assert done.returncode == 0, explain(done)
        assert f"resumed from the durable checkpoint s3://ckpt/job/step-{saved:09d}" in done.stderr
        first_sync = second.rows("events.jsonl")[0]
        assert first_sync["step"] == saved
        assert second.summary()["steps"] == 500
        assert second.summary()["checkpoint"] == "s3://ckpt/job"
        assert max(saved_steps(s3, "ckpt", "job")) == 500
