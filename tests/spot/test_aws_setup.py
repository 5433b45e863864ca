"""`transientvod aws setup` and `teardown` against a moto server on 127.0.0.1.

The end-to-end test goes the way a real interruption does: an EC2 event put on the default
event bus is routed by the rules setup made into the queue setup made, and `transientvod
watch`, configured by the fragment setup wrote, drops the host from launch/spot_hosts.py.

What moto does and does not check, and how these tests cope:
- it routes put_events to SQS targets by the rules' event patterns, so routing is real;
- it does not evaluate the queue policy when EventBridge delivers, so the policy is checked
  as a document (its rule ARNs must be the ARNs the rules really got);
- it enforces IAM when asked (its /moto-api/reset-auth endpoint), so the missing-permission
  tests run setup as an IAM user whose policy denies one action, and get the AccessDenied a
  real account gives.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from conftest import REPO, TRANSIENTVOD, reset_moto

from transientvod.config import load_config
from transientvod.spot.providers.aws import CAPACITY_RESERVATION_WARNING, INTERRUPTION_WARNING, REBALANCE_RECOMMENDATION
from transientvod.spot.provisioning import aws_names
from transientvod.spot.provisioning.aws_names import STATE_CHANGE, SetupNames

JOB = "resnet32-run7"
REGION = "us-east-1"
NAMES = SetupNames.for_job(JOB)
# queue, its policy, 4 rules and 4 targets, role, its policy, profile, role in profile, security
# group, its members' rule (with --ssh-from, one more: the SSH rule)
PARTS = 16
NOTHING = {"queues": [], "rules": [], "targets": [], "roles": [], "role policies": [], "profiles": [],
           "security groups": []}


@pytest.fixture
def cloud(ec2_moto):
    url, ami, session = ec2_moto
    reset_moto(url)
    return Cloud(url, ami, session)


class Cloud:
    """The test's own view of the account: what exists, and EC2 playing its part."""

    def __init__(self, endpoint: str, ami: str, session):
        self.endpoint, self.ami, self.session = endpoint, ami, session
        self.sqs = session.client("sqs", endpoint_url=endpoint)
        self.events = session.client("events", endpoint_url=endpoint)
        self.iam = session.client("iam", endpoint_url=endpoint)
        self.ec2 = session.client("ec2", endpoint_url=endpoint)

    def aws(self, action: str, *args: str, env: dict | None = None, cwd=None) -> subprocess.CompletedProcess:
        return subprocess.run(TRANSIENTVOD + ["aws", action, "--job-tag", JOB, "--region", REGION,
                                              "--endpoint-url", self.endpoint, *args],
                              capture_output=True, text=True, timeout=120, cwd=cwd or REPO, env=env)

    def inventory(self) -> dict:
        """Everything in the account whose name setup could have made."""
        return {
            "queues": sorted(self.sqs.list_queues(QueueNamePrefix="transientvod-").get("QueueUrls", [])),
            "rules": sorted(r["Name"] for r in self.events.list_rules(NamePrefix="transientvod-")["Rules"]),
            "targets": sorted((r, t["Id"], t["Arn"]) for r in NAMES.rules
                              for t in self._targets(r)),
            "roles": sorted(r["RoleName"] for r in self.iam.list_roles()["Roles"]
                            if r["RoleName"].startswith("transientvod-")),
            "role policies": sorted(p for r in self.iam.list_roles()["Roles"] if r["RoleName"] == NAMES.role
                                    for p in self.iam.list_role_policies(RoleName=r["RoleName"])["PolicyNames"]),
            "profiles": sorted((p["InstanceProfileName"], tuple(r["RoleName"] for r in p["Roles"]))
                               for p in self.iam.list_instance_profiles()["InstanceProfiles"]),
            "security groups": sorted(g["GroupName"] for g in self.ec2.describe_security_groups()["SecurityGroups"]
                                      if g["GroupName"].startswith("transientvod-")),
        }

    def _targets(self, rule: str) -> list:
        try:
            return self.events.list_targets_by_rule(Rule=rule)["Targets"]
        except self.events.exceptions.ResourceNotFoundException:
            return []

    def launch(self) -> dict:
        return self.ec2.run_instances(ImageId=self.ami, MinCount=1, MaxCount=1, InstanceType="g4dn.12xlarge",
                                      TagSpecifications=[{"ResourceType": "instance", "Tags": [
                                          {"Key": "transientvod:job", "Value": JOB}]}])["Instances"][0]

    def put_ec2_event(self, detail_type: str, detail: dict) -> None:
        """What EC2 itself puts on the default bus (source aws.ec2)."""
        answer = self.events.put_events(Entries=[{"Source": "aws.ec2", "DetailType": detail_type,
                                                  "Detail": json.dumps(detail)}])
        assert answer["FailedEntryCount"] == 0, answer

    def queue_bodies(self, queue_url: str) -> list[dict]:
        bodies = []
        while True:
            messages = self.sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10).get("Messages", [])
            if not messages:
                return bodies
            for message in messages:
                bodies.append(json.loads(message["Body"]))
                self.sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=message["ReceiptHandle"])


