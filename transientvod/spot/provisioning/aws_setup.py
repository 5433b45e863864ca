"""`transientvod aws setup` and `teardown`: the cloud side of queue mode for one job.

Setup makes, in this order: the SQS notice queue, its policy, one EventBridge rule per EC2
event kind (aws_names.RULE_KINDS) with the queue as its target, the workers' IAM role, its
inline policy, an instance profile and the role inside it, and the hosts' security group (in
--vpc-id, else the region's default VPC) with its rules: all TCP among its members, and SSH
(22) from --ssh-from when given (the launcher outside the group; inside it, the first rule
lets it in already). Each part is looked up
first: what exists is reported as "already exists" and left alone (a policy whose document
differs, or a rule that is disabled or has another pattern, is rewritten and reported
"updated"), so running setup twice makes nothing new.

A call that fails (most often one the credentials may not make) ends setup with one
sentence naming the call's permission, after the parts *this run* created are deleted again,
newest first: nothing half-made is left behind, and what existed before the run stays (a
policy this run rewrote keeps its new document). If a deletion is refused too, the sentence
lists what remains and the teardown command that removes it.

Teardown deletes the same parts in the reverse order (a rule's target before the rule, the
role out of its profile before either is deleted) and reports each one that was already
gone, so it too can run twice.
"""
from __future__ import annotations

import contextlib
import json
import logging
from dataclasses import dataclass
from typing import Callable

import botocore.exceptions

from transientvod.aws_clients import aws_client, aws_error_sentence, client_error_codes
from transientvod.spot.providers.aws import MISSING_QUEUE_CODES
from transientvod.spot.providers.provider import ProviderError
from transientvod.spot.provisioning import aws_names
from transientvod.spot.provisioning.aws_names import SetupNames

log = logging.getLogger(__name__)

# What each service answers when the thing asked about is not there.
NOT_FOUND_CODES = MISSING_QUEUE_CODES | {"ResourceNotFoundException", "NoSuchEntity"}
# Interruption notices are worth reading for minutes, not days (the warning gives 2): a queue
# that no watcher drained keeps them this long (AWS's termination handler uses 300 s too).
MESSAGE_RETENTION_SECONDS = 300
CREATED, EXISTS, UPDATED, REMOVED, ABSENT = "created", "already exists", "updated", "removed", "was not there"


# The IAM action prefix of every operation setup and teardown call: an error names the
# permission ("iam:AddRoleToInstanceProfile"), which is the thing the user has to grant.
SERVICE_OF_OPERATION = {
    **dict.fromkeys(("GetQueueUrl", "CreateQueue", "DeleteQueue", "GetQueueAttributes", "SetQueueAttributes"), "sqs"),
    **dict.fromkeys(("DescribeRule", "PutRule", "DeleteRule", "ListTargetsByRule", "PutTargets", "RemoveTargets"),
                    "events"),
    **dict.fromkeys(("GetRole", "CreateRole", "DeleteRole", "GetRolePolicy", "PutRolePolicy", "DeleteRolePolicy",
                     "GetInstanceProfile", "CreateInstanceProfile", "DeleteInstanceProfile",
                     "AddRoleToInstanceProfile", "RemoveRoleFromInstanceProfile"), "iam"),
    **dict.fromkeys(("DescribeVpcs", "DescribeSecurityGroups", "CreateSecurityGroup", "DeleteSecurityGroup",
                     "AuthorizeSecurityGroupIngress", "RevokeSecurityGroupIngress", "CreateTags"), "ec2"),
}


@dataclass(frozen=True)
class Part:
    """One thing setup makes. `state` looks it up: None (absent), EXISTS (as setup makes it)
    or UPDATED (there, but with another document); `create` makes or rewrites it; `delete`
    removes it and says whether it was there."""
    what: str
    state: Callable[[], str | None]
    create: Callable[[], None]
    delete: Callable[[], bool]


