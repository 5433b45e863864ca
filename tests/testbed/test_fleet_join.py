"""The fleet's join on namespaced hosts: a testbed host whose own sshd is stopped boots from the
user data `transientvod fleet --print-user-data` writes (testbed/boot.py), and `transientvod
train` on the head reaches it over SSH with the key the script authorized, or, with a key the
host does not know, says so in one sentence naming the host and the key.

What is real: the script, sshd started by it (Debian's sshd_config and PAM, the machine's host
keys), the authorized_keys it writes, ssh, horovodrun and Gloo between the hosts' addresses.
What is not a VM's: the venv is this machine's (the script finds torch, Horovod and transientvod
importable and skips the install, as on an image with the project baked in; the install from
the network is not run here), and the disk is shared except for /root, /run and /var/log."""
from __future__ import annotations

import subprocess

import pytest

from conftest import TRANSIENTVOD
from test_testbed_jobs import RehearsalJob, fixed_hosts
from testbed_support import require_testbed, testbed_factory  # noqa: F401 (a fixture)

from transientvod.testbed import TestbedError, sshd
from transientvod.testbed.boot import boot

pytestmark = [require_testbed(), pytest.mark.slow]


def user_data(tmp_path, public_key, *extra: str) -> str:
    """The script as a user gets it: from the fleet command, for this launcher (its venv, root)."""
    done = subprocess.run(TRANSIENTVOD + ["fleet", "--job-tag", "testbed", "--instance-types", "g4dn.xlarge",
                                          "--target", "1", "--image-id", "ami-12345678", "--ssh-public-key",
                                          str(public_key), "--ssh-user", "root", "--print-user-data", *extra],
                          capture_output=True, text=True, timeout=60, check=True)
    path = tmp_path / "user-data.sh"
    path.write_text(done.stdout)
    return path


def test_a_host_booted_from_the_fleets_user_data_joins_a_job(testbed_factory, tmp_path):
    record = testbed_factory(2)
    h1, h2 = record.layout.hosts
    output = boot(record.name, h2.name, user_data(tmp_path, record.directory / "id_ed25519.pub"))
    assert "transientvod-join" in output and "ready: sshd runs and takes the launcher's key for root" in output
    assert sshd.running_pid(record.directory, h2) is None  # the testbed's own sshd is gone: SSH is the script's

    job = RehearsalJob(tmp_path, record, "join", train={"steps": 60},
                       cluster={"min_np": 2, "max_np": 2, "network_interface": "eth0"})
    job.start(fixed_hosts(record))
    assert job.wait(timeout=240) == 0, job.log()
    assert job.summary()["steps"] == 60
    assert "cannot reach" not in job.log_path.read_text(), job.log()  # the preflight reached both hosts
    synced = {e["host"]: e["address"] for e in job.synced()}
    assert synced == {h1.name: h1.address, h2.name: h2.address}, job.log()


def test_a_key_the_host_does_not_know_is_one_sentence_naming_host_and_key(testbed_factory, tmp_path):
    record = testbed_factory(2)
    _, h2 = record.layout.hosts
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True, timeout=30)
    script = user_data(tmp_path, other.with_suffix(".pub"))
    done = subprocess.run(TRANSIENTVOD + ["testbed", "boot", "--name", record.name, h2.name, "--user-data",
                                          str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.endswith(f"testbed {record.name}: {h2.name} booted from {script}\n"), done.stdout

    job = RehearsalJob(tmp_path, record, "wrongkey", cluster={"min_np": 1, "max_np": 1, "network_interface": "eth0"})
    job.start(f"echo {h2.name}:1")
    assert job.wait(timeout=120) == 2, job.log()
    last = job.log_path.read_text().strip().splitlines()[-1]
    # Debian's sshd_config allows passwords too: "(publickey,password)".
    assert last.startswith(f"transientvod: the launcher reaches no worker host over SSH: {h2.name} answered "
                           f"'root@{h2.name}: Permission denied (publickey"), job.log()
    assert f".' to key {record.directory / 'id_ed25519'}; authorize that key on the workers" in last, job.log()
    assert "transientvod: starting" not in job.log_path.read_text()  # horovodrun never ran


def test_a_host_whose_install_fails_never_takes_the_key(testbed_factory, tmp_path):
    # The venv is missing and no project source is given: the script stops before the key,
    # so the launcher cannot start a worker on a host that could not run one.
    record = testbed_factory(2)
    head, (_, h2) = record.layout.head, record.layout.hosts
    script = user_data(tmp_path, record.directory / "id_ed25519.pub", "--worker-venv", str(tmp_path / "no-venv"))
    with pytest.raises(TestbedError) as error:
        boot(record.name, h2.name, script)
    assert str(error.value).startswith(f"the user data on {h2.name} exited with 1 (transientvod-join: ")
    assert str(error.value).endswith(f"FAILED: {tmp_path / 'no-venv'} lacks torch, Horovod or transientvod and no "
                                     "project source was given (--project-spec)).")
    assert not sshd.ssh_probe(head, h2, timeout=5)


def test_one_host_that_refuses_the_key_stops_the_launch_naming_it(testbed_factory, tmp_path):
    # horovodrun does not leave such a host out: with the preflight out of the way, its worker
    # failed to start and the whole job stopped (min_np 1, one good host). So the launcher refuses.
    record = testbed_factory(2)
    _, h2 = record.layout.hosts
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True, timeout=30)
    boot(record.name, h2.name, user_data(tmp_path, other.with_suffix(".pub")))

    job = RehearsalJob(tmp_path, record, "partial", cluster={"min_np": 1, "max_np": 2, "network_interface": "eth0"})
    job.start(fixed_hosts(record))
    assert job.wait(timeout=120) == 2, job.log()
    last = job.log_path.read_text().strip().splitlines()[-1]
    assert last.startswith(f"transientvod: the launcher cannot reach {h2.name} over SSH, and horovodrun would stop "
                           f"the whole job on it: {h2.name} answered 'root@{h2.name}: Permission denied (publickey"), \
        job.log()
    assert f".' to key {record.directory / 'id_ed25519'}; authorize that key on the workers" in last, job.log()
    assert "transientvod: starting" not in job.log_path.read_text()
