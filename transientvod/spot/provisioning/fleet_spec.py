"""What a fleet is asked to keep (`FleetSpec`, checked when made) and what each of its passes
did (`FleetAction`). The fleet itself is fleet.py."""
from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class FleetSpec:
    job_tag: str
    instance_types: list[str]  # tried in order when launching (capacity may lack one type)
    target: int  # instances to keep alive
    image_id: str
    hourly_price: dict[str, float]  # $/hour per instance type; every type the fleet meets needs one
    budget: float | None = None  # dollars for the whole fleet's life; None = no limit
    subnet_id: str | None = None
    key_name: str | None = None
    security_group_ids: list[str] = field(default_factory=list)
    user_data: str = ""
    instance_profile: str = ""  # IAM instance profile name: the workers' own AWS credentials
    tag_key: str = "transientvod:job"

    def __post_init__(self):
        if not self.job_tag:
            raise ValueError("job_tag is empty; set it to the value of the tag your job's instances carry.")
        if not isinstance(self.target, int) or self.target < 0:
            raise ValueError(f"target is {self.target!r}; it must be a whole number of instances, 0 or more.")
        if not self.instance_types:
            raise ValueError("instance_types is empty; list at least one EC2 instance type to launch.")
        if not self.image_id:
            raise ValueError("image_id is empty; set it to the AMI the fleet's instances boot.")
        for instance_type in self.instance_types:
            if instance_type not in self.hourly_price:
                raise ValueError(f"instance type {instance_type!r} has no price in hourly_price; "
                                 "add its $/hour so the fleet can keep to the budget.")
        for instance_type, price in self.hourly_price.items():
            if not isinstance(price, (int, float)) or not math.isfinite(price) or price <= 0:
                raise ValueError(f"the price of {instance_type!r} is {price!r}; it must be a positive "
                                 "number of dollars per hour.")
        if self.budget is not None and (not math.isfinite(self.budget) or self.budget <= 0):
            raise ValueError(f"budget is {self.budget!r}; it must be a positive number of dollars, "
                             "or None for no limit.")


@dataclass(frozen=True)
class FleetAction:
    """What one reconcile step did (or, in a dry run, would do)."""

    kind: str  # "launch" | "replace" | "terminate" | "hold" (the budget rule stopped a launch)
    instance_type: str | None
    instance_id: str | None  # None for a hold, and for a launch a dry run only imagines
    reason: str
