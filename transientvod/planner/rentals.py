"""What GPU users rent today, priced: AWS instance types and GCE machine types for the planner.

    rentals, notes = rent(["g5.xlarge", "p4d.24xlarge"], region="us-east-1")
    rentals["g5.xlarge"].gpus, rentals["g5.xlarge"].spot_usd_per_hour   # 1, from EC2's spot history
    for line in notes: print(line)                                       # each price, its source and age

- AWS: the GPUs per instance from `DescribeInstanceTypes` (GpuInfo); the spot price from
  `DescribeSpotPriceHistory` (Linux/UNIX) over the last `days`, per availability zone: the
  latest price of each zone, and the cheapest zone's is the one planned with (the zones are
  listed); on-demand from the built-in us-east-1 table below (other regions: a price table,
  `--prices CSV` with instance_type,on_demand_usd_per_hour, billing.prices' format).
- GCE: the built-in table below (GCE has no price-history API).
- Every price carries its date; one older than STALE_DAYS gets a warning naming its age.
  The built-in tables are dated, so they are always flagged once they are a week old: read
  them as the order of magnitude, and check the console or pass a price table.

Only instance families GPU users launch today are known (`KNOWN`); anything else is one
sentence naming them. The planner's unit stays one server: one instance or machine, all its
GPUs together (a speed given with --speed is one instance's steps/s). Never imports torch or
horovod.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass
from datetime import datetime, timezone

from transientvod.planner.study_data import GPU_TYPES, PlanError

STALE_DAYS = 7  # a price older than this gets a warning naming its age
DAY_S = 86400.0

AWS_FAMILIES = {"g4dn": "T4", "g5": "A10G", "g6": "L4", "p3": "V100", "p4d": "A100", "p5": "H100"}
# AWS on-demand list prices, Linux, us-east-1, $/hour, as listed on the date below (P4d/P5
# were cut in 2025: the age warning says to check). Other regions: --prices CSV.
AWS_ON_DEMAND_REGION = "us-east-1"
AWS_ON_DEMAND_DATE = "2024-06-01"
AWS_ON_DEMAND_USD_PER_HOUR = {
    "g4dn.xlarge": 0.526, "g4dn.2xlarge": 0.752, "g4dn.4xlarge": 1.204, "g4dn.8xlarge": 2.176,
    "g4dn.12xlarge": 3.912, "g4dn.16xlarge": 4.352, "g4dn.metal": 7.824,
    "g5.xlarge": 1.006, "g5.2xlarge": 1.212, "g5.4xlarge": 1.624, "g5.8xlarge": 2.448, "g5.12xlarge": 5.672,
    "g5.16xlarge": 4.096, "g5.24xlarge": 8.144, "g5.48xlarge": 16.288,
    "g6.xlarge": 0.8048, "g6.2xlarge": 0.9776, "g6.4xlarge": 1.3232, "g6.8xlarge": 2.0144,
    "g6.12xlarge": 4.6016, "g6.16xlarge": 3.3968, "g6.24xlarge": 6.6752, "g6.48xlarge": 13.3504,
    "p3.2xlarge": 3.06, "p3.8xlarge": 12.24, "p3.16xlarge": 24.48,
    "p4d.24xlarge": 32.7726,
    "p5.48xlarge": 98.32,
}
# GCE machine types with L4, A100 and H100 GPUs, us-central1, $/hour (on-demand, spot), as
# listed on the date below; GCE moves spot prices up to once a month, so this is a snapshot.
GCE_TABLE_DATE = "2024-06-01"
GCE_MACHINE_TYPES = {  # machine type: (GPU, GPUs, on-demand, spot)
    "g2-standard-4": ("L4", 1, 0.7068, 0.2827), "g2-standard-8": ("L4", 1, 0.8536, 0.3414),
    "g2-standard-24": ("L4", 2, 2.0005, 0.8002), "g2-standard-48": ("L4", 4, 4.0010, 1.6004),
    "a2-highgpu-1g": ("A100", 1, 3.6734, 1.1020), "a2-highgpu-2g": ("A100", 2, 7.3467, 2.2040),
    "a2-highgpu-4g": ("A100", 4, 14.6935, 4.4081), "a2-highgpu-8g": ("A100", 8, 29.3870, 8.8161),
    "a2-ultragpu-1g": ("A100 80GB", 1, 5.0688, 1.6000), "a2-ultragpu-8g": ("A100 80GB", 8, 40.5504, 12.8000),
    "a3-highgpu-8g": ("H100", 8, 88.4909, 31.0000),
}
KNOWN = (f"AWS families {', '.join(AWS_FAMILIES)} (e.g. g5.xlarge); GCE L4, A100 and H100 machine types "
         f"{', '.join(GCE_MACHINE_TYPES)}; the study's k80, p100, v100")
_AWS_TYPE = re.compile(r"(?P<family>[a-z][a-z0-9]*)\.(?P<size>[a-z0-9]+)")


@dataclass(frozen=True)
class Price:
    usd_per_hour: float
    dated: float  # unix seconds of the price (a table's date, or the spot history row's)
    source: str


@dataclass(frozen=True)
class Rental:
    """One instance or machine type, what its GPUs are and what it costs in both markets."""

    name: str
    cloud: str
    gpu: str  # the GPU model, e.g. A10G
    gpus: int  # GPUs per instance
    on_demand: Price
    spot: Price


def cloud_of(name: str) -> str | None:
    """'aws' or 'gce' for a known type name (lower case), else None."""
    if name in GCE_MACHINE_TYPES:
        return "gce"
    found = _AWS_TYPE.fullmatch(name)
    if found and found.group("family") in AWS_FAMILIES:
        return "aws"
    return None


def check_known(name: str) -> str:
    name = str(name).strip().lower()
    if cloud_of(name) is None:
        raise PlanError(f"GPU or instance type {name!r} is unknown; the planner knows {KNOWN}.")
    return name


def server_type(name: str) -> str:
    """A server type the planner can simulate: one of the study's GPUs or a known rented type."""
    name = str(name).strip().lower()
    return name if name in GPU_TYPES else check_known(name)


