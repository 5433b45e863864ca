"""docs/aws-end-to-end.md, run as written: from an empty account to a finished job, and nothing
of the job left afterwards.

Every ```bash block of the page runs in order, in bash on the testbed's head, in a copy of this
checkout, except the settings block, which the test replaces with its own values (moto's image,
the testbed's key, root as the login user). The block marked "In a second terminal" (the
fleet) runs in the background, as does `transientvod train`, which the next blocks run beside,
as the page says.

What is real: the product's commands, the AWS CLI, boto3 and moto (EC2, SQS, EventBridge, IAM,
S3) on the head's address, the fleet's user data run as root on the testbed host that plays
each instance (testbed/boot.py), its watchdog, sshd and key, horovodrun and Gloo between the
hosts' addresses, S3 checkpoints. What stands in for EC2 (ec2_stand_in.py, on the head): a
testbed host for each running instance of the job, its private DNS name in every machine's
hosts file, its metadata service (imds_ec2.py, which reads its tags from moto), the
interruption (warning on the metadata service and the event on EventBridge's bus, then
TerminateInstances 20 s later), and a vanished host for every instance moto lists as ended.
The workers' AWS credentials come from a file, not an instance profile; the venv is this
machine's, so the user data skips its install (the page says both)."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO
from test_private_disk import aws_environment, start_s3_on_head
from testbed_support import require_testbed, testbed_factory  # noqa: F401 (a fixture)

from transientvod.spot.provisioning.aws_names import TAG_KEY
from transientvod.testbed import sshd

pytestmark = [require_testbed(), pytest.mark.slow]

PAGE = REPO / "docs" / "aws-end-to-end.md"
STAND_IN = Path(__file__).with_name("ec2_stand_in.py")
SECOND_TERMINAL = "# In a second terminal"
JOB = "e2e"
BUCKET = "e2e-checkpoints"
REGION = "us-east-1"
# A stand-in for accelerator time (conftest.job_environment's variable): after the first
# checkpoint, the page's remaining 1100 steps last at least 77 s on any machine, while a
# replacement joins about 45 s after the warning (20 s to the termination, the fleet's next
# pass within 10 s, the boot, the launcher's SSH probe within 10 s).
STEP_SECONDS = "0.07"


def page_blocks() -> list[str]:
    return re.findall(r"^```bash\n(.*?)^```", PAGE.read_text(), flags=re.S | re.M)


def settings_block(values: dict) -> str:
    return "\n".join(f"{name}={value}" for name, value in values.items()) + "\n"


def checkout_copy(destination: Path) -> Path:
    """The files git tracks, as a user's checkout has them (the page builds a wheel in it)."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, check=True, timeout=60).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = REPO / name
        if source.is_file():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination / name)
    return destination