def one_sentence(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("transientvod:")]
    assert len(lines) == 1, done.stderr
    assert lines[0].endswith("."), lines[0]
    return lines[0]


def reported(done: subprocess.CompletedProcess) -> dict[str, str]:
    """The "  <part>: <what happened>" lines setup and teardown print, by part."""
    rows = [line[2:].rsplit(": ", 1) for line in done.stdout.splitlines() if line.startswith("  ")]
    return dict(rows)


# --- the end-to-end path -----------------------------------------------------------------------

def test_after_setup_an_interruption_warning_reaches_the_queue_and_watch_drops_the_host(cloud, tmp_path):
    warned, kept = cloud.launch(), cloud.launch()
    fragment = tmp_path / "aws.yaml"
    done = cloud.aws("setup", "--fragment", str(fragment))
    assert done.returncode == 0, done.stdout + done.stderr
    assert set(reported(done).values()) == {"created"} and len(reported(done)) == PARTS

    # The fragment is a config in the project's schema: it loads, and names the queue made.
    spot = load_config(fragment).spot
    queue_url = cloud.sqs.get_queue_url(QueueName=NAMES.queue)["QueueUrl"]
    assert (spot.provider, spot.job_tag, spot.region, spot.queue_url) == ("aws", JOB, REGION, queue_url)

    state = tmp_path / "hosts.json"
    watcher = subprocess.Popen(TRANSIENTVOD + ["watch", "--config", str(fragment), "--set", f"spot.state_file={state}",
                                               "--set", "spot.poll_seconds=0.2",
                                               # moto's instances run no sshd to log in to
                                               "--set", "spot.wait_for_ssh=false"],
                               cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    both = {f"{warned['PrivateDnsName']}:4", f"{kept['PrivateDnsName']}:4"}
    try:
        assert discovery_until(state, lambda hosts: hosts == both) == both
        cloud.put_ec2_event(INTERRUPTION_WARNING, {"instance-id": warned["InstanceId"], "instance-action": "terminate"})
        after = discovery_until(state, lambda hosts: hosts != both)
    finally:
        watcher.send_signal(signal.SIGINT)
        _, err = watcher.communicate(timeout=20)
    assert after == {f"{kept['PrivateDnsName']}:4"}, err[-3000:]
    assert f"instance {warned['InstanceId']} noticed ({INTERRUPTION_WARNING}" in err
    assert cloud.queue_bodies(queue_url) == []  # the watcher read and deleted it


def discovery_until(state, done, timeout: float = 60) -> set[str]:
    """launch/spot_hosts.py's answer (a set of host:slots lines) once `done` holds of it."""
    hosts = None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if state.exists():
            answer = subprocess.run([sys.executable, str(REPO / "launch" / "spot_hosts.py"), "--state-file", str(state)],
                                    capture_output=True, text=True, timeout=30)
            hosts = set(answer.stdout.split())
            if done(hosts):
                return hosts
        time.sleep(0.2)
    raise AssertionError(f"discovery never got there; it last said {hosts}")


def test_each_rule_forwards_its_kind_and_nothing_else(cloud, tmp_path):
    assert cloud.aws("setup", "--fragment", str(tmp_path / "aws.yaml")).returncode == 0
    queue_url = cloud.sqs.get_queue_url(QueueName=NAMES.queue)["QueueUrl"]
    forwarded = [(INTERRUPTION_WARNING, {"instance-id": "i-1", "instance-action": "terminate"}),
                 (REBALANCE_RECOMMENDATION, {"instance-id": "i-2"}),
                 (CAPACITY_RESERVATION_WARNING, {"instance-id": "i-3", "instance-action": "terminate",
                                                 "instance-termination-time": "2026-12-01T12:00:00Z"}),
                 (STATE_CHANGE, {"instance-id": "i-4", "state": "shutting-down"})]
    for detail_type, detail in forwarded:
        cloud.put_ec2_event(detail_type, detail)
    # Not forwarded: an instance starting (the state-change rule takes only leaving states),
    # and an EC2 event kind no rule names.
    cloud.put_ec2_event(STATE_CHANGE, {"instance-id": "i-5", "state": "running"})
    cloud.put_ec2_event("EC2 AMI State Change", {"ImageId": "ami-1", "State": "available"})

    bodies = cloud.queue_bodies(queue_url)

    assert sorted((b["detail-type"], b["detail"]["instance-id"]) for b in bodies) == sorted(
        (kind, detail["instance-id"]) for kind, detail in forwarded)
    assert all(b["source"] == "aws.ec2" for b in bodies)


def test_the_queue_policy_lets_eventbridge_send_from_the_jobs_rules_only(cloud, tmp_path):
    assert cloud.aws("setup", "--fragment", str(tmp_path / "aws.yaml")).returncode == 0
    queue_url = cloud.sqs.get_queue_url(QueueName=NAMES.queue)["QueueUrl"]
    attributes = cloud.sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["All"])["Attributes"]
    statement, = json.loads(attributes["Policy"])["Statement"]

    rule_arns = sorted(cloud.events.describe_rule(Name=rule)["Arn"] for rule in NAMES.rules)
    assert (statement["Effect"], statement["Principal"], statement["Action"], statement["Resource"]) == (
        "Allow", {"Service": "events.amazonaws.com"}, "sqs:SendMessage", attributes["QueueArn"])
    assert sorted(statement["Condition"]["ArnEquals"]["aws:SourceArn"]) == rule_arns
    for rule in NAMES.rules:
        assert [t["Arn"] for t in cloud.events.list_targets_by_rule(Rule=rule)["Targets"]] == [attributes["QueueArn"]]


