"""The SQS notice queue and its policy, and the EventBridge rules that send EC2's events to it."""
from __future__ import annotations

import json

import botocore.exceptions

from transientvod.spot.provisioning import aws_names
from transientvod.spot.provisioning.aws_setup.parts import EXISTS, MESSAGE_RETENTION_SECONDS, UPDATED, or_none

class QueueParts:
    """Mixed into AwsSetup, whose __init__ makes the clients and names these methods use."""

    # SQS ----------------------------------------------------------------------------------------

    def _queue_state(self) -> str | None:
        return EXISTS if self._find_queue() else None

    def _find_queue(self) -> bool:
        if self._queue_url is None:
            answer = or_none(lambda: self._sqs.get_queue_url(QueueName=self.names.queue))
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
        answer = or_none(lambda: self._events.describe_rule(Name=rule))
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
        if or_none(lambda: self._events.describe_rule(Name=rule)) is None:
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
        targets = or_none(lambda: self._events.list_targets_by_rule(Rule=rule))
        if not targets or not any(t.get("Id") == aws_names.TARGET_ID for t in targets.get("Targets", [])):
            return False
        self._events.remove_targets(Rule=rule, Ids=[aws_names.TARGET_ID])
        return True
