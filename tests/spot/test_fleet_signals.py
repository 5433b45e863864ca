"""`transientvod fleet` as a real process against a moto server on 127.0.0.1: whatever ends it
(Ctrl-C, `kill`, systemd's SIGTERM, a closing SSH session's SIGHUP, an error) ends every
instance of the job. Python's default SIGTERM and SIGHUP would skip the fleet's `finally`."""
from __future__ import annotations

import signal
import subprocess
import time

import pytest

from conftest import REPO, TRANSIENTVOD, default_sighup, reset_moto

JOB = "signal-job"
ALIVE = ("pending", "running")


@pytest.fixture
def ec2(ec2_moto, monkeypatch):
    url, ami, session = ec2_moto
    monkeypatch.delenv("TRANSIENTVOD_FLEET_HORIZON_HOURS", raising=False)
    reset_moto(url)
    return url, ami, session.client("ec2", endpoint_url=url)


def job_instances(client, states) -> list[str]:
    filters = [{"Name": "tag:transientvod:job", "Values": [JOB]},
               {"Name": "instance-state-name", "Values": list(states)}]
    return [i["InstanceId"] for r in client.describe_instances(Filters=filters)["Reservations"] for i in r["Instances"]]


def wait_for(condition, timeout: float, what: str, proc: subprocess.Popen):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        answer = condition()
        if answer:
            return answer
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"the fleet exited with {proc.returncode} before {what}\n{out}\n{err}")
        time.sleep(0.1)
    pytest.fail(f"no {what} within {timeout:g} s")


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_a_signal_to_the_fleet_ends_every_instance_of_the_job(ec2, signum):
    url, ami, client = ec2
    argv = TRANSIENTVOD + ["fleet", "--job-tag", JOB, "--instance-types", "g4dn.xlarge", "--price", "g4dn.xlarge=0.5",
                           "--target", "2", "--image-id", ami, "--budget", "50", "--endpoint-url", url,
                           "--poll-seconds", "0.5"]
    # Its own session: the signal reaches the fleet alone, as `kill PID` sends it.
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                            start_new_session=True, preexec_fn=default_sighup)
    try:
        # The instances are launched inside Fleet.run, where the fleet's handlers are in place.
        launched = wait_for(lambda: len(job_instances(client, ALIVE)) == 2 and job_instances(client, ALIVE), 60,
                            "two instances of the job", proc)
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 128 + signum, err
    assert job_instances(client, ALIVE) == [], err
    assert sorted(job_instances(client, ("shutting-down", "terminated"))) == sorted(launched)
    assert (f"transientvod fleet: {signum.name} ended the fleet; every instance of job {JOB} is terminating; "
            "spent $") in out, out
    assert "Traceback" not in err, err
