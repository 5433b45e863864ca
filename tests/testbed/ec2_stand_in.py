"""EC2's side of a testbed, for what moto (EC2's API) does not do: run the instances it lists.

moto answers every API call the product makes (RunInstances, CreateTags, TerminateInstances,
EventBridge, SQS, S3), but its instances are records, not machines. This program, run on the
testbed's head next to a moto server, makes each of the job's instances a machine, the way EC2
does:

- A running instance of the job gets a free testbed host. Its private DNS name resolves to the
  host's address on every machine (the VPC's DNS: a line in each /etc/netns/*/hosts), its
  metadata service starts at 169.254.169.254 inside the host (imds_ec2.py), and the host boots
  from the instance's own user data, read back from moto (testbed/boot.py, as cloud-init runs it).
- An instance moto lists as shutting-down, terminated, stopping or stopped vanishes: its
  host's link goes down and its processes freeze (the testbed's `vanish`).
- A spot interruption, when the test asks for one (a file `interrupt-<instance id>` in the
  control directory): EC2's two-minute warning as the instance's metadata shows it, the
  EventBridge event put on the bus (the rules `aws setup` made route it to the job's queue),
  then, --notice-seconds later (shorter than EC2's 120 s, so the test does not wait minutes),
  TerminateInstances.

Each thing done is one JSON line in <control>/events.jsonl, for the test to follow.

    python ec2_stand_in.py --testbed NAME --endpoint URL --region R --job-tag JOB --control DIR
"""
from __future__ import annotations

import argparse
import base64
import json
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import boto3

from transientvod.spot.providers.aws import INTERRUPTION_WARNING, describe_job_instances
from transientvod.spot.provisioning.aws_names import TAG_KEY
from transientvod.testbed import cluster, sshd
from transientvod.testbed.boot import boot
from transientvod.testbed.record import require_record

METADATA_ADDRESS = "169.254.169.254"
IMDS = Path(__file__).with_name("imds_ec2.py")
GONE_STATES = {"shutting-down", "terminated", "stopping", "stopped"}
POLL_SECONDS = 0.5


