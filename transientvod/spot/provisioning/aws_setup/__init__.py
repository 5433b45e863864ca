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
from typing import Callable

import botocore.exceptions

from transientvod.aws_clients import aws_client, aws_error_sentence
from transientvod.spot.providers.provider import ProviderError
from transientvod.spot.provisioning import aws_names
from transientvod.spot.provisioning.aws_names import SetupNames
from transientvod.spot.provisioning.aws_setup.group import SecurityGroupParts, setup_security_group
from transientvod.spot.provisioning.aws_setup.parts import ABSENT, CREATED, EXISTS, REMOVED, UPDATED, Part, or_none
from transientvod.spot.provisioning.aws_setup.queue import QueueParts
from transientvod.spot.provisioning.aws_setup.role import RoleParts

__all__ = ["AwsSetup", "config_fragment", "permission", "setup_instance_profile", "setup_security_group"]

log = logging.getLogger(__name__)


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


class AwsSetup(QueueParts, RoleParts, SecurityGroupParts):
    """The parts of one job tag in one region, and the clients that make and remove them. Each
    service's lookups and calls are in its own module: queue.py (SQS, EventBridge), role.py
    (IAM), group.py (EC2's security group)."""

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


def setup_instance_profile(job_tag: str, region: str | None, endpoint_url: str | None = None,
                           session=None) -> str | None:
    """The name of the instance profile `aws setup` made for `job_tag`, if it exists (one
    iam:GetInstanceProfile call); a refused call is one sentence naming that permission."""
    name = SetupNames.for_job(job_tag).instance_profile
    try:
        iam = aws_client("iam", region, endpoint_url, session)
        return name if or_none(lambda: iam.get_instance_profile(InstanceProfileName=name)) else None
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