def test_the_worker_role_may_describe_read_the_queue_and_use_the_checkpoint_prefix_only(cloud, tmp_path):
    done = cloud.aws("setup", "--fragment", str(tmp_path / "aws.yaml"), "--set", "checkpoint.dir=s3://ckpts/jobs/r7/")
    assert done.returncode == 0, done.stderr
    role = cloud.iam.get_role(RoleName=NAMES.role)["Role"]
    assert role["AssumeRolePolicyDocument"]["Statement"][0]["Principal"] == {"Service": "ec2.amazonaws.com"}
    profile = cloud.iam.get_instance_profile(InstanceProfileName=NAMES.instance_profile)["InstanceProfile"]
    assert [r["RoleName"] for r in profile["Roles"]] == [NAMES.role]
    document = cloud.iam.get_role_policy(RoleName=NAMES.role, PolicyName=aws_names.ROLE_POLICY_NAME)["PolicyDocument"]
    grants = {s["Sid"]: (sorted(s["Action"]), s["Resource"]) for s in document["Statement"]}
    queue_arn = cloud.sqs.get_queue_attributes(QueueUrl=cloud.sqs.get_queue_url(QueueName=NAMES.queue)["QueueUrl"],
                                               AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    assert grants == {
        "DescribeTheJobsInstances": (["ec2:DescribeInstanceTypes", "ec2:DescribeInstances",
                                      "ec2:DescribeSpotInstanceRequests"], "*"),
        "ReadTheNoticeQueue": (["sqs:DeleteMessage", "sqs:GetQueueAttributes", "sqs:ReceiveMessage"], queue_arn),
        "ListTheCheckpointBucket": (["s3:ListBucket", "s3:ListBucketMultipartUploads"], "arn:aws:s3:::ckpts"),
        "ReadAndWriteCheckpoints": (["s3:AbortMultipartUpload", "s3:DeleteObject", "s3:GetObject",
                                     "s3:ListMultipartUploadParts", "s3:PutObject"], "arn:aws:s3:::ckpts/jobs/r7/*"),
    }

    # Without an s3:// checkpoint directory the next setup narrows the policy again, and says so.
    again = cloud.aws("setup", "--fragment", str(tmp_path / "aws.yaml"))
    assert reported(again)[f"inline policy {aws_names.ROLE_POLICY_NAME} of {NAMES.role}"] == "updated"
    document = cloud.iam.get_role_policy(RoleName=NAMES.role, PolicyName=aws_names.ROLE_POLICY_NAME)["PolicyDocument"]
    assert {s["Sid"] for s in document["Statement"]} == {"DescribeTheJobsInstances", "ReadTheNoticeQueue"}


# --- the hosts' security group ----------------------------------------------------------------

def the_group(cloud: Cloud) -> dict:
    groups = cloud.ec2.describe_security_groups(Filters=[{"Name": "group-name", "Values": [NAMES.security_group]}])
    assert len(groups["SecurityGroups"]) == 1, groups
    return groups["SecurityGroups"][0]


def ingress(group: dict) -> set:
    """(protocol, from, to, source) of every source of every ingress rule of the group."""
    return {(p["IpProtocol"], p.get("FromPort"), p.get("ToPort"), source)
            for p in group["IpPermissions"]
            for source in [g["GroupId"] for g in p.get("UserIdGroupPairs", [])]
            + [r["CidrIp"] for r in p.get("IpRanges", [])] + [r["CidrIpv6"] for r in p.get("Ipv6Ranges", [])]}


def test_the_security_group_opens_every_tcp_port_among_its_members_and_ssh_to_the_launcher_only(cloud, tmp_path):
    done = cloud.aws("setup", "--fragment", str(tmp_path / "aws.yaml"), "--ssh-from", "203.0.113.7")
    assert done.returncode == 0, done.stderr
    group = the_group(cloud)
    default_vpc = cloud.ec2.describe_vpcs(Filters=[{"Name": "isDefault", "Values": ["true"]}])["Vpcs"][0]["VpcId"]
    assert group["VpcId"] == default_vpc
    assert {"Key": "transientvod:job", "Value": JOB} in group["Tags"]
    # Gloo's and Horovod's ports are picked by the kernel: every TCP port, but from the group only;
    # from the outside, SSH from the launcher's address alone.
    assert ingress(group) == {("tcp", 0, 65535, group["GroupId"]), ("tcp", 22, 22, "203.0.113.7/32")}
    assert reported(done)[f"rule of {NAMES.security_group}: SSH from 203.0.113.7/32"] == "created"
    assert reported(cloud.aws("setup", "--ssh-from", "203.0.113.7/32", cwd=tmp_path)) == {
        part: "already exists" for part in reported(done)}


def test_without_ssh_from_the_group_admits_its_members_only_and_setup_says_so(cloud, tmp_path):
    done = cloud.aws("setup", "--fragment", str(tmp_path / "aws.yaml"))
    assert done.returncode == 0, done.stderr
    group = the_group(cloud)
    assert ingress(group) == {("tcp", 0, 65535, group["GroupId"])}
    assert (f"no --ssh-from, so SSH reaches the hosts only from members of {NAMES.security_group}: run the launcher "
            "on an instance in it, or run setup again with --ssh-from YOUR_ADDRESS/32.") in done.stdout


def test_teardown_removes_the_group_with_its_rules(cloud, tmp_path):
    assert cloud.aws("setup", "--ssh-from", "2001:db8::/64", cwd=tmp_path).returncode == 0
    assert ("tcp", 22, 22, "2001:db8::/64") in ingress(the_group(cloud))
    done = cloud.aws("teardown")
    assert done.returncode == 0, done.stderr
    assert reported(done)[f"security group {NAMES.security_group}"] == "removed"
    assert cloud.ec2.describe_security_groups(
        Filters=[{"Name": "group-name", "Values": [NAMES.security_group]}])["SecurityGroups"] == []
    assert cloud.inventory() == NOTHING


def test_a_bad_ssh_from_is_one_sentence_and_makes_nothing(cloud, tmp_path):
    done = cloud.aws("setup", "--ssh-from", "my laptop", cwd=tmp_path)
    assert one_sentence(done) == ("transientvod: --ssh-from 'my laptop' is not an address or a network; give the "
                                  "launcher's public address as a CIDR, for example 203.0.113.7/32.")
    assert cloud.inventory() == NOTHING


def delete_default_vpc(ec2) -> None:
    """An account whose region has no default VPC (deleted, or never had one)."""
    vpc = ec2.describe_vpcs(Filters=[{"Name": "isDefault", "Values": ["true"]}])["Vpcs"][0]["VpcId"]
    for subnet in ec2.describe_subnets(Filters=[{"Name": "vpc-id", "Values": [vpc]}])["Subnets"]:
        ec2.delete_subnet(SubnetId=subnet["SubnetId"])
    for gateway in ec2.describe_internet_gateways(
            Filters=[{"Name": "attachment.vpc-id", "Values": [vpc]}])["InternetGateways"]:
        ec2.detach_internet_gateway(InternetGatewayId=gateway["InternetGatewayId"], VpcId=vpc)
    ec2.delete_vpc(VpcId=vpc)


def test_no_default_vpc_is_one_sentence_and_the_run_removes_what_it_made(cloud, tmp_path):
    delete_default_vpc(cloud.ec2)
    done = cloud.aws("setup", cwd=tmp_path)
    assert one_sentence(done) == (f"transientvod: region {REGION} has no default VPC for the hosts' security group; "
                                  f"give --vpc-id (the VPC of the fleet's --subnet-id); the {PARTS - 2} parts this "
                                  "run created were removed again.")
    assert cloud.inventory() == NOTHING
    assert list(tmp_path.iterdir()) == []  # no fragment either


# --- idempotence and teardown --------------------------------------------------------------

def test_setup_twice_makes_nothing_new_and_everything_is_tagged(cloud, tmp_path):
    first = cloud.aws("setup", "--fragment", str(tmp_path / "first.yaml"))
    assert first.returncode == 0, first.stderr
    made = cloud.inventory()
    assert len(made["queues"]) == 1 and len(made["rules"]) == 4 and len(made["targets"]) == 4
    assert made["roles"] == [NAMES.role] and made["role policies"] == [aws_names.ROLE_POLICY_NAME]
    assert made["profiles"] == [(NAMES.instance_profile, (NAMES.role,))]

    second = cloud.aws("setup", "--fragment", str(tmp_path / "second.yaml"))

    assert second.returncode == 0, second.stderr
    assert reported(second) == {part: "already exists" for part in reported(first)}
    assert len(reported(second)) == PARTS
    assert cloud.inventory() == made
    assert (tmp_path / "second.yaml").read_text() == (tmp_path / "first.yaml").read_text()
    tag = {"transientvod:job": JOB}
    assert cloud.sqs.list_queue_tags(QueueUrl=made["queues"][0])["Tags"] == tag
    for rule in made["rules"]:
        arn = cloud.events.describe_rule(Name=rule)["Arn"]
        assert cloud.events.list_tags_for_resource(ResourceARN=arn)["Tags"] == [{"Key": "transientvod:job", "Value": JOB}]
    assert cloud.iam.list_role_tags(RoleName=NAMES.role)["Tags"] == [{"Key": "transientvod:job", "Value": JOB}]
    # (moto has no ListInstanceProfileTags; GetInstanceProfile carries the tags too)
    assert cloud.iam.get_instance_profile(InstanceProfileName=NAMES.instance_profile)["InstanceProfile"]["Tags"] == [
        {"Key": "transientvod:job", "Value": JOB}]


def test_setup_puts_back_a_rule_that_was_disabled_or_changed(cloud, tmp_path):
    assert cloud.aws("setup", "--fragment", str(tmp_path / "aws.yaml")).returncode == 0
    disabled, changed = list(NAMES.rules)[:2]
    cloud.events.disable_rule(Name=disabled)
    cloud.events.put_rule(Name=changed, EventPattern=json.dumps({"source": ["aws.ec2"]}))

    again = cloud.aws("setup", "--fragment", str(tmp_path / "aws.yaml"))

    assert again.returncode == 0, again.stderr
    changes = {part: what for part, what in reported(again).items() if what != "already exists"}
    assert changes == {f"EventBridge rule {disabled} ({NAMES.rules[disabled]})": "updated",
                       f"EventBridge rule {changed} ({NAMES.rules[changed]})": "updated"}
    for rule in (disabled, changed):
        answer = cloud.events.describe_rule(Name=rule)
        assert answer["State"] == "ENABLED"
        assert json.loads(answer["EventPattern"]) == aws_names.event_pattern(NAMES.rules[rule])


def test_teardown_removes_everything_and_a_second_teardown_finds_nothing(cloud, tmp_path):
    empty = cloud.inventory()
    assert cloud.aws("setup", "--fragment", str(tmp_path / "aws.yaml")).returncode == 0
    assert cloud.inventory() != empty

    first = cloud.aws("teardown")
    assert first.returncode == 0, first.stderr
    assert set(reported(first).values()) == {"removed"} and len(reported(first)) == PARTS
    assert cloud.inventory() == empty

    second = cloud.aws("teardown")
    assert second.returncode == 0, second.stderr
    assert set(reported(second).values()) == {"was not there"} and len(reported(second)) == PARTS


def test_teardown_removes_what_is_left_of_a_partial_setup(cloud):
    # A queue and one rule with its target, made by hand the way setup names them.
    queue_url = cloud.sqs.create_queue(QueueName=NAMES.queue)["QueueUrl"]
    queue_arn = cloud.sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    rule = next(iter(NAMES.rules))
    cloud.events.put_rule(Name=rule, EventPattern=json.dumps(aws_names.event_pattern(INTERRUPTION_WARNING)))
    cloud.events.put_targets(Rule=rule, Targets=[{"Id": aws_names.TARGET_ID, "Arn": queue_arn}])

    done = cloud.aws("teardown")

    assert done.returncode == 0, done.stderr
    removed = {part for part, what in reported(done).items() if what == "removed"}
    assert removed == {f"SQS queue {NAMES.queue}", f"EventBridge rule {rule} ({INTERRUPTION_WARNING})",
                       f"target of {rule}: the queue"}
    assert cloud.inventory() == NOTHING


# --- bad input -------------------------------------------------------------------------------

def moto_enforces_iam(endpoint: str, on: bool) -> None:
    """Moto's switch for checking every request against IAM (off: every request allowed)."""
    request = urllib.request.Request(f"{endpoint}/moto-api/reset-auth", data=b"0" if on else b"inf", method="POST",
                                     headers={"Content-Type": "text/plain"})
    urllib.request.urlopen(request, timeout=10).read()


def user_without(cloud: Cloud, denied) -> dict:
    """The environment of an IAM user who may do everything setup does but `denied`."""
    cloud.iam.create_user(UserName="setup-user")
    cloud.iam.put_user_policy(UserName="setup-user", PolicyName="almost-everything", PolicyDocument=json.dumps({
        "Version": "2012-10-17", "Statement": [
            {"Effect": "Allow", "Action": ["sqs:*", "events:*", "iam:*", "ec2:*"], "Resource": "*"},
            {"Effect": "Deny", "Action": denied, "Resource": "*"}]}))
    key = cloud.iam.create_access_key(UserName="setup-user")["AccessKey"]
    return {**os.environ, "AWS_ACCESS_KEY_ID": key["AccessKeyId"], "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"]}