class AwsSetup:
    """The parts of one job tag in one region, and the clients that make and remove them."""

    def __init__(self, job_tag: str, region: str, endpoint_url: str | None = None, s3_prefix: str = "",
                 session=None, say: Callable[[str], None] = print, ssh_from: str = "", vpc_id: str = ""):
        """`ssh_from`: the launcher's network (CIDR) that may reach the hosts' SSH; "" for none
        beyond the group's members. `vpc_id`: the group's VPC; "" for the region's default."""
        aws_names.check_region(region)
        self.names = SetupNames.for_job(job_tag)
        if s3_prefix:
            aws_names.parse_s3_prefix(s3_prefix)  # a bad URL is one sentence before any call
        self.ssh_from = aws_names.check_cidr(ssh_from) if ssh_from else ""
        self.region = region
        self.s3_prefix = s3_prefix
        self.say = say
        self._queue_url: str | None = None
        self._queue_arn: str | None = None
        self._vpc_id = vpc_id
        self._group_id: str | None = None
        with self._errors("creating the AWS clients"):
            self._sqs = aws_client("sqs", region, endpoint_url, session)
            self._events = aws_client("events", region, endpoint_url, session)
            self._iam = aws_client("iam", region, endpoint_url, session)
            self._ec2 = aws_client("ec2", region, endpoint_url, session)

    # --- the two commands ----------------------------------------------------------------------

    def setup(self) -> str:
        """Make what is missing; returns the queue URL. A refused call or Ctrl-C removes what
        this run made, and leaves what was there before."""
        made: list[Part] = []
        part, state = None, EXISTS  # the part in hand, and whether it was there before this run
        try:
            for part in self.parts():
                state = EXISTS  # until its lookup answers, this run has made nothing of it
                with self._errors(part.what):
                    state = part.state()
                    if state == EXISTS:
                        self.say(f"  {part.what}: {EXISTS}")
                        continue
                    part.create()
                if state is None:
                    made.append(part)
                self.say(f"  {part.what}: {CREATED if state is None else UPDATED}")
        except ProviderError as failure:
            raise ProviderError(self._rolled_back(str(failure), made)) from failure.__cause__
        except KeyboardInterrupt:
            # Ctrl-C may land after AWS made the part in hand and before it was counted: ask.
            if state is None and part not in made and self._exists_now(part):
                made.append(part)
            where = f" at {part.what}" if part is not None else ""
            raise ProviderError(self._rolled_back(f"aws setup was interrupted (Ctrl-C){where}.", made)) from None
        return self._queue_url

    @staticmethod
    def _exists_now(part: Part) -> bool:
        try:
            return part.state() is not None
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError):
            return True  # cannot tell: try to delete it; if that fails too, the sentence names teardown

    def teardown(self) -> None:
        for part in reversed(self.parts()):
            with self._errors(part.what):
                gone = part.delete()
            self.say(f"  {part.what}: {REMOVED if gone else ABSENT}")

    def _rolled_back(self, sentence: str, made: list[Part]) -> str:
        """The failure's sentence, extended with what became of the parts this run made. A part
        that cannot be deleted does not stop the rest: each one removed is one less to remain."""
        left, first_failure = [], None
        for part in reversed(made):
            try:
                part.delete()
                log.info("rolled back %s", part.what)
            except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as e:
                left.append(part.what)
                first_failure = first_failure or (part.what, self._sentence(e, part.what).rstrip("."))
        if left:
            return (f"{sentence.rstrip('.')}; removing what this run created failed at {first_failure[0]} "
                    f"({first_failure[1]}), so {', '.join(left)} remain{'s' if len(left) == 1 else ''}: run "
                    f"`transientvod aws teardown --job-tag {self.names.job_tag} --region {self.region}` "
                    "once that works.")
        if not made:
            return f"{sentence.rstrip('.')}; this run created nothing."
        parts = "the part" if len(made) == 1 else f"the {len(made)} parts"
        return f"{sentence.rstrip('.')}; {parts} this run created {'was' if len(made) == 1 else 'were'} removed again."

    # --- the parts, in the order setup makes them ----------------------------------------------

    def parts(self) -> list[Part]:
        n = self.names
        parts = [
            Part(f"SQS queue {n.queue}", self._queue_state, self._create_queue, self._delete_queue),
            Part(f"queue policy of {n.queue} (EventBridge may send from the job's rules)",
                 self._queue_policy_state, self._put_queue_policy, self._delete_queue_policy),
        ]
        for rule, kind in n.rules.items():
            parts += [
                Part(f"EventBridge rule {rule} ({kind})", lambda r=rule, k=kind: self._rule_state(r, k),
                     lambda r=rule, k=kind: self._put_rule(r, k), lambda r=rule: self._delete_rule(r)),
                Part(f"target of {rule}: the queue", lambda r=rule: self._target_state(r),
                     lambda r=rule: self._put_target(r), lambda r=rule: self._remove_target(r)),
            ]
        parts += [
            Part(f"IAM role {n.role}", self._role_state, self._create_role, self._delete_role),
            Part(f"inline policy {aws_names.ROLE_POLICY_NAME} of {n.role}",
                 self._role_policy_state, self._put_role_policy, self._delete_role_policy),
            Part(f"instance profile {n.instance_profile}", self._profile_state,
                 self._create_profile, self._delete_profile),
            Part(f"role {n.role} in instance profile {n.instance_profile}",
                 self._profile_role_state, self._add_role_to_profile, self._remove_role_from_profile),
            Part(f"security group {n.security_group}", self._group_state, self._create_group, self._delete_group),
            Part(f"rule of {n.security_group}: all TCP among its members",
                 lambda: self._rule_in_group(self._members_rule), lambda: self._authorize(self._members_rule),
                 lambda: self._revoke(self._members_rule)),
        ]
        if self.ssh_from:
            parts.append(Part(f"rule of {n.security_group}: SSH from {self.ssh_from}",
                              lambda: self._rule_in_group(self._ssh_rule), lambda: self._authorize(self._ssh_rule),
                              lambda: self._revoke(self._ssh_rule)))
        return parts

    # SQS ----------------------------------------------------------------------------------------

    def _queue_state(self) -> str | None:
        return EXISTS if self._find_queue() else None

    def _find_queue(self) -> bool:
        if self._queue_url is None:
            answer = _or_none(lambda: self._sqs.get_queue_url(QueueName=self.names.queue))
            if answer is None:
                return False
            self._queue_url = answer["QueueUrl"]
        return True

    def _create_queue(self) -> None:
        self._queue_url = self._sqs.create_queue(
            QueueName=self.names.queue, tags={aws_names.TAG_KEY: self.names.job_tag},
            Attributes={"MessageRetentionPeriod": str(MESSAGE_RETENTION_SECONDS)})["QueueUrl"]

    def _delete_queue(self) -> bool:
        if not self._find_queue():
            return False
        self._sqs.delete_queue(QueueUrl=self._queue_url)
        self._queue_url = self._queue_arn = None
        return True

    def queue_arn(self) -> str:
        if self._queue_arn is None:
            self._queue_arn = self._sqs.get_queue_attributes(
                QueueUrl=self._queue_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        return self._queue_arn

    def _queue_policy_state(self) -> str | None:
        policy = self._sqs.get_queue_attributes(QueueUrl=self._queue_url, AttributeNames=["Policy"])
        text = policy.get("Attributes", {}).get("Policy")
        if not text:
            return None
        return EXISTS if json.loads(text) == self._wanted_queue_policy() else UPDATED

    def _wanted_queue_policy(self) -> dict:
        return aws_names.queue_policy(self.queue_arn(), self.names.rules)

    def _put_queue_policy(self) -> None:
        self._sqs.set_queue_attributes(QueueUrl=self._queue_url,
                                       Attributes={"Policy": json.dumps(self._wanted_queue_policy())})

    def _delete_queue_policy(self) -> bool:
        if not self._find_queue():
            return False  # gone with its queue
        attributes = self._sqs.get_queue_attributes(QueueUrl=self._queue_url, AttributeNames=["Policy"])
        if not attributes.get("Attributes", {}).get("Policy"):
            return False
        self._sqs.set_queue_attributes(QueueUrl=self._queue_url, Attributes={"Policy": ""})
        return True

    # EventBridge ----------------------------------------------------------------------------

    def _rule_state(self, rule: str, kind: str) -> str | None:
        """A rule someone disabled, or one with another pattern, forwards the wrong events or
        none: setup puts it back as it makes it."""
        answer = _or_none(lambda: self._events.describe_rule(Name=rule))
        if answer is None:
            return None
        pattern = json.loads(answer.get("EventPattern") or "{}")
        same = pattern == aws_names.event_pattern(kind) and answer.get("State") == "ENABLED"
        return EXISTS if same else UPDATED

    def _put_rule(self, rule: str, kind: str) -> None:
        self._events.put_rule(Name=rule, EventPattern=json.dumps(aws_names.event_pattern(kind)), State="ENABLED",
                              Description=f"transientvod job {self.names.job_tag}: {kind} to {self.names.queue}",
                              Tags=[{"Key": aws_names.TAG_KEY, "Value": self.names.job_tag}])

    def _delete_rule(self, rule: str) -> bool:
        if _or_none(lambda: self._events.describe_rule(Name=rule)) is None:
            return False
        self._events.delete_rule(Name=rule)
        return True

    def _target_state(self, rule: str) -> str | None:
        targets = self._events.list_targets_by_rule(Rule=rule).get("Targets", [])
        ours = [t for t in targets if t.get("Id") == aws_names.TARGET_ID]
        if not ours:
            return None
        return EXISTS if ours[0].get("Arn") == self.queue_arn() else UPDATED

    def _put_target(self, rule: str) -> None:
        answer = self._events.put_targets(Rule=rule, Targets=[{"Id": aws_names.TARGET_ID, "Arn": self.queue_arn()}])
        # PutTargets answers 200 even when a target was refused; the refusal is in the entries.
        for failed in answer.get("FailedEntries", []):
            raise botocore.exceptions.ClientError(
                {"Error": {"Code": failed.get("ErrorCode"), "Message": failed.get("ErrorMessage")}}, "PutTargets")

    def _remove_target(self, rule: str) -> bool:
        targets = _or_none(lambda: self._events.list_targets_by_rule(Rule=rule))
        if not targets or not any(t.get("Id") == aws_names.TARGET_ID for t in targets.get("Targets", [])):
            return False
        self._events.remove_targets(Rule=rule, Ids=[aws_names.TARGET_ID])
        return True

    # IAM ----------------------------------------------------------------------------------------

    def _role_state(self) -> str | None:
        return EXISTS if _or_none(lambda: self._iam.get_role(RoleName=self.names.role)) else None

    def _create_role(self) -> None:
        self._iam.create_role(RoleName=self.names.role, AssumeRolePolicyDocument=json.dumps(aws_names.assume_role_policy()),
                              Description=f"transientvod job {self.names.job_tag}: its workers' permissions",
                              Tags=[{"Key": aws_names.TAG_KEY, "Value": self.names.job_tag}])

    def _delete_role(self) -> bool:
        if _or_none(lambda: self._iam.get_role(RoleName=self.names.role)) is None:
            return False
        self._iam.delete_role(RoleName=self.names.role)
        return True

    def _role_policy_state(self) -> str | None:
        answer = _or_none(lambda: self._iam.get_role_policy(RoleName=self.names.role,
                                                            PolicyName=aws_names.ROLE_POLICY_NAME))
        if answer is None:
            return None
        document = answer["PolicyDocument"]  # boto3 hands it back decoded; a string from some servers
        document = json.loads(document) if isinstance(document, str) else document
        return EXISTS if document == self._wanted_worker_policy() else UPDATED

    def _wanted_worker_policy(self) -> dict:
        return aws_names.worker_policy(self.queue_arn(), self.s3_prefix)

    def _put_role_policy(self) -> None:
        self._iam.put_role_policy(RoleName=self.names.role, PolicyName=aws_names.ROLE_POLICY_NAME,
                                  PolicyDocument=json.dumps(self._wanted_worker_policy()))

    def _delete_role_policy(self) -> bool:
        try:
            self._iam.delete_role_policy(RoleName=self.names.role, PolicyName=aws_names.ROLE_POLICY_NAME)
        except botocore.exceptions.ClientError as e:
            if client_error_codes(e) & NOT_FOUND_CODES:
                return False
            raise
        return True

    def _profile(self) -> dict | None:
        answer = _or_none(lambda: self._iam.get_instance_profile(InstanceProfileName=self.names.instance_profile))
        return answer["InstanceProfile"] if answer else None

    def _profile_state(self) -> str | None:
        return EXISTS if self._profile() else None

    def _create_profile(self) -> None:
        self._iam.create_instance_profile(InstanceProfileName=self.names.instance_profile,
                                          Tags=[{"Key": aws_names.TAG_KEY, "Value": self.names.job_tag}])

    def _delete_profile(self) -> bool:
        if self._profile() is None:
            return False
        self._iam.delete_instance_profile(InstanceProfileName=self.names.instance_profile)
        return True

    def _profile_role_state(self) -> str | None:
        profile = self._profile() or {}
        return EXISTS if any(r.get("RoleName") == self.names.role for r in profile.get("Roles", [])) else None

    def _add_role_to_profile(self) -> None:
        self._iam.add_role_to_instance_profile(InstanceProfileName=self.names.instance_profile,
                                               RoleName=self.names.role)

    def _remove_role_from_profile(self) -> bool:
        if self._profile_role_state() is None:
            return False
        self._iam.remove_role_from_instance_profile(InstanceProfileName=self.names.instance_profile,
                                                    RoleName=self.names.role)
        return True

    # EC2: the hosts' security group ------------------------------------------------------------

    def _find_group(self) -> dict | None:
        """The job's group: its name and the job's tag (in the VPC asked for, when one was);
        teardown, given no VPC, finds it in any."""
        filters = [{"Name": "group-name", "Values": [self.names.security_group]},
                   {"Name": f"tag:{aws_names.TAG_KEY}", "Values": [self.names.job_tag]}]
        if self._vpc_id:
            filters.append({"Name": "vpc-id", "Values": [self._vpc_id]})
        groups = self._ec2.describe_security_groups(Filters=filters).get("SecurityGroups", [])
        if not groups:
            return None
        self._group_id = groups[0]["GroupId"]
        return groups[0]

    def _group_state(self) -> str | None:
        return EXISTS if self._find_group() else None

    def _default_vpc(self) -> str:
        vpcs = self._ec2.describe_vpcs(Filters=[{"Name": "isDefault", "Values": ["true"]}]).get("Vpcs", [])
        if not vpcs:
            raise ProviderError(f"region {self.region} has no default VPC for the hosts' security group; give "
                                "--vpc-id (the VPC of the fleet's --subnet-id).")
        return vpcs[0]["VpcId"]

    def _create_group(self) -> None:
        self._vpc_id = self._vpc_id or self._default_vpc()
        self._group_id = self._ec2.create_security_group(
            GroupName=self.names.security_group, VpcId=self._vpc_id,
            Description=f"transientvod job {self.names.job_tag}: its hosts reach each other, the launcher reaches ssh",
            TagSpecifications=[{"ResourceType": "security-group",
                                "Tags": [{"Key": aws_names.TAG_KEY, "Value": self.names.job_tag}]}])["GroupId"]

    def _delete_group(self) -> bool:
        if self._find_group() is None:
            return False
        self._ec2.delete_security_group(GroupId=self._group_id)
        self._group_id = None
        return True

    def _members_rule(self) -> dict:
        return aws_names.members_rule(self._group_id)

    def _ssh_rule(self) -> dict:
        return aws_names.ssh_rule(self.ssh_from)

    def _rule_in_group(self, wanted: Callable[[], dict]) -> str | None:
        group = self._find_group()
        return EXISTS if group and _has_permission(group.get("IpPermissions", []), wanted()) else None

    def _authorize(self, wanted: Callable[[], dict]) -> None:
        self._ec2.authorize_security_group_ingress(GroupId=self._group_id, IpPermissions=[wanted()])

    def _revoke(self, wanted: Callable[[], dict]) -> bool:
        if self._rule_in_group(wanted) is None:
            return False  # gone with its group, or never there
        self._ec2.revoke_security_group_ingress(GroupId=self._group_id, IpPermissions=[wanted()])
        return True

    # --- errors --------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _errors(self, what: str):
        """botocore's exceptions while working on `what` become one ProviderError sentence; an
        answer from AWS names the permission of the call it answered."""
        try:
            yield
        except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as e:
            raise ProviderError(self._sentence(e, what)) from e

    def _sentence(self, error: Exception, what: str) -> str:
        return aws_error_sentence(error, permission(error, what), self.region, "your")


def permission(error: Exception, what: str) -> str:
    """The IAM action of the call that AWS answered with `error` ("sqs:CreateQueue"); for an
    error with no answer (no network, no credentials), the part being worked on."""
    operation = getattr(error, "operation_name", "") if isinstance(error, botocore.exceptions.ClientError) else ""
    service = SERVICE_OF_OPERATION.get(operation)
    return f"{service}:{operation}" if service else f"the calls for {what}"


def _has_permission(permissions: list[dict], wanted: dict) -> bool:
    """Whether a group's ingress holds `wanted`: same protocol and ports, and each of its
    sources (a group, a CIDR) among that permission's, whatever descriptions they carry."""
    def sources(permission: dict) -> set:
        return ({("group", p["GroupId"]) for p in permission.get("UserIdGroupPairs", [])}
                | {("cidr", r["CidrIp"]) for r in permission.get("IpRanges", [])}
                | {("cidr", r["CidrIpv6"]) for r in permission.get("Ipv6Ranges", [])})
    for permission in permissions:
        same_ports = (permission.get("IpProtocol"), permission.get("FromPort"), permission.get("ToPort")) == (
            wanted["IpProtocol"], wanted["FromPort"], wanted["ToPort"])
        if same_ports and sources(wanted) <= sources(permission):
            return True
    return False


def setup_security_group(job_tag: str, region: str | None, endpoint_url: str | None = None,
                         session=None) -> str | None:
    """The id of the security group `aws setup` made for `job_tag`, if it exists (one
    ec2:DescribeSecurityGroups call); a refused call is one sentence naming that permission."""
    names = SetupNames.for_job(job_tag)
    filters = [{"Name": "group-name", "Values": [names.security_group]},
               {"Name": f"tag:{aws_names.TAG_KEY}", "Values": [job_tag]}]
    try:
        ec2 = aws_client("ec2", region, endpoint_url, session)
        groups = ec2.describe_security_groups(Filters=filters).get("SecurityGroups", [])
    except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as e:
        raise ProviderError(aws_error_sentence(e, "ec2:DescribeSecurityGroups", region or "the default region",
                                               "your")) from e
    return groups[0]["GroupId"] if groups else None


def _or_none(call: Callable[[], dict]) -> dict | None:
    """The answer of a lookup, or None when AWS says the thing is not there."""
    try:
        return call()
    except botocore.exceptions.ClientError as e:
        if client_error_codes(e) & NOT_FOUND_CODES:
            return None
        raise


def setup_instance_profile(job_tag: str, region: str | None, endpoint_url: str | None = None,
                           session=None) -> str | None:
    """The name of the instance profile `aws setup` made for `job_tag`, if it exists (one
    iam:GetInstanceProfile call); a refused call is one sentence naming that permission."""
    name = SetupNames.for_job(job_tag).instance_profile
    try:
        iam = aws_client("iam", region, endpoint_url, session)
        return name if _or_none(lambda: iam.get_instance_profile(InstanceProfileName=name)) else None
    except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as e:
        raise ProviderError(aws_error_sentence(e, "iam:GetInstanceProfile", region or "the default region",
                                               "your")) from e


def config_fragment(job_tag: str, region: str, queue_url: str, endpoint_url: str | None = None) -> str:
    """The `spot:` section queue mode needs, in the config schema (config/schema.py SpotConfig),
    as YAML a job's config can take as it is."""
    lines = [f"# written by `transientvod aws setup --job-tag {job_tag} --region {region}`;",
             "# copy the spot: section into your job's config, or pass this file as --config.",
             "spot:",
             "  provider: aws",
             f"  job_tag: {json.dumps(job_tag)}",
             f"  region: {json.dumps(region)}",
             f"  queue_url: {json.dumps(queue_url)}"]
    if endpoint_url:
        lines.append(f"  endpoint_url: {json.dumps(endpoint_url)}")
    return "\n".join(lines) + "\n"
