"""The workers' IAM role, its inline policy, and the instance profile that carries it."""
from __future__ import annotations

import json

import botocore.exceptions

from transientvod.aws_clients import client_error_codes
from transientvod.spot.provisioning import aws_names
from transientvod.spot.provisioning.aws_setup.parts import EXISTS, NOT_FOUND_CODES, UPDATED, or_none

class RoleParts:
    """Mixed into AwsSetup, whose __init__ makes the clients and names these methods use."""

    # IAM ----------------------------------------------------------------------------------------

    def _role_state(self) -> str | None:
        return EXISTS if or_none(lambda: self._iam.get_role(RoleName=self.names.role)) else None

    def _create_role(self) -> None:
        self._iam.create_role(RoleName=self.names.role, AssumeRolePolicyDocument=json.dumps(aws_names.assume_role_policy()),
                              Description=f"transientvod job {self.names.job_tag}: its workers' permissions",
                              Tags=[{"Key": aws_names.TAG_KEY, "Value": self.names.job_tag}])

    def _delete_role(self) -> bool:
        if or_none(lambda: self._iam.get_role(RoleName=self.names.role)) is None:
            return False
        self._iam.delete_role(RoleName=self.names.role)
        return True

    def _role_policy_state(self) -> str | None:
        answer = or_none(lambda: self._iam.get_role_policy(RoleName=self.names.role,
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
        answer = or_none(lambda: self._iam.get_instance_profile(InstanceProfileName=self.names.instance_profile))
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