@pytest.mark.parametrize("denied, created_before_it", [
    ("sqs:CreateQueue", 0),
    ("events:PutTargets", 3),  # the queue, its policy, the first rule
    ("iam:AddRoleToInstanceProfile", PARTS - 3),
    ("ec2:AuthorizeSecurityGroupIngress", PARTS - 1),  # everything but the group's rule: the group too
])
def test_a_missing_permission_is_named_and_nothing_this_run_made_is_left(cloud, tmp_path, denied, created_before_it):
    env = user_without(cloud, denied)
    empty = cloud.inventory()
    moto_enforces_iam(cloud.endpoint, True)
    try:
        done = cloud.aws("setup", "--fragment", str(tmp_path / "aws.yaml"), env=env)
    finally:
        moto_enforces_iam(cloud.endpoint, False)

    sentence = one_sentence(done)
    assert sentence.startswith(f"transientvod: AWS denied {denied} to these credentials; grant that permission "
                               "to your user or role; "), sentence
    if created_before_it:
        assert sentence.endswith(f"; the {created_before_it} parts this run created were removed again."), sentence
    else:
        assert sentence.endswith("; this run created nothing."), sentence
    assert list(reported(done).values()) == ["created"] * created_before_it
    assert cloud.inventory() == empty
    assert not (tmp_path / "aws.yaml").exists()


