"""How the fleet launches one server: the first instance type that fits the budget and that EC2
has capacity for, one-time spot, tagged with the job and its first heartbeat, after the image
was checked once; a dry run imagines the instance instead. Mixed into Fleet (fleet.py), whose
__init__ makes the client and the records these methods use."""
from __future__ import annotations

import logging
import uuid
from datetime import datetime, timezone

import botocore.exceptions

from transientvod.billing.budget import launch_verdict
from transientvod.spot.providers.provider import ProviderError
from transientvod.spot.provisioning.fleet_spec import FleetAction
from transientvod.spot.provisioning.watchdog import HEARTBEAT_TAG

log = logging.getLogger(__name__)

# Answers of RunInstances that say "not this type, not now": the fleet tries the next type.
CAPACITY_ERROR_CODES = frozenset({"InsufficientInstanceCapacity", "SpotMaxPriceTooLow", "Unsupported"})
MISSING_IMAGE_CODES = frozenset({"InvalidAMIID.NotFound", "InvalidAMIID.Malformed", "InvalidAMIID.Unavailable"})


class FleetLaunching:
    """Mixed into Fleet: reads its spec, clock, EC2 client and records, and the bill's `_spent`."""

    def _launch_one(self, instances: list[dict], now: float, replaced: dict | None, alive: int) -> FleetAction | None:
        """Launches one instance of the first type that fits the budget and has capacity, and
        appends its record to `instances`. A hold when the budget rule stops every type; None
        when no type has capacity (the next pass tries again)."""
        spent = self._spent(instances, now)
        rate = self._committed_rate(instances)
        kind = "launch" if replaced is None else "replace"
        why = (f"brings job {self.spec.job_tag} to {alive + 1} of {self.spec.target} instances" if replaced is None
               else f"replaces {replaced['InstanceId']}, which is {replaced['State']['Name']} ({self._why_ended(replaced)})")
        held = []  # (total the horizon could reach, type, price)
        no_capacity = []
        for instance_type in self.spec.instance_types:
            price = self.spec.hourly_price[instance_type]
            verdict = launch_verdict(spent, rate, price, self.horizon_hours, self.spec.budget)
            if not verdict.allowed:
                held.append((verdict.projected_usd, instance_type, price))
                continue
            if self.dry_run:
                instances.append(self._imagined_instance(instance_type, now))
                log.info("dry run: would %s a %s spot instance: %s.", kind, instance_type, why)
                return FleetAction(kind, instance_type, None, f"dry run: {why}")
            try:
                with self._aws_errors("ec2:RunInstances", let_through=CAPACITY_ERROR_CODES):
                    instance = self._run_instance(instance_type)
            except botocore.exceptions.ClientError as e:
                code = e.response.get("Error", {}).get("Code")
                log.warning("EC2 has no %s spot capacity for job %s now (%s); trying the next type.",
                            instance_type, self.spec.job_tag, code)
                no_capacity.append(f"{instance_type}: {code}")
                continue
            instance_id = instance["InstanceId"]
            self._seen[instance_id] = instance
            self._seen_alive.add(instance_id)
            self._launched_by_fleet[instance_id] = now
            if replaced is not None:
                self._replaced.add(replaced["InstanceId"])
            instances.append(instance)
            if no_capacity:
                why += f" (no capacity for {'; '.join(no_capacity)})"
            log.info("%s %s (%s, $%.2f/h): %s.", "launched" if replaced is None else "launched replacement",
                     instance_id, instance_type, price, why)
            return FleetAction(kind, instance_type, instance_id, why)
        if held:
            projected, instance_type, price = min(held)
            reason = (f"launching a {instance_type} could bring job {self.spec.job_tag} to ${projected:.2f} within "
                      f"{self.horizon_hours:g} h (spent ${spent:.2f} + (${rate:.2f}/h running + ${price:.2f}/h) "
                      f"x {self.horizon_hours:g} h), over the budget of ${self.spec.budget:.2f}; holding at "
                      f"{alive} of {self.spec.target} instances")
            if not self._holding:
                log.warning("%s.", reason)
            self._holding = True
            return FleetAction("hold", instance_type, None, reason)
        log.warning("no instance type of job %s has spot capacity now (%s); the next pass tries again.",
                    self.spec.job_tag, "; ".join(no_capacity))
        return None

    def _run_instance(self, instance_type: str) -> dict:
        tags = [{"Key": self.spec.tag_key, "Value": self.spec.job_tag},
                {"Key": "Name", "Value": f"transientvod-{self.spec.job_tag}"},
                {"Key": HEARTBEAT_TAG, "Value": str(int(self._clock()))}]
        params = {
            "MinCount": 1, "MaxCount": 1, "InstanceType": instance_type, "ImageId": self.spec.image_id,
            "InstanceMarketOptions": {"MarketType": "spot", "SpotOptions": {
                "SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"}},
            # The watchdog's shutdown ends the bill: terminated, not stopped (a stopped
            # instance's disks bill on). It reads the heartbeat tag from the metadata service.
            "InstanceInitiatedShutdownBehavior": "terminate",
            "MetadataOptions": {"InstanceMetadataTags": "enabled"},
            "TagSpecifications": [{"ResourceType": "instance", "Tags": tags}],
            "ClientToken": uuid.uuid4().hex,
        }
        if self.spec.subnet_id:
            params["SubnetId"] = self.spec.subnet_id
        if self.spec.key_name:
            params["KeyName"] = self.spec.key_name
        if self.spec.security_group_ids:
            params["SecurityGroupIds"] = list(self.spec.security_group_ids)
        if self.spec.user_data:
            params["UserData"] = self.spec.user_data  # boto3 encodes it in base64
        if self.spec.instance_profile:
            params["IamInstanceProfile"] = {"Name": self.spec.instance_profile}
        return self._ec2.run_instances(**params)["Instances"][0]

    @staticmethod
    def _imagined_instance(instance_type: str, now: float) -> dict:
        """The record a dry run counts for a launch it only imagines, so the budget rule of the
        same pass sees it."""
        return {"InstanceId": f"dry-run-{uuid.uuid4().hex[:8]}", "InstanceType": instance_type,
                "State": {"Code": 0, "Name": "pending"},
                "LaunchTime": datetime.fromtimestamp(now, timezone.utc)}

    # --- errors --------------------------------------------------------------------------------

    def _missing_image_error(self) -> ProviderError:
        return ProviderError(f"the image {self.spec.image_id} does not exist in region {self.region}; "
                             "fix image_id or the region.")

    def _check_image(self) -> None:
        """Fails on an image id that does not exist, before anything is launched (a dry run
        included; and EC2 emulators that accept any image id at launch still fail here)."""
        if self._image_checked:
            return
        with self._aws_errors("ec2:DescribeImages"):
            images = self._ec2.describe_images(ImageIds=[self.spec.image_id]).get("Images", [])
        if not images:
            raise self._missing_image_error()
        self._image_checked = True