class Ec2StandIn:
    def __init__(self, testbed: str, endpoint: str, region: str, job_tag: str, control: Path, notice_seconds: float):
        self.record = require_record(testbed)
        self.endpoint, self.region, self.job_tag = endpoint, region, job_tag
        self.control = control
        self.notices_dir = control / "instance-actions"
        self.notices_dir.mkdir(parents=True, exist_ok=True)
        self.notice_seconds = notice_seconds
        self.ec2 = boto3.client("ec2", region_name=region, endpoint_url=endpoint)
        self.events = boto3.client("events", region_name=region, endpoint_url=endpoint)
        self.free_hosts = list(self.record.layout.hosts)
        self.host_of: dict[str, object] = {}  # instance id -> testbed host
        self.gone: set[str] = set()
        self.interrupted: set[str] = set()
        self._log_lock = threading.Lock()

    def say(self, event: str, **fields) -> None:
        with self._log_lock, open(self.control / "events.jsonl", "a") as log:
            log.write(json.dumps({"event": event, "time": time.time(), **fields}) + "\n")

    def run(self) -> None:
        self.say("ready")
        while True:
            for instance in describe_job_instances(self.ec2, TAG_KEY, self.job_tag,
                                                   states=["pending", "running", *GONE_STATES]):
                instance_id, state = instance["InstanceId"], instance["State"]["Name"]
                if state == "running" and instance_id not in self.host_of and instance_id not in self.gone:
                    self.place(instance)
                elif state in GONE_STATES and instance_id not in self.gone:
                    self.take_away(instance_id, state)
            for request in self.control.glob("interrupt-*"):
                instance_id = request.name.removeprefix("interrupt-")
                if instance_id not in self.interrupted:
                    self.interrupted.add(instance_id)
                    threading.Thread(target=self.interrupt, args=(instance_id,), daemon=True).start()
            time.sleep(POLL_SECONDS)

    def place(self, instance: dict) -> None:
        instance_id, dns = instance["InstanceId"], instance["PrivateDnsName"]
        if not self.free_hosts:
            self.gone.add(instance_id)  # never placed: it stays a record, and never takes the key
            self.say("no-free-host", instance=instance_id)
            return
        host = self.free_hosts.pop(0)
        self.host_of[instance_id] = host
        # A new VM runs no sshd until its user data starts one: the testbed's own goes before the
        # instance's name resolves, or the launcher would learn that sshd's host key for it.
        sshd.stop(self.record.directory, host)
        for machine in self.record.layout.machines:
            with open(f"/etc/netns/{machine.name}/hosts", "a") as hosts:
                hosts.write(f"{host.address}\t{dns} {dns.split('.')[0]}\n")
        self.start_metadata_service(host.name, instance_id)
        encoded = self.ec2.describe_instance_attribute(InstanceId=instance_id, Attribute="userData")
        script = self.control / f"user-data-{instance_id}.sh"
        script.write_bytes(base64.b64decode(encoded["UserData"]["Value"]))
        self.say("placed", instance=instance_id, host=host.name, dns=dns)
        threading.Thread(target=self.boot, args=(instance_id, host.name, script), daemon=True).start()

    def start_metadata_service(self, host: str, instance_id: str) -> None:
        subprocess.run(["ip", "-n", host, "addr", "add", f"{METADATA_ADDRESS}/32", "dev", "lo"], check=True, timeout=30)
        log = open(self.control / f"imds-{instance_id}.log", "w")
        proc = subprocess.Popen(["ip", "netns", "exec", host, sys.executable, str(IMDS), "--address", METADATA_ADDRESS,
                                 "--port", "80", "--instance-id", instance_id, "--endpoint", self.endpoint,
                                 "--region", self.region, "--notices-dir", str(self.notices_dir)],
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 60
        while "serving" not in (self.control / f"imds-{instance_id}.log").read_text():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the metadata service of {instance_id} did not start: "
                                   + (self.control / f"imds-{instance_id}.log").read_text())
            time.sleep(0.1)

    def boot(self, instance_id: str, host: str, script: Path) -> None:
        try:
            output = boot(self.record.name, host, script)
        except Exception as e:  # the test reads it from the events
            self.say("boot-failed", instance=instance_id, host=host, error=str(e))
            return
        (self.control / f"boot-{instance_id}.log").write_text(output)
        self.say("booted", instance=instance_id, host=host)

    def take_away(self, instance_id: str, state: str) -> None:
        self.gone.add(instance_id)
        host = self.host_of.get(instance_id)
        if host is not None:
            cluster.vanish(self.record.name, host.name)
        self.say("vanished", instance=instance_id, host=host.name if host else None, state=state)

    def interrupt(self, instance_id: str) -> None:
        """EC2's spot interruption: the warning on the instance and on the bus, then the end."""
        at = datetime.now(timezone.utc) + timedelta(seconds=120)
        action = {"action": "terminate", "time": at.strftime("%Y-%m-%dT%H:%M:%SZ")}
        partial = self.notices_dir / f".{instance_id}.partial"
        partial.write_text(json.dumps(action))
        partial.replace(self.notices_dir / instance_id)
        arn = f"arn:aws:ec2:{self.region}:123456789012:instance/{instance_id}"
        self.events.put_events(Entries=[{
            "Source": "aws.ec2", "DetailType": INTERRUPTION_WARNING, "Resources": [arn],
            "Detail": json.dumps({"instance-id": instance_id, "instance-action": "terminate"})}])
        self.say("noticed", instance=instance_id)
        time.sleep(self.notice_seconds)
        self.ec2.terminate_instances(InstanceIds=[instance_id])
        self.say("terminated", instance=instance_id)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--testbed", required=True)
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--region", required=True)
    parser.add_argument("--job-tag", required=True)
    parser.add_argument("--control", type=Path, required=True)
    parser.add_argument("--notice-seconds", type=float, default=20.0)
    args = parser.parse_args()
    Ec2StandIn(args.testbed, args.endpoint, args.region, args.job_tag, args.control, args.notice_seconds).run()


if __name__ == "__main__":
    main()
