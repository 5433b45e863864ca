"""What `transientvod status` says of a job's servers, read from EC2 at the moment it runs:
each instance (type, market, state, age), what the instances EC2 still lists have cost, and
the last interruption notice EC2 gave for one of them.

Cost: each instance is billed billing.meter.billed_seconds(end - LaunchTime) at its type's
price, where the end is now for one that has not ended and the time EC2 gives in its state
transition reason for one that has (fleet.transition_time). Prices come the way the fleet
takes them: --price where given, else the built-in on-demand table, which for a spot instance
is the most it can cost at EC2's default maximum price; each line says which. EC2 stops
listing a terminated instance about an hour after it ended, so the cost covers only the
instances it still lists, and says so.

The last notice: a spot request status that marks an instance (as the watcher reads it), the
state reason of an instance EC2 took back (Server.SpotInstanceTermination), and, given the
job's notice queue, the EventBridge events waiting in it. The queue is only looked at
(ReceiveMessage with a visibility timeout of 0, nothing deleted): the job's watcher owns it.
"""
from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass

from transientvod.billing.meter import billed_seconds
from transientvod.billing.prices import AWS_PRICE_TABLE_REGION, PriceCatalog, PriceError, iso_utc
from transientvod.spot.providers.aws import FILTER_VALUES_PER_CALL, InterruptionNotice, notice_from_event, notices_from_spot_requests
from transientvod.spot.provisioning.fleet import transition_time
from transientvod.spot.provisioning.job_instances import JobInstances, ended_by, market_of

log = logging.getLogger(__name__)

NOT_ENDED = frozenset({"pending", "running", "stopping", "stopped"})
# EC2's state reason of an instance it interrupted (spot capacity or price).
SPOT_TERMINATION_REASON = "Server.SpotInstanceTermination"
QUEUE_BATCHES = 10  # 10 messages each: what a look at the queue reads at most


@dataclass(frozen=True)
class InstanceLine:
    instance_id: str
    instance_type: str
    market: str  # spot | on-demand
    state: str
    launched_at: str  # ISO 8601 UTC
    age_seconds: float  # from LaunchTime to now, or to when it ended
    billed_seconds: float
    usd_per_hour: float | None  # None: no price known for the type
    price_source: str
    usd: float | None
    ended_by: str | None  # down | launcher, when one of them ended it


@dataclass(frozen=True)
class NoticeLine:
    instance_id: str
    reason: str
    at: str  # ISO 8601 UTC
    source: str  # spot request status | instance state | notice queue


def hourly_prices(instance_types, given: dict[str, float], region: str) -> dict[str, tuple[float | None, str]]:
    """(price, where it came from) per type: --price, else the built-in on-demand table
    (None and why, for a type in neither)."""
    catalog = PriceCatalog("aws", region=region)
    prices = {}
    for instance_type in sorted(set(instance_types)):
        if instance_type in given:
            prices[instance_type] = (given[instance_type], "--price")
            continue
        try:
            prices[instance_type] = (catalog.on_demand_hourly(instance_type),
                                     f"on-demand table, aws {AWS_PRICE_TABLE_REGION}")
        except PriceError:
            prices[instance_type] = (None, f"no price: not in the on-demand table of aws {AWS_PRICE_TABLE_REGION}"
                                           f"{'' if region in ('', AWS_PRICE_TABLE_REGION) else f' (region {region})'}; "
                                           f"give --price {instance_type}=DOLLARS_PER_HOUR")
    return prices


def instance_lines(instances: list[dict], prices: dict[str, tuple[float | None, str]], now: float) -> list[InstanceLine]:
    lines = []
    for instance in instances:
        state = instance["State"]["Name"]
        launched = instance["LaunchTime"].timestamp()
        end = now if state in NOT_ENDED else (transition_time(instance) or now)
        billed = billed_seconds(max(0.0, end - launched))
        price, source = prices[instance.get("InstanceType", "")]
        lines.append(InstanceLine(
            instance_id=instance["InstanceId"], instance_type=instance.get("InstanceType", ""),
            market=market_of(instance), state=state, launched_at=iso_utc(launched),
            age_seconds=round(max(0.0, end - launched), 1), billed_seconds=billed, usd_per_hour=price,
            price_source=source, usd=None if price is None else billed / 3600.0 * price,
            ended_by=ended_by(instance)))
    return lines


def last_notice(job: JobInstances, instances: list[dict], queue_url: str, now: float) -> NoticeLine | None:
    """The newest interruption notice the cloud holds for an instance of the job."""
    ids = {i["InstanceId"] for i in instances}
    found: list[tuple[float, NoticeLine]] = []

    def add(notice: InterruptionNotice, source: str) -> None:
        if notice.instance_id in ids:
            found.append((notice.notice_at, NoticeLine(notice.instance_id, notice.reason, iso_utc(notice.notice_at),
                                                       source)))

    request_ids = sorted({i["SpotInstanceRequestId"] for i in instances if i.get("SpotInstanceRequestId")})
    requests = []
    for start in range(0, len(request_ids), FILTER_VALUES_PER_CALL):
        # A filter, not SpotInstanceRequestIds: that fails outright when one request is gone.
        with job.errors("ec2:DescribeSpotInstanceRequests"):
            pages = job.ec2.get_paginator("describe_spot_instance_requests").paginate(
                Filters=[{"Name": "spot-instance-request-id",
                          "Values": request_ids[start:start + FILTER_VALUES_PER_CALL]}])
            requests += [r for page in pages for r in page.get("SpotInstanceRequests", [])]
        for request, notice in ((r, n) for r in requests for n in notices_from_spot_requests([r], now)):
            # The status's own update time, where EC2 gives it, is when the notice came.
            updated = (request.get("Status") or {}).get("UpdateTime")
            at = updated.timestamp() if updated is not None else now
            add(InterruptionNotice(notice.instance_id, notice.reason, at, notice.terminate_at), "spot request status")
    for instance in instances:
        reason = (instance.get("StateReason") or {}).get("Code")
        if reason == SPOT_TERMINATION_REASON:
            at = transition_time(instance) or now
            add(InterruptionNotice(instance["InstanceId"], f"EC2 took it back ({reason})", at, at), "instance state")
    if queue_url:
        for notice in peek_queue(job, queue_url, now):
            add(notice, "notice queue")
    return max(found, key=lambda pair: pair[0])[1] if found else None


