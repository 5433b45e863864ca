"""A job's EC2 instances as the cloud lists them, and the one way to end them all.

`transientvod down`, the launcher at a job's end and `transientvod status` all go through
here. Ending a job's instances first tags each one `transientvod:ended-by=<who>` (down or
launcher), then terminates it: the tag is how a `transientvod fleet` of the job, possibly on
another machine, learns that the job was ended and must not launch replacements (fleet.py
stops at its next pass). Everything is read from EC2, never from a local file: a second
`down`, from any machine, sees what the first one left.

IAM permissions: ec2:DescribeInstances, ec2:CreateTags, ec2:TerminateInstances.
"""
from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass

import botocore.exceptions

from transientvod.aws_clients import aws_client
from transientvod.spot.providers.aws import FILTER_VALUES_PER_CALL, INSTANCE_STATES, aws_error, describe_job_instances

log = logging.getLogger(__name__)

JOB_TAG_KEY = "transientvod:job"
# Who ended an instance of the job: "down" or "launcher". A fleet that sees it stops.
ENDED_BY_TAG_KEY = "transientvod:ended-by"
# What `down` terminates: every state an instance can still come back from or still bills in.
ENDABLE_STATES = ("pending", "running", "stopping", "stopped")


@dataclass(frozen=True)
class EndedInstance:
    instance_id: str
    instance_type: str
    state: str  # before it was ended


def instance_tags(instance: dict) -> dict[str, str]:
    return {tag["Key"]: tag["Value"] for tag in instance.get("Tags") or []}


def ended_by(instance: dict) -> str | None:
    """Who ended this instance of the job (down, launcher), or None."""
    return instance_tags(instance).get(ENDED_BY_TAG_KEY)


def market_of(instance: dict) -> str:
    """spot or on-demand: EC2 sets InstanceLifecycle only on spot (and scheduled) instances."""
    return "spot" if instance.get("InstanceLifecycle") == "spot" else "on-demand"


class JobInstances:
    """The EC2 instances tagged `tag_key=job_tag` in one region, through one client."""

    def __init__(self, job_tag: str, region: str | None = None, endpoint_url: str | None = None,
                 session=None, tag_key: str = JOB_TAG_KEY, whose: str = "these"):
        if not job_tag:
            raise ValueError("job_tag is empty; give the value of the transientvod:job tag of the job's instances.")
        self.job_tag = job_tag
        self.tag_key = tag_key
        self.whose = whose  # whose credentials an AccessDenied names
        self.region = region
        self.session = session
        self.endpoint_url = endpoint_url
        with self.errors("creating the EC2 client"):
            self.ec2 = aws_client("ec2", region, endpoint_url, session)
        self.region = self.ec2.meta.region_name

    def list(self, states=INSTANCE_STATES) -> list[dict]:
        """Every instance of the job in `states`, oldest first (EC2 keeps listing a terminated
        one for about an hour after it ended)."""
        with self.errors("ec2:DescribeInstances"):
            instances = describe_job_instances(self.ec2, self.tag_key, self.job_tag, states)
        return sorted(instances, key=lambda i: (i["LaunchTime"], i["InstanceId"]))

    def end_all(self, by: str) -> list[EndedInstance]:
        """Tags every instance of the job that is pending, running, stopping or stopped with
        `transientvod:ended-by=<by>`, then terminates it; answers what it ended (empty when
        nothing was left to end). Tagged first: a fleet that lists the job between the two
        calls already sees the mark, and one that lists it after sees both."""
        ending = self.list(ENDABLE_STATES)
        ids = [i["InstanceId"] for i in ending]
        for start in range(0, len(ids), FILTER_VALUES_PER_CALL):
            chunk = ids[start:start + FILTER_VALUES_PER_CALL]
            with self.errors("ec2:CreateTags"):
                self.ec2.create_tags(Resources=chunk, Tags=[{"Key": ENDED_BY_TAG_KEY, "Value": by}])
            with self.errors("ec2:TerminateInstances"):
                self.ec2.terminate_instances(InstanceIds=chunk)
        if ids:
            log.info("%s ended %d instances of job %s: %s.", by, len(ids), self.job_tag, ", ".join(ids))
        return [EndedInstance(i["InstanceId"], i.get("InstanceType", ""), i["State"]["Name"]) for i in ending]

    @contextlib.contextmanager
    def errors(self, call: str):
        """botocore's exceptions during `call` as one-sentence ProviderErrors."""
        try:
            yield
        except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as e:
            raise aws_error(e, call, self.region, self.whose) from e


def describe_ended(job_tag: str, ended: list[EndedInstance], by: str) -> str:
    """One sentence: what was ended, or that nothing was running."""
    if not ended:
        return f"job {job_tag} has no instance pending, running, stopping or stopped; nothing to end."
    listed = ", ".join(f"{e.instance_id} ({e.instance_type}, {e.state})" for e in ended)
    return f"{by} terminated {len(ended)} instance{'s' if len(ended) != 1 else ''} of job {job_tag}: {listed}."
