"""What `transientvod aws setup` makes for a job, as plain data: the names (derived from the
job tag alone, so `teardown` finds them with nothing else to go on), the EventBridge event
patterns, and the policy documents. No AWS calls here; aws_setup/ makes the calls.

The policies follow AWS's node termination handler in queue mode: the queue lets
events.amazonaws.com send to it, only from this job's rules; the workers' role may describe
instances, read the notice queue (so the watcher can run on one of the job's instances) and,
when the job checkpoints to S3, read and write under that prefix only.

The security group's rules: every TCP port among the group's members (Gloo and Horovod's own
servers listen on ports the kernel picks, so no narrower range exists), and SSH from the
launcher's address when it is outside the group.
"""
from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from transientvod.spot.providers.aws import CAPACITY_RESERVATION_WARNING, INTERRUPTION_WARNING, REBALANCE_RECOMMENDATION

TAG_KEY = "transientvod:job"  # the tag AwsProvider lists instances by; setup tags what it makes with it too
STATE_CHANGE = "EC2 Instance State-change Notification"
# Rule name suffix -> the detail-type it forwards. The watcher reads the three notice kinds
# (spot/providers/aws.py NOTICE_KINDS); state changes it deletes unread, since DescribeInstances already
# shows a stopped or terminated host at the next poll: the rule is there so the queue carries
# every lifecycle event AWS's own handler listens to.
RULE_KINDS = {
    "spot-interruption": INTERRUPTION_WARNING,
    "rebalance": REBALANCE_RECOMMENDATION,
    "capacity-reservation": CAPACITY_RESERVATION_WARNING,
    "state-change": STATE_CHANGE,
}
# Only the states in which an instance leaves the job: "pending" and "running" events from a
# busy account would otherwise fill the queue with messages the watcher only deletes.
LEAVING_STATES = ["stopping", "shutting-down", "stopped", "terminated"]
TARGET_ID = "transientvod-notices"
ROLE_POLICY_NAME = "transientvod-worker"

# Names must fit every service: SQS queue names allow letters, digits, - and _ (80 characters);
# EventBridge rule and IAM role names 64, and the longest suffix below is 21 characters.
JOB_TAG_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")
JOB_TAG_MAX = 64 - len("transientvod-") - len("-capacity-reservation")
REGION_PATTERN = re.compile(r"[a-z]{2}(-[a-z]+)+-[0-9]+")


@dataclass(frozen=True)
class SetupNames:
    """The names of everything setup makes for one job tag."""
    job_tag: str
    queue: str
    rules: dict  # rule name -> the detail-type it forwards
    role: str
    instance_profile: str
    security_group: str

    @classmethod
    def for_job(cls, job_tag: str) -> SetupNames:
        check_job_tag(job_tag)
        base = f"transientvod-{job_tag}"
        return cls(job_tag=job_tag, queue=f"{base}-notices",
                   rules={f"{base}-{suffix}": kind for suffix, kind in RULE_KINDS.items()},
                   role=f"{base}-worker", instance_profile=f"{base}-worker", security_group=f"{base}-hosts")


def check_job_tag(job_tag: str) -> None:
    if not job_tag or not JOB_TAG_PATTERN.fullmatch(job_tag) or len(job_tag) > JOB_TAG_MAX:
        raise ValueError(f"job tag {job_tag!r} cannot name the queue, rules and role; use letters, digits, "
                         f"'-' and '_' (starting with a letter or digit), at most {JOB_TAG_MAX} characters.")


def check_region(region: str) -> None:
    if not region or not REGION_PATTERN.fullmatch(region):
        raise ValueError(f"region {region!r} is not an AWS region name; give one like us-east-1 or eu-west-2.")


def parse_s3_prefix(url: str) -> tuple[str, str]:
    """(bucket, prefix without slashes at either end) of an s3://bucket/prefix URL."""
    if not url.startswith("s3://") or not url[5:].split("/", 1)[0]:
        raise ValueError(f"checkpoint directory {url!r} is not an s3://bucket/prefix URL.")
    bucket, _, prefix = url[5:].partition("/")
    return bucket, prefix.strip("/")