class Head:
    """Bash on the testbed's head, in the checkout, with the test's settings before each block."""

    def __init__(self, record, checkout: Path, env: dict, settings: str, logs: Path):
        self.record, self.checkout, self.env, self.settings, self.logs = record, checkout, env, settings, logs
        self._count = 0

    def argv(self, block: str) -> list[str]:
        return sshd.exec_argv(self.record.layout.head, ["bash", "-euo", "pipefail", "-c", self.settings + block])

    def run(self, block: str, timeout: float = 300) -> str:
        done = subprocess.run(self.argv(block), cwd=self.checkout, env=self.env, capture_output=True, text=True,
                              timeout=timeout)
        assert done.returncode == 0, f"the block\n{block}\nexited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
        return done.stdout + done.stderr

    def start(self, block: str, name: str) -> tuple[subprocess.Popen, Path]:
        log_path = self.logs / f"{name}.log"
        with open(log_path, "w") as log:
            proc = subprocess.Popen(self.argv(block), cwd=self.checkout, env=self.env, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        return proc, log_path

    def python(self, program: str) -> str:
        done = subprocess.run(sshd.exec_argv(self.record.layout.head, [sys.executable, "-c", program]), env=self.env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout


class Cloud:
    """The EC2 stand-in on the head, and what it did (its events.jsonl)."""

    def __init__(self, head: Head, endpoint: str, control: Path):
        control.mkdir()
        self.control = control
        # The head's network, but this machine's files: `ip netns exec` would put the head's
        # /etc/ssh (its client config) over /etc/ssh, and the hosts it boots would start sshd
        # without this machine's sshd_config and host keys.
        argv = ["nsenter", f"--net=/run/netns/{head.record.layout.head.name}", "--", sys.executable, str(STAND_IN),
                "--testbed", head.record.name, "--endpoint", endpoint, "--region", REGION, "--job-tag", JOB,
                "--control", str(control)]
        self.log_path = control / "stand-in.log"
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(argv, env={**head.env, "PYTHONPATH": str(REPO)}, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        self.wait_for(lambda events: any(e["event"] == "ready" for e in events), 60, "the EC2 stand-in to start")

    def events(self) -> list[dict]:
        path = self.control / "events.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def wait_for(self, predicate, timeout: float, what: str) -> list[dict]:
        deadline = time.monotonic() + timeout
        while True:
            events = self.check()
            if predicate(events):
                return events
            assert time.monotonic() < deadline, f"timed out waiting for {what}; events: {events}"
            time.sleep(0.5)

    def check(self) -> list[dict]:
        """Its events, once it is known that it runs and that no instance failed to boot."""
        assert self.proc.poll() is None, f"the EC2 stand-in ended:\n{self.log_path.read_text()[-4000:]}"
        events = self.events()
        failed = [e for e in events if e["event"] in ("boot-failed", "no-free-host")]
        assert not failed, f"{failed}\n{self.log_path.read_text()[-4000:]}"
        return events

    def interrupt(self, instance_id: str) -> None:
        (self.control / f"interrupt-{instance_id}").touch()

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)


def synced(run_dir: Path) -> list[dict]:
    path = run_dir / "events.jsonl"
    rows = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            row = json.loads(line)
        except ValueError:
            continue  # the line being written
        if row.get("event") == "synced":
            rows.append(row)
    return rows


def wait_for_sync(cloud: Cloud, run_dir: Path, train: subprocess.Popen, train_log: Path, predicate, timeout: float,
                  what: str) -> list[dict]:
    deadline = time.monotonic() + timeout
    while not predicate(synced(run_dir)):
        cloud.check()
        assert train.poll() is None, f"the job ended before {what}:\n{train_log.read_text()[-6000:]}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}:\n{train_log.read_text()[-6000:]}"
        time.sleep(0.5)
    return synced(run_dir)


def wait_for_log(cloud: Cloud, train: subprocess.Popen, train_log: Path, text: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while text not in train_log.read_text(errors="replace"):
        cloud.check()
        assert train.poll() is None, f"the job ended before {text!r}:\n{train_log.read_text()[-6000:]}"
        assert time.monotonic() < deadline, f"timed out waiting for {text!r}:\n{train_log.read_text()[-6000:]}"
        time.sleep(0.5)


LEFT_IN_AWS = f"""
import boto3, json
ec2, sqs, events, iam, s3 = (boto3.client(s, region_name={REGION!r}) for s in ("ec2", "sqs", "events", "iam", "s3"))
left = []
for r in ec2.describe_instances(Filters=[{{"Name": "tag:{TAG_KEY}", "Values": [{JOB!r}]}},
        {{"Name": "instance-state-name", "Values": ["pending", "running", "stopping", "stopped"]}}])["Reservations"]:
    left += [("instance", i["InstanceId"], i["State"]["Name"]) for i in r["Instances"]]
left += [("queue", q) for q in sqs.list_queues().get("QueueUrls", [])]
left += [("rule", r["Name"]) for r in events.list_rules()["Rules"]]
left += [("role", r["RoleName"]) for r in iam.list_roles()["Roles"] if {JOB!r} in r["RoleName"]]
left += [("instance profile", p["InstanceProfileName"]) for p in iam.list_instance_profiles()["InstanceProfiles"]]
left += [("security group", g["GroupName"]) for g in ec2.describe_security_groups()["SecurityGroups"]
         if g["GroupName"] != "default"]
left += [("bucket", b["Name"]) for b in s3.list_buckets()["Buckets"]]
print(json.dumps(left))
"""


def test_the_pages_commands_take_an_empty_account_to_a_finished_job_and_leave_nothing(testbed_factory, tmp_path):
    record = testbed_factory(3)  # two instances, and one to replace the revoked one
    head_machine = record.layout.head
    moto, endpoint = start_s3_on_head(record, tmp_path / "moto.log")
    cloud = None
    background: list[subprocess.Popen] = []
    try:
        env = {**aws_environment(tmp_path, endpoint), "TRANSIENTVOD_STEP_SECONDS": STEP_SECONDS,
               "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
        checkout = checkout_copy(tmp_path / "checkout")
        head = Head(record, checkout, env, "", tmp_path)
        ami = head.python("import boto3; print(boto3.client('ec2').describe_images(MaxResults=5)"
                          "['Images'][0]['ImageId'])").strip()

        blocks = page_blocks()
        settings = {"JOB": JOB, "REGION": REGION, "BUCKET": BUCKET, "AMI": ami, "INSTANCE_TYPE": "g4dn.xlarge",
                    "SSH_PUBLIC_KEY": str(record.directory / "id_ed25519.pub"), "SSH_USER": "root",
                    "MY_CIDR": f"{head_machine.address}/32"}
        assert blocks[0].startswith("# Your settings"), blocks[0]
        page_settings = re.findall(r"^([A-Z_]+)=", blocks[0], flags=re.M)
        assert page_settings == list(settings), "the page's settings and the test's differ"
        head.settings = settings_block(settings)

        cloud = Cloud(head, endpoint, tmp_path / "cloud")
        run_dir = checkout / "runs" / JOB
        fleet = train = status_while_training = None
        after_the_job = []
        for block in blocks[1:]:
            if block.startswith(SECOND_TERMINAL):
                fleet, fleet_log = head.start(block, "fleet")
                background.append(fleet)
            elif block.startswith("transientvod train"):
                train, train_log = head.start(block, "train")
                background.append(train)
                wait_for_sync(cloud, run_dir, train, train_log, lambda rows: any(r["size"] == 2 for r in rows), 300,
                              "both instances in the job")
            elif train is not None and status_while_training is None:  # the page runs it beside the job
                wait_for_log(cloud, train, train_log, f"saved checkpoint s3://{BUCKET}/{JOB}/step-", 120)
                status_while_training = head.run(block)
                revoke_one_and_see_the_job_through(cloud, run_dir, train, train_log)
                assert train.wait(timeout=600) == 0, train_log.read_text()[-8000:]
                assert fleet.wait(timeout=120) == 0, fleet_log.read_text()[-4000:]
            else:
                after_the_job.append(head.run(block))
        assert status_while_training is not None and after_the_job, "the page has no status block beside the job"

        # While training, status listed the two instances running.
        assert "(2 pending or running;" in status_while_training, status_while_training
        assert re.search(r"checkpoint: step \d+, world size 2 \(s3://", status_while_training), status_while_training

        # The job: all its steps, nothing lost, 2 -> 1 -> 2 workers.
        summary = json.loads((run_dir / "summary.json").read_text())
        train_text = train_log.read_text()
        assert summary["steps"] == 1200, train_text[-6000:]
        assert summary["steps_lost"] == 0, train_text[-6000:]
        assert summary["world_sizes_seen"] == [2, 1, 2], train_text[-6000:]
        assert summary["checkpoint"] == f"s3://{BUCKET}/{JOB}"
        ended = [line for line in train_text.splitlines() if "the launcher terminated" in line]
        assert ended and "2 instances of job e2e" in ended[-1], train_text[-4000:]
        fleet_text = fleet_log.read_text()
        assert f"job {JOB} was ended by launcher" in fleet_text, fleet_text[-3000:]

        # The end: no instance pending or running, and nothing the job made left in AWS.
        final = after_the_job[-1]
        instances = [line.split() for line in final.splitlines() if line.strip().startswith("i-")]
        assert "(0 pending or running;" in final and len(instances) == 3, final
        assert all(fields[3].rstrip(",") == "terminated" for fields in instances), final
        assert json.loads(head.python(LEFT_IN_AWS)) == []
    finally:
        for proc in background:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
        if cloud is not None:
            cloud.stop()
        os.killpg(moto.pid, signal.SIGKILL)
        moto.wait(timeout=30)


def revoke_one_and_see_the_job_through(cloud: Cloud, run_dir: Path, train, train_log: Path) -> None:
    """EC2 takes back the instance of a worker other than rank 0: its host leaves the job at the
    warning, before it vanishes; the fleet's replacement boots and joins."""
    placed = {e["dns"]: e["instance"] for e in cloud.events() if e["event"] == "placed"}  # the job's host names
    rows = synced(run_dir)
    rank0_host = next(r["host"] for r in reversed(rows) if r["rank"] == 0)
    victim_host = next(host for host in placed if host != rank0_host)
    victim = placed[victim_host]
    noticed_at = time.time()
    cloud.interrupt(victim)
    rows = wait_for_sync(cloud, run_dir, train, train_log, lambda rows: any(r["size"] == 1 and r["time"] > noticed_at
                                                                     for r in rows), 60, "the noticed host to leave")
    left_at = min(r["time"] for r in rows if r["size"] == 1 and r["time"] > noticed_at)
    events = cloud.wait_for(lambda events: any(e["event"] == "vanished" and e["instance"] == victim for e in events),
                            120, "the interrupted instance to vanish")
    vanished_at = next(e["time"] for e in events if e["event"] == "vanished" and e["instance"] == victim)
    assert left_at < vanished_at, "the host left the job only after it vanished"
    events = cloud.wait_for(lambda events: len([e for e in events if e["event"] == "booted"]) == 3, 180,
                            "the replacement to boot")
    replacement = [e for e in events if e["event"] == "placed"][-1]
    wait_for_sync(cloud, run_dir, train, train_log, lambda rows: any(r["size"] == 2 and r["host"] == replacement["dns"]
                                                              for r in rows), 180, "the replacement to join")