def test_a_rollback_that_fails_too_names_what_remains_and_the_command_that_removes_it(cloud, tmp_path):
    # Denied the last step, and denied deleting the instance profile the rollback must remove.
    env = user_without(cloud, ["iam:AddRoleToInstanceProfile", "iam:DeleteInstanceProfile"])
    moto_enforces_iam(cloud.endpoint, True)
    try:
        done = cloud.aws("setup", env=env, cwd=tmp_path)
    finally:
        moto_enforces_iam(cloud.endpoint, False)

    sentence = one_sentence(done)
    assert sentence.startswith("transientvod: AWS denied iam:AddRoleToInstanceProfile"), sentence
    assert (f"removing what this run created failed at instance profile {NAMES.instance_profile} (AWS denied "
            f"iam:DeleteInstanceProfile") in sentence
    # The rest of the rollback went on: only the profile remains.
    assert sentence.endswith(f"so instance profile {NAMES.instance_profile} remains: run `transientvod aws "
                             f"teardown --job-tag {JOB} --region {REGION}` once that works."), sentence
    left = cloud.inventory()
    assert left["profiles"] == [(NAMES.instance_profile, ())]
    assert left["queues"] == left["rules"] == left["roles"] == []
    # And that command does remove it all.
    assert cloud.aws("teardown").returncode == 0
    assert cloud.inventory() == NOTHING