def peek_queue(job: JobInstances, queue_url: str, now: float) -> list[InterruptionNotice]:
    """The notices in the job's queue, left there for its watcher (visibility timeout 0)."""
    from transientvod.aws_clients import aws_client

    with job.errors("creating the SQS client"):
        sqs = aws_client("sqs", job.region, job.endpoint_url, job.session)
    notices, seen = [], set()
    for _ in range(QUEUE_BATCHES):
        with job.errors("sqs:ReceiveMessage"):
            messages = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=0,
                                           VisibilityTimeout=0).get("Messages", [])
        new = [m for m in messages if m["MessageId"] not in seen]
        if not new:
            break
        for message in new:
            seen.add(message["MessageId"])
            try:
                notice = notice_from_event(message.get("Body", ""), now)
            except ValueError:
                continue  # the watcher logs and deletes what is not an event
            if notice is not None:
                notices.append(notice)
    return notices


def job_status(job: JobInstances, given_prices: dict[str, float], queue_url: str = "",
               now: float | None = None) -> dict:
    """The instances part of `transientvod status` as plain JSON-ready data."""
    now = time.time() if now is None else now
    instances = job.list()
    prices = hourly_prices([i.get("InstanceType", "") for i in instances], given_prices, job.region or "")
    lines = instance_lines(instances, prices, now)
    priced = [line.usd for line in lines if line.usd is not None]
    notice = last_notice(job, instances, queue_url, now)
    return {
        "job_tag": job.job_tag,
        "region": job.region,
        "at": iso_utc(now),
        "instances": [asdict(line) for line in lines],
        "running": sum(1 for line in lines if line.state in ("pending", "running")),
        "cost_usd": sum(priced) if priced else (0.0 if not lines else None),
        "cost_unpriced": sorted({line.instance_type for line in lines if line.usd is None}),
        "cost_covers": "the instances EC2 lists now (it forgets a terminated one about an hour after it ended)",
        "last_notice": asdict(notice) if notice is not None else None,
        "notice_sources": ["spot request status", "instance state"] + (["notice queue"] if queue_url else []),
    }


def _age(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def format_status(status: dict) -> str:
    """`transientvod status` as text: one line per instance, then cost, checkpoint, notice."""
    lines = [f"job {status['job_tag']} in {status['region']}, as of {status['at']}"]
    instances = status["instances"]
    if instances:
        lines.append(f"instances ({status['running']} pending or running; EC2 lists ended ones for about an hour):")
        for i in instances:
            cost = (f"${i['usd']:.4f} at ${i['usd_per_hour']:g}/h ({i['price_source']})" if i["usd"] is not None
                    else f"cost unknown ({i['price_source']})")
            ended = f", ended by {i['ended_by']}" if i["ended_by"] else ""
            lines.append(f"  {i['instance_id']}  {i['instance_type']}  {i['market']}  {i['state']}{ended}  "
                         f"age {_age(i['age_seconds'])}  billed {i['billed_seconds']:.0f} s  {cost}")
    else:
        lines.append("instances: none (EC2 lists no instance tagged transientvod:job="
                     f"{status['job_tag']} in {status['region']})")
    if status["cost_usd"] is None:
        lines.append(f"cost so far: unknown (no price for {', '.join(status['cost_unpriced'])})")
    else:
        unpriced = (f"; not counted, no price: {', '.join(status['cost_unpriced'])}" if status["cost_unpriced"] else "")
        lines.append(f"cost so far: ${status['cost_usd']:.4f} ({status['cost_covers']}{unpriced})")
    checkpoint = status.get("checkpoint") or {}
    if checkpoint.get("step") is not None:
        world = checkpoint["world_size"] if checkpoint["world_size"] is not None else "not recorded"
        lines.append(f"checkpoint: step {checkpoint['step']}, world size {world} ({checkpoint['location']})")
    else:
        lines.append(f"checkpoint: {checkpoint.get('unavailable', 'unknown')}")
    notice = status["last_notice"]
    if notice is not None:
        lines.append(f"last notice: {notice['instance_id']}: {notice['reason']} at {notice['at']} ({notice['source']})")
    else:
        lines.append(f"last notice: none in {', '.join(status['notice_sources'])}"
                     + ("" if "notice queue" in status["notice_sources"]
                        else "; no notice queue given (--queue-url or --config)"))
    return "\n".join(lines)