def event_pattern(kind: str) -> dict:
    pattern = {"source": ["aws.ec2"], "detail-type": [kind]}
    if kind == STATE_CHANGE:
        pattern["detail"] = {"state": LEAVING_STATES}
    return pattern


def rule_arn(queue_arn: str, rule: str) -> str:
    """A rule's ARN in the queue's partition, region and account (both live in one region)."""
    _, partition, _, region, account, _ = queue_arn.split(":", 5)
    return f"arn:{partition}:events:{region}:{account}:rule/{rule}"


def queue_policy(queue_arn: str, rules) -> dict:
    """EventBridge may send to the queue, for these rules only (aws:SourceArn), so no other
    rule in the account, and no other account, can fill the job's queue."""
    return {"Version": "2012-10-17", "Id": f"{queue_arn}/transientvod",
            "Statement": [{"Sid": "EventBridgeSendsNotices", "Effect": "Allow",
                           "Principal": {"Service": "events.amazonaws.com"}, "Action": "sqs:SendMessage",
                           "Resource": queue_arn,
                           "Condition": {"ArnEquals": {"aws:SourceArn": [rule_arn(queue_arn, r) for r in rules]}}}]}


def assume_role_policy() -> dict:
    return {"Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}]}


def worker_policy(queue_arn: str, s3_prefix: str = "") -> dict:
    """What the job's instances need: the watcher's describe and queue calls (spot/providers/aws.py) and,
    with an s3:// checkpoint directory, the S3 store's calls (checkpoint/s3.py) under that
    prefix. Describe calls take no resource-level permissions, hence "*"."""
    partition = queue_arn.split(":")[1]
    statements = [
        {"Sid": "DescribeTheJobsInstances", "Effect": "Allow", "Resource": "*",
         "Action": ["ec2:DescribeInstances", "ec2:DescribeInstanceTypes", "ec2:DescribeSpotInstanceRequests"]},
        {"Sid": "ReadTheNoticeQueue", "Effect": "Allow", "Resource": queue_arn,
         "Action": ["sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:GetQueueAttributes"]},
    ]
    if s3_prefix:
        bucket, prefix = parse_s3_prefix(s3_prefix)
        keys = f"{prefix}/*" if prefix else "*"
        statements += [
            # Listing has no prefix condition: the store's HeadBucket at start (a bucket check
            # that needs s3:ListBucket) names no prefix, and a condition on s3:prefix denies it.
            # Objects themselves are readable and writable under the prefix only.
            {"Sid": "ListTheCheckpointBucket", "Effect": "Allow", "Resource": f"arn:{partition}:s3:::{bucket}",
             "Action": ["s3:ListBucket", "s3:ListBucketMultipartUploads"]},
            {"Sid": "ReadAndWriteCheckpoints", "Effect": "Allow", "Resource": f"arn:{partition}:s3:::{bucket}/{keys}",
             "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload",
                        "s3:ListMultipartUploadParts"]},
        ]
    return {"Version": "2012-10-17", "Statement": statements}


SSH_PORT = 22


def members_rule(group_id: str) -> dict:
    """Ingress of every TCP port from the group itself (a self-referencing rule)."""
    return {"IpProtocol": "tcp", "FromPort": 0, "ToPort": 65535,
            "UserIdGroupPairs": [{"GroupId": group_id, "Description": "the job's hosts: Gloo, Horovod, the head"}]}


def check_cidr(cidr: str) -> str:
    """The network `cidr` names, written as AWS writes it (203.0.113.7 -> 203.0.113.7/32)."""
    try:
        return str(ipaddress.ip_network(cidr, strict=False))
    except ValueError:
        raise ValueError(f"--ssh-from {cidr!r} is not an address or a network; give the launcher's public address "
                         "as a CIDR, for example 203.0.113.7/32.") from None


def ssh_rule(cidr: str) -> dict:
    """Ingress of SSH from the launcher's network (IPv4 or IPv6)."""
    network = ipaddress.ip_network(cidr)
    ranges = ({"Ipv6Ranges": [{"CidrIpv6": cidr, "Description": "the launcher's ssh"}]} if network.version == 6
              else {"IpRanges": [{"CidrIp": cidr, "Description": "the launcher's ssh"}]})
    return {"IpProtocol": "tcp", "FromPort": SSH_PORT, "ToPort": SSH_PORT, **ranges}
