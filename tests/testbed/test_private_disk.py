"""Jobs on hosts that share no disk with the head, as separate VMs don't: each testbed host has its
own run directory (`testbed up --private-disk`, a tmpfs in the host's mount namespace).

What must still hold: the workers get their config and the records reach the head (the
launcher's channel), the summary prints on the head, the MLflow run in the head's SQLite store
is complete (served to the workers by `mlflow server` on the head), a restart on other hosts
resumes from S3, and a local checkpoint.dir the hosts cannot see is refused at launch. S3 is a
moto server in the head's namespace, on the head's address: the only place every host reaches."""
from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import LOCAL_HOSTS, TINY_JOB, job_environment
from testbed_support import head_run, require_testbed, testbed_factory  # noqa: F401 (a fixture)

from transientvod.testbed import sshd
from transientvod.testbed.rehearsal import Rehearsal

pytestmark = [require_testbed(), pytest.mark.slow]

MOTO_PORT = 5600  # on the head's own address, in a namespace of the test's own


def start_s3_on_head(record, log_path: Path) -> tuple[subprocess.Popen, str]:
    head = record.layout.head
    url = f"http://{head.address}:{MOTO_PORT}"
    program = ("import sys, time; from moto.server import ThreadedMotoServer; "
               f"ThreadedMotoServer(ip_address={head.address!r}, port={MOTO_PORT}, verbose=False).start(); "
               "print('ready', flush=True); time.sleep(3600)")
    with open(log_path, "w") as log:
        proc = subprocess.Popen(sshd.exec_argv(head, [sys.executable, "-c", program]), stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 60
    while "ready" not in log_path.read_text():
        assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()
        time.sleep(0.2)
    return proc, url


def aws_environment(tmp_path: Path, endpoint: str) -> dict:
    """Fake credentials in a file every host can read (outside the private run directory):
    workers take their own credentials, never the launcher's environment."""
    credentials = tmp_path / "aws-credentials"
    credentials.write_text("[default]\naws_access_key_id = testing\naws_secret_access_key = testing\n")
    empty = tmp_path / "aws-config"
    empty.write_text("")
    env = {name: value for name, value in job_environment().items()
           if not name.startswith("AWS_") and name != "MLFLOW_TRACKING_URI"}
    return {**env, "AWS_SHARED_CREDENTIALS_FILE": str(credentials), "AWS_CONFIG_FILE": str(empty),
            "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true", "AWS_ENDPOINT_URL": endpoint}


def make_bucket(record, env: dict, bucket: str) -> None:
    program = f"import boto3; boto3.client('s3').create_bucket(Bucket={bucket!r})"
    done = subprocess.run(sshd.exec_argv(record.layout.head, [sys.executable, "-c", program]), env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def job(tmp_path: Path, record, name: str, output_dir: Path, **sections) -> Rehearsal:
    config = json.loads(json.dumps(TINY_JOB))
    for section, values in sections.items():
        config.setdefault(section, {}).update(values)
    rehearsal = Rehearsal(record, tmp_path, name, config)
    # Rehearsal puts the run under tmp_path/runs, the hosts' private directory.
    assert rehearsal.run_dir.parent == output_dir
    return rehearsal


def hosts_discovery(*hosts) -> str:
    return f"{LOCAL_HOSTS} --hosts " + ",".join(f"{h.name}:1" for h in hosts)


def on_host(record, host, command: str) -> subprocess.CompletedProcess:
    return head_run(record.name, ["ssh", host.name, command])


def test_a_job_on_private_disks_reports_to_the_head_and_resumes_from_s3_on_other_hosts(testbed_factory, tmp_path):
    runs = tmp_path / "runs"
    record = testbed_factory(4, private_disk=(runs,))
    h1, h2, h3, h4 = record.layout.hosts
    moto, endpoint = start_s3_on_head(record, tmp_path / "moto.log")
    try:
        env = aws_environment(tmp_path, endpoint)
        make_bucket(record, env, "ckpt")
        sections = dict(checkpoint={"dir": "s3://ckpt/job"}, tracking={"enabled": True},
                        cluster={"min_np": 1, "max_np": 2, "network_interface": "eth0"})
        first = job(tmp_path, record, "job", runs, train={"steps": 200}, **sections)
        first.start(hosts_discovery(h1, h2), env=env)
        assert first.wait(timeout=300) == 0, first.log()
        log = first.log_path.read_text()

        # The workers read their config from the head's channel, and wrote nothing of the run
        # on their own disks: everything is on the head.
        assert f"--config http://{record.layout.head.address}:" in log, first.log()
        for host in (h1, h2):
            assert on_host(record, host, f"test -e {first.run_dir}").returncode != 0, f"{host.name} kept run files"
        summary = first.summary()
        assert summary["steps"] == 200 and summary["checkpoint"] == "s3://ckpt/job"
        assert "  steps " in log and "  MLflow run " in log, first.log()  # printed on the head
        synced = first.synced()
        assert {e["host"] for e in synced} == {h1.name, h2.name}, synced
        assert first.last_step() == 200

        # The run in the head's SQLite store is complete: rank 0's metrics went through the
        # head's mlflow server, and the launcher closed the run.
        run_id = summary["mlflow"]["run_id"]
        with sqlite3.connect(runs / "mlflow.db") as db:
            status = db.execute("SELECT status FROM runs WHERE run_uuid = ?", (run_id,)).fetchone()[0]
            def steps(key):
                return [row[0] for row in db.execute(
                    "SELECT step FROM metrics WHERE run_uuid = ? AND key = ? ORDER BY step", (run_id, key))]
            loss_steps, accuracy_steps = steps("train_loss"), steps("test_accuracy")
        assert status == "FINISHED"
        assert loss_steps == list(range(10, 201, 10)), loss_steps  # rank 0's, every log_every steps
        assert accuracy_steps == [200], accuracy_steps

        # New servers: two other hosts, and a fresh run directory on the head too. Only the
        # bucket is common to both.
        second = job(tmp_path, record, "job2", runs, train={"steps": 300}, **sections)
        second.start(hosts_discovery(h3, h4), env=env)
        assert second.wait(timeout=300) == 0, second.log()
        assert "resumed from the durable checkpoint s3://ckpt/job/step-000000200" in second.log_path.read_text()
        assert second.summary()["steps"] == 300
        assert {e["host"] for e in second.synced()} == {h3.name, h4.name}
    finally:
        os.killpg(moto.pid, 9)
        moto.wait(timeout=30)


def test_a_local_checkpoint_dir_the_hosts_cannot_see_is_refused_at_launch(testbed_factory, tmp_path):
    runs = tmp_path / "runs"
    record = testbed_factory(2, private_disk=(runs,))
    h1, h2 = record.layout.hosts
    refused = job(tmp_path, record, "local", runs, cluster={"min_np": 2, "max_np": 2, "network_interface": "eth0"})
    refused.start(hosts_discovery(h1, h2), env=job_environment())
    assert refused.wait(timeout=120) != 0
    log = refused.log_path.read_text()
    sentence = [line for line in log.splitlines() if "checkpoint.dir" in line]
    assert sentence, refused.log()
    assert f"host {h1.name} (and 1 more) does not share" in sentence[0] and "s3://" in sentence[0], sentence
    assert "Traceback" not in log and "transientvod: starting" not in log, log  # horovodrun never started
    assert not list((refused.run_dir / "checkpoints").glob(".transientvod-shared-check-*")), "the marker stayed"