def test_a_rollback_leaves_what_existed_before_the_run(cloud, tmp_path):
    # The queue is there from an earlier run; this one is denied at the instance profile.
    queue_url = cloud.sqs.create_queue(QueueName=NAMES.queue)["QueueUrl"]
    env = user_without(cloud, "iam:CreateInstanceProfile")
    moto_enforces_iam(cloud.endpoint, True)
    try:
        done = cloud.aws("setup", env=env, cwd=tmp_path)
    finally:
        moto_enforces_iam(cloud.endpoint, False)

    assert "AWS denied iam:CreateInstanceProfile" in one_sentence(done)
    assert reported(done)[f"SQS queue {NAMES.queue}"] == "already exists"
    left = cloud.inventory()
    assert left["queues"] == [queue_url]
    assert "Policy" not in cloud.sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["Policy"]).get(
        "Attributes", {})  # the policy this run set is gone with the rest
    assert left["rules"] == [] and left["roles"] == [] and left["profiles"] == []


@pytest.mark.parametrize("interrupted_at", [0, 5, PARTS - 1])
def test_ctrl_c_removes_what_the_run_made_including_the_part_aws_had_just_made(cloud, interrupted_at):
    """SIGINT arrives right after AWS answered a create call, before setup counted the part:
    the worst moment. Python's own SIGINT handler turns it into KeyboardInterrupt."""
    import dataclasses

    from transientvod.spot.provisioning.aws_setup import AwsSetup
    from transientvod.spot.providers.provider import ProviderError

    setup = AwsSetup(JOB, REGION, endpoint_url=cloud.endpoint, session=cloud.session, say=lambda line: None)
    parts = setup.parts()

    def create_then_ctrl_c(create=parts[interrupted_at].create):
        create()
        signal.raise_signal(signal.SIGINT)

    parts[interrupted_at] = dataclasses.replace(parts[interrupted_at], create=create_then_ctrl_c)
    setup.parts = lambda: parts
    with pytest.raises(ProviderError) as raised:
        setup.setup()
    sentence = str(raised.value)
    assert sentence.startswith(f"aws setup was interrupted (Ctrl-C) at {parts[interrupted_at].what}; "), sentence
    made = ("the part this run created was" if interrupted_at == 0
            else f"the {interrupted_at + 1} parts this run created were")
    assert sentence.endswith(f"{made} removed again."), sentence
    assert cloud.inventory() == NOTHING