def _date(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%d").replace(tzinfo=timezone.utc).timestamp()


def age_warning(what: str, price: Price, now: float) -> str | None:
    days = (now - price.dated) / DAY_S
    if days <= STALE_DAYS:
        return None
    when = datetime.fromtimestamp(price.dated, timezone.utc).strftime("%Y-%m-%d")
    return f"warning: the {what} is {days:,.0f} days old ({when}); check today's price before you rent."


def rent(names, region: str = "us-east-1", endpoint_url: str | None = None, days: float = STALE_DAYS,
         session=None, now: float | None = None, on_demand_prices: dict | None = None) -> tuple[dict, list[str]]:
    """{name: Rental} for every name, and the lines to print: each price with its source, and a
    warning for each price older than STALE_DAYS. AWS names ask EC2 (`region`, `endpoint_url`)."""
    now = time.time() if now is None else now
    names = [check_known(n) for n in names]
    aws = [n for n in names if cloud_of(n) == "aws"]
    rentals, notes = {}, []
    if aws:
        client = _ec2(region, endpoint_url, session)
        counts = aws_gpus(aws, client, region)
        for name in aws:
            on_demand = _aws_on_demand(name, region, on_demand_prices, now)
            spot, zones = aws_spot(name, client, region, days, now)
            model, count = counts[name]
            rentals[name] = Rental(name, "aws", model, count, on_demand, spot)
            notes.append(f"{name}: {count} x {model} (DescribeInstanceTypes); on-demand ${on_demand.usd_per_hour:g}/h "
                         f"({on_demand.source}); spot ${spot.usd_per_hour:g}/h ({spot.source}; zones: {zones})")
    for name in names:
        if cloud_of(name) == "gce":
            gpu, count, on_demand, spot = GCE_MACHINE_TYPES[name]
            source = f"built-in us-central1 table, dated {GCE_TABLE_DATE}"
            if on_demand_prices and name in on_demand_prices:
                on_demand_price = Price(on_demand_prices[name], now, "your price table")
            else:
                on_demand_price = Price(on_demand, _date(GCE_TABLE_DATE), source)
            rentals[name] = Rental(name, "gce", gpu, count, on_demand_price, Price(spot, _date(GCE_TABLE_DATE), source))
            notes.append(f"{name}: {count} x {gpu}; on-demand ${on_demand_price.usd_per_hour:g}/h "
                         f"({on_demand_price.source}); spot ${spot:g}/h ({source})")
    for name in names:
        for market, price in (("on-demand", rentals[name].on_demand), ("spot", rentals[name].spot)):
            warning = age_warning(f"{market} price of {name}", price, now)
            if warning:
                notes.append(warning)
    return rentals, notes


def _aws_on_demand(name: str, region: str, on_demand_prices: dict | None, now: float) -> Price:
    if on_demand_prices and name in on_demand_prices:
        return Price(float(on_demand_prices[name]), now, "your price table")
    if region != AWS_ON_DEMAND_REGION:
        raise PlanError(f"the built-in on-demand prices are {AWS_ON_DEMAND_REGION}'s, not {region}'s; give a price "
                        "table with --prices CSV (instance_type,on_demand_usd_per_hour).")
    if name not in AWS_ON_DEMAND_USD_PER_HOUR:
        raise PlanError(f"the built-in on-demand table (dated {AWS_ON_DEMAND_DATE}) has no price for {name}; give "
                        "one with --prices CSV (instance_type,on_demand_usd_per_hour).")
    return Price(AWS_ON_DEMAND_USD_PER_HOUR[name], _date(AWS_ON_DEMAND_DATE),
                 f"built-in {AWS_ON_DEMAND_REGION} table, dated {AWS_ON_DEMAND_DATE}")


def _ec2(region: str, endpoint_url: str | None, session):
    import botocore.exceptions

    from transientvod.aws_clients import aws_client

    try:
        return aws_client("ec2", region or None, endpoint_url, session)
    except botocore.exceptions.BotoCoreError as e:
        raise _aws_failure(e, "ec2", region) from None


def _aws_failure(e: Exception, call: str, region: str) -> PlanError:
    from transientvod.aws_clients import aws_error_sentence

    return PlanError(aws_error_sentence(e, call, region or None, "the planner's"))


def aws_gpus(names: list[str], client, region: str) -> dict[str, tuple[str, int]]:
    """{instance type: (GPU model, GPUs per instance)} from DescribeInstanceTypes."""
    import botocore.exceptions

    try:
        answer = client.describe_instance_types(InstanceTypes=names)
    except botocore.exceptions.ClientError as e:
        if e.response.get("Error", {}).get("Code") == "InvalidInstanceType":
            raise PlanError(f"EC2 in {region} does not know one of {', '.join(names)} "
                            f"({e.response['Error'].get('Message', '')}); check the names.") from None
        raise _aws_failure(e, "ec2:DescribeInstanceTypes", region) from None
    except botocore.exceptions.BotoCoreError as e:
        raise _aws_failure(e, "ec2:DescribeInstanceTypes", region) from None
    counts = {}
    for described in answer.get("InstanceTypes", []):
        gpus = (described.get("GpuInfo") or {}).get("Gpus") or []
        if gpus:
            counts[described["InstanceType"]] = (gpus[0].get("Name", "GPU"), sum(int(g.get("Count", 0)) for g in gpus))
    for name in names:
        if not counts.get(name, ("", 0))[1]:
            raise PlanError(f"EC2 in {region} describes {name} without GPUs (DescribeInstanceTypes has no GpuInfo "
                            "for it); plan with another type of its family's GPU.")
    return counts


def aws_spot(name: str, client, region: str, days: float, now: float) -> tuple[Price, str]:
    """The latest spot price of each availability zone over the last `days`; the cheapest zone's,
    and the zones with their prices."""
    import botocore.exceptions

    params = {"ProductDescriptions": ["Linux/UNIX"], "InstanceTypes": [name],
              "StartTime": datetime.fromtimestamp(now - days * DAY_S, timezone.utc),
              "EndTime": datetime.fromtimestamp(now, timezone.utc)}
    try:
        pages = client.get_paginator("describe_spot_price_history").paginate(**params)
        rows = [row for page in pages for row in page.get("SpotPriceHistory", [])]
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as e:
        raise _aws_failure(e, "ec2:DescribeSpotPriceHistory", region) from None
    latest: dict[str, tuple[float, float]] = {}  # zone -> (moment, price)
    for row in rows:
        if str(row.get("InstanceType", "")).lower() != name:
            continue
        moment = row["Timestamp"].timestamp() if isinstance(row["Timestamp"], datetime) else float(row["Timestamp"])
        zone = row.get("AvailabilityZone", "?")
        if zone not in latest or moment > latest[zone][0]:
            latest[zone] = (moment, float(row["SpotPrice"]))
    if not latest:
        raise PlanError(f"EC2's spot price history for {name} in {region} is empty over the last {days:g} days; it "
                        "is not sold as spot there: choose another --region or instance type.")
    zone, (moment, price) = min(latest.items(), key=lambda item: (item[1][1], item[0]))
    zones = ", ".join(f"{z} ${p:g}" for z, (_, p) in sorted(latest.items()))
    return Price(price, moment, f"DescribeSpotPriceHistory, {region}, cheapest zone {zone}"), zones
