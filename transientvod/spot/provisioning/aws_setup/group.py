"""The hosts' security group and its ingress rules, and the lookup `fleet` uses to find it."""
from __future__ import annotations

from typing import Callable

import botocore.exceptions

from transientvod.aws_clients import aws_client, aws_error_sentence
from transientvod.spot.providers.provider import ProviderError
from transientvod.spot.provisioning import aws_names
from transientvod.spot.provisioning.aws_names import SetupNames
from transientvod.spot.provisioning.aws_setup.parts import EXISTS

class SecurityGroupParts:
    """Mixed into AwsSetup, whose __init__ makes the clients and names these methods use."""

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
        return EXISTS if group and has_permission(group.get("IpPermissions", []), wanted()) else None

    def _authorize(self, wanted: Callable[[], dict]) -> None:
        self._ec2.authorize_security_group_ingress(GroupId=self._group_id, IpPermissions=[wanted()])

    def _revoke(self, wanted: Callable[[], dict]) -> bool:
        if self._rule_in_group(wanted) is None:
            return False  # gone with its group, or never there
        self._ec2.revoke_security_group_ingress(GroupId=self._group_id, IpPermissions=[wanted()])
        return True


def has_permission(permissions: list[dict], wanted: dict) -> bool:
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