@pytest.mark.parametrize("option, value, fragment", [
    ("--job-tag", "my job", "job tag 'my job' cannot name the queue, rules and role"),
    ("--job-tag", "x" * 31, "at most 30 characters"),
    ("--region", "US East", "region 'US East' is not an AWS region name"),
])
def test_an_invalid_tag_or_region_is_one_sentence(option, value, fragment):
    argv = {"--job-tag": JOB, "--region": REGION, option: value}
    for action in ("setup", "teardown"):
        done = subprocess.run(TRANSIENTVOD + ["aws", action, *[x for kv in argv.items() for x in kv]],
                              capture_output=True, text=True, timeout=60, cwd=REPO)
        assert fragment in one_sentence(done)


def test_names_derive_from_the_tag_alone():
    names = SetupNames.for_job("r7")
    assert names == SetupNames.for_job("r7")
    assert names.queue == "transientvod-r7-notices" and names.role == names.instance_profile == "transientvod-r7-worker"
    assert set(names.rules.values()) == {INTERRUPTION_WARNING, REBALANCE_RECOMMENDATION, CAPACITY_RESERVATION_WARNING,
                                         STATE_CHANGE}
    longest = SetupNames.for_job("x" * aws_names.JOB_TAG_MAX)
    assert max(len(n) for n in [*longest.rules, longest.role]) == 64  # EventBridge and IAM's limit


def test_no_credentials_is_one_sentence_and_makes_nothing(cloud, tmp_path):
    empty = tmp_path / "empty"
    empty.write_text("")
    env = {k: v for k, v in os.environ.items() if k not in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    env.update(AWS_SHARED_CREDENTIALS_FILE=str(empty), AWS_CONFIG_FILE=str(empty), AWS_EC2_METADATA_DISABLED="true")

    done = cloud.aws("setup", env=env, cwd=tmp_path)

    assert one_sentence(done) == ("transientvod: no AWS credentials found; configure them (aws configure, environment "
                                  "variables, or an instance role); this run created nothing.")
    assert cloud.inventory() == NOTHING
    assert list(tmp_path.iterdir()) == [empty]  # no fragment either
