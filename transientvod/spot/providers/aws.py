"""The hosts of a job on AWS EC2 spot capacity, and the interruption notices EC2 sends for them.

A job's hosts are the EC2 instances that carry the tag ``transientvod:job=<job>`` (the tag
key is configurable). Each poll lists them with DescribeInstances and says, per instance:

- ``usable``: running, and no interruption notice is known for it;
- ``noticed``: running, but EC2 has announced that it will take it (a spot interruption
  warning, a capacity-reservation interruption warning, a rebalance recommendation, or a
  spot request status that marks it);
- ``gone``: stopping, shutting down, stopped or terminated.

Pending instances are left out: they are not part of the job until they run.

Interruption notices reach the watcher the way AWS's own node termination handler receives
them in queue mode: EventBridge rules send EC2's events to an SQS queue, and each poll drains
the queue. ``transientvod aws setup --job-tag <job> --region <region>`` makes the queue
(``transientvod-<job>-notices``), its policy and the rules (spot/provisioning/aws_setup/, names and
documents in spot/aws_names.py), and writes the ``spot:`` config with the queue URL. Give
each job its own queue: the watcher deletes every message it reads, its own job's or not.
Without a queue the provider still notices instances whose spot request status marks them
for termination, but never rebalance recommendations, which EC2 announces only as events.

IAM permissions the watcher's credentials need::

    ec2:DescribeInstances, ec2:DescribeInstanceTypes, ec2:DescribeSpotInstanceRequests,
    sqs:ReceiveMessage, sqs:DeleteMessage   (the last two on the notice queue only)
"""
from __future__ import annotations

import contextlib
import json
import logging
from dataclasses import dataclass, replace
from datetime import datetime, timezone

import botocore.exceptions

from transientvod.aws_clients import aws_client, aws_error_sentence, client_error_codes
from transientvod.spot.hosts import GONE, NOTICED, USABLE, HostStatus
from transientvod.spot.providers.provider import ProviderError, SpotProvider

log = logging.getLogger(__name__)

INTERRUPTION_WARNING = "EC2 Spot Instance Interruption Warning"
REBALANCE_RECOMMENDATION = "EC2 Instance Rebalance Recommendation"
# An instance in an interruptible capacity reservation (or a Capacity Block that ends): the
# event carries the moment EC2 takes it, in detail["instance-termination-time"].
CAPACITY_RESERVATION_WARNING = "EC2 Capacity Reservation Instance Interruption Warning"
NOTICE_KINDS = (INTERRUPTION_WARNING, REBALANCE_RECOMMENDATION, CAPACITY_RESERVATION_WARNING)
# EC2 takes a spot instance two minutes after its interruption warning, unless the action is
# hibernate: then hibernation begins at once and there is no warning time to spend.
INTERRUPTION_WARNING_SECONDS = 120.0

# Spot request status codes that mean EC2 is taking (or has taken) the instance
# (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/spot-request-status.html).
SPOT_CODES_MARKED_FOR_TERMINATION = frozenset({
    "marked-for-termination",
    "marked-for-stop",
    "marked-for-hibernation",
    "instance-terminated-by-price",
    "instance-terminated-no-capacity",
    "instance-terminated-capacity-oversubscribed",
    "instance-terminated-launch-group-constraint",
})

# Every state an instance of the job can be in; terminated ones stay listed for about an hour.
INSTANCE_STATES = ("pending", "running", "stopping", "shutting-down", "stopped", "terminated")
GONE_STATES = frozenset({"stopping", "shutting-down", "stopped", "terminated"})

HOST_NAME_FIELDS = {"private-dns": "PrivateDnsName", "private-ip": "PrivateIpAddress"}

# SQS answers at most 10 messages per receive; a bound on batches per poll keeps a flooded
# queue from stalling one poll (the rest is read at the next).
RECEIVE_BATCHES_PER_POLL = 50
# A notice for an instance the job no longer lists (another job's instance in a shared queue,
# or one EC2 stopped listing) is kept this long, then forgotten, so memory does not grow.
UNLISTED_NOTICE_SECONDS = 600.0
# EC2 accepts at most 200 values per filter.
FILTER_VALUES_PER_CALL = 100

MISSING_QUEUE_CODES = frozenset({"AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist"})


@dataclass(frozen=True)
class InterruptionNotice:
    instance_id: str
    reason: str  # what announced it: an event's detail-type, or the spot request status code
    notice_at: float  # unix time EC2 announced it (or the watcher first saw it)
    terminate_at: float | None  # unix time EC2 takes the instance; None for a rebalance recommendation

    def merged_with(self, later: InterruptionNotice) -> InterruptionNotice:
        """One notice from two about the same instance: the first announcement, the earliest
        known end (an interruption warning after a rebalance recommendation adds its end)."""
        ends = [t for t in (self.terminate_at, later.terminate_at) if t is not None]
        reason = self.reason if self.terminate_at is not None or later.terminate_at is None else later.reason
        return replace(self, reason=reason, notice_at=min(self.notice_at, later.notice_at),
                       terminate_at=min(ends) if ends else None)


def describe_job_instances(ec2, tag_key: str, job_tag: str, states=INSTANCE_STATES) -> list[dict]:
    """Every instance tagged `tag_key`=`job_tag` in `states`, all pages of DescribeInstances, as
    EC2 lists them; the caller turns botocore's errors into its own sentence."""
    filters = [{"Name": f"tag:{tag_key}", "Values": [job_tag]},
               {"Name": "instance-state-name", "Values": list(states)}]
    instances = []
    for page in ec2.get_paginator("describe_instances").paginate(Filters=filters):
        for reservation in page.get("Reservations", []):
            instances.extend(reservation.get("Instances", []))
    return instances


def notice_from_event(body: str, now: float) -> InterruptionNotice | None:
    """The notice in one SQS message body: an EventBridge event as EventBridge delivers it
    (or wrapped in an SNS notification). None for an event of another kind; ValueError saying
    why for a body that is not an event at all, or a notice event that names no instance."""
    try:
        event = json.loads(body)
        # A queue subscribed to an SNS topic gets the event as the envelope's "Message".
        if isinstance(event, dict) and event.get("Type") == "Notification" and isinstance(event.get("Message"), str):
            event = json.loads(event["Message"])
    except json.JSONDecodeError:
        raise ValueError("the message body is not JSON") from None
    if not isinstance(event, dict):
        raise ValueError("the message body is not a JSON object")
    kind = event.get("detail-type")
    if event.get("source") != "aws.ec2" or kind not in NOTICE_KINDS:
        return None
    detail = event.get("detail")
    instance_id = detail.get("instance-id") if isinstance(detail, dict) else None
    if not isinstance(instance_id, str) or not instance_id.startswith("i-"):
        raise ValueError(f"the {kind!r} event names no instance-id")
    notice_at = _event_time(event.get("time"), now, f"the {kind!r} event for {instance_id}", "its time")
    if kind == REBALANCE_RECOMMENDATION:
        return InterruptionNotice(instance_id, kind, notice_at, None)
    if kind == CAPACITY_RESERVATION_WARNING:
        # The event says when; a missing or unreadable time still means the instance is going,
        # and the soonest it can go is now.
        terminate_at = _event_time(detail.get("instance-termination-time"), notice_at,
                                   f"the {kind!r} event for {instance_id}", "its instance-termination-time")
    elif detail.get("instance-action") == "hibernate":
        terminate_at = notice_at  # hibernation starts with the warning
    else:
        terminate_at = notice_at + INTERRUPTION_WARNING_SECONDS
    if terminate_at < now:
        log.warning("the %r event for %s says EC2 takes it at %s, %.0f s ago; the host counts as noticed now.",
                    kind, instance_id, _utc(terminate_at), now - terminate_at)
    return InterruptionNotice(instance_id, kind, notice_at, terminate_at)


def notices_from_spot_requests(requests: list[dict], now: float) -> list[InterruptionNotice]:
    """Notices for the instances whose spot request status (DescribeSpotInstanceRequests rows)
    marks them for termination, first seen at `now`."""
    notices = []
    for request in requests:
        code = (request.get("Status") or {}).get("Code")
        instance_id = request.get("InstanceId")
        if code not in SPOT_CODES_MARKED_FOR_TERMINATION or not instance_id:
            continue
        # marked-for-termination/stop: the two-minute warning has begun; marked-for-hibernation:
        # hibernation begins at once; instance-terminated-*: it is over.
        going_now = code.startswith("instance-terminated-") or code == "marked-for-hibernation"
        terminate_at = now if going_now else now + INTERRUPTION_WARNING_SECONDS
        notices.append(InterruptionNotice(instance_id, f"spot request status {code}", now, terminate_at))
    return notices


def _event_time(text, fallback: float, what: str, field: str) -> float:
    """An EventBridge time as unix time; `fallback` (with a one-sentence warning) when it is
    missing or unreadable, since the event still says the instance is going."""
    if not isinstance(text, str):
        log.warning("%s has no %s; using %s.", what, field, _utc(fallback))
        return fallback
    try:
        # EventBridge writes "2026-11-30T03:37:05Z"; Python 3.10 does not read the "Z".
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        log.warning("%s has %s %r, which is not an ISO 8601 time; using %s.", what, field, text[:40], _utc(fallback))
        return fallback
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp()


def _utc(unix: float) -> str:
    return datetime.fromtimestamp(unix, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def aws_error(error: Exception, call: str, region: str | None, whose: str) -> ProviderError:
    """The one-sentence ProviderError for a botocore exception raised by `call` (the wording is
    aws_clients.aws_error_sentence's); shared by the provider and the fleet."""
    return ProviderError(aws_error_sentence(error, call, region, whose))


class AwsProvider(SpotProvider):
    """The EC2 instances tagged `tag_key=job_tag`, with the interruption notices EC2 sent for
    them (from the SQS queue at `queue_url`, and from their spot requests' status)."""

    name = "aws"

    def __init__(self, job_tag: str, tag_key: str = "transientvod:job", region: str | None = None,
                 endpoint_url: str | None = None, queue_url: str | None = None,
                 host_name: str = "private-dns", slots: int = 0, session=None):
        if not job_tag:
            raise ValueError("job_tag is empty; set it to the value of the tag your job's instances carry.")
        if not tag_key:
            raise ValueError("tag_key is empty; set it to the key of the tag your job's instances carry.")
        if host_name not in HOST_NAME_FIELDS:
            raise ValueError(f"host_name is {host_name!r}; it must be one of {', '.join(HOST_NAME_FIELDS)}.")
        if slots < 0:
            raise ValueError(f"slots is {slots}; it must be at least 1, or 0 to count each instance type's GPUs.")
        self.job_tag = job_tag
        self.tag_key = tag_key
        self.queue_url = queue_url
        self.host_name = host_name
        self.slots = slots
        self._notices: dict[str, InterruptionNotice] = {}
        self._slots_by_type: dict[str, int] = {}
        # EC2 drops a terminated instance's private DNS name and address; keep the name it ran under.
        self._names: dict[str, str] = {}
        self.region = region
        # The watcher polls every few seconds: the clients' short timeouts (aws_clients) keep a
        # hanging call from leaving the host-state file stale while EC2 takes servers away.
        with self._provider_errors("creating the EC2 client"):
            self._ec2 = aws_client("ec2", region, endpoint_url, session)
        self.region = self._ec2.meta.region_name  # the region boto3 chose, for the messages
        self._sqs = None
        if queue_url:
            with self._provider_errors("creating the SQS client"):
                self._sqs = aws_client("sqs", region, endpoint_url, session)

    def poll(self, now: float) -> list[HostStatus]:
        if self._sqs is not None:
            self._read_notice_queue(now)
        instances = self._job_instances()
        self._read_spot_request_notices(instances, now)
        listed = {instance["InstanceId"] for instance in instances}
        self._forget_unlisted(listed, now)
        self._names = {iid: name for iid, name in self._names.items() if iid in listed}
        instances.sort(key=lambda i: (i.get("LaunchTime") or datetime.min.replace(tzinfo=timezone.utc), i["InstanceId"]))
        hosts = [self._host_status(instance) for instance in instances]
        return [host for host in hosts if host is not None]

    def notice(self, instance_id: str) -> InterruptionNotice | None:
        """The notice known for an instance, if any."""
        return self._notices.get(instance_id)

    # --- the three sources -------------------------------------------------------------------

    def _read_notice_queue(self, now: float) -> None:
        for _ in range(RECEIVE_BATCHES_PER_POLL):
            with self._provider_errors("sqs:ReceiveMessage"):
                # WaitTimeSeconds=0: the poll must not block; a message short polling misses
                # now is read at the next poll.
                messages = self._sqs.receive_message(QueueUrl=self.queue_url, MaxNumberOfMessages=10,
                                                     WaitTimeSeconds=0).get("Messages", [])
            if not messages:
                return
            for message in messages:
                try:
                    notice = notice_from_event(message.get("Body", ""), now)
                except ValueError as e:
                    log.warning("deleting message %s from %s: %s.", message.get("MessageId"), self.queue_url, e)
                    continue
                if notice is None:
                    log.info("deleting message %s from %s: not an interruption notice.",
                             message.get("MessageId"), self.queue_url)
                else:
                    self._record(notice)
            # Deleted only after the notices are recorded: a watcher that dies in between
            # reads them again once their visibility timeout ends.
            entries = [{"Id": str(n), "ReceiptHandle": m["ReceiptHandle"]} for n, m in enumerate(messages)]
            with self._provider_errors("sqs:DeleteMessage"):
                answer = self._sqs.delete_message_batch(QueueUrl=self.queue_url, Entries=entries)
            for failed in answer.get("Failed", []):
                log.warning("could not delete a message from %s (%s); it will be read again.",
                            self.queue_url, failed.get("Message") or failed.get("Code"))

    def _job_instances(self) -> list[dict]:
        with self._provider_errors("ec2:DescribeInstances"):
            return describe_job_instances(self._ec2, self.tag_key, self.job_tag)

    def _read_spot_request_notices(self, instances: list[dict], now: float) -> None:
        request_ids = sorted({i["SpotInstanceRequestId"] for i in instances
                              if i.get("SpotInstanceRequestId") and i["State"]["Name"] == "running"})
        for start in range(0, len(request_ids), FILTER_VALUES_PER_CALL):
            chunk = request_ids[start:start + FILTER_VALUES_PER_CALL]
            # A filter, not SpotInstanceRequestIds: that fails outright when one request is gone.
            with self._provider_errors("ec2:DescribeSpotInstanceRequests"):
                pages = self._ec2.get_paginator("describe_spot_instance_requests").paginate(
                    Filters=[{"Name": "spot-instance-request-id", "Values": chunk}])
                requests = [r for page in pages for r in page.get("SpotInstanceRequests", [])]
            for notice in notices_from_spot_requests(requests, now):
                self._record(notice)

    def _record(self, notice: InterruptionNotice) -> None:
        known = self._notices.get(notice.instance_id)
        if known is None:
            self._notices[notice.instance_id] = notice
            ends = f"EC2 takes it at {notice.terminate_at:.0f}" if notice.terminate_at is not None \
                else "EC2 has not said when it takes it"
            log.info("instance %s noticed (%s at %.0f); %s.", notice.instance_id, notice.reason, notice.notice_at, ends)
        else:
            self._notices[notice.instance_id] = known.merged_with(notice)

    def _forget_unlisted(self, listed: set[str], now: float) -> None:
        for instance_id, notice in list(self._notices.items()):
            if instance_id not in listed and notice.notice_at < now - UNLISTED_NOTICE_SECONDS:
                del self._notices[instance_id]

    # --- one host ------------------------------------------------------------------------------

    def _host_status(self, instance: dict) -> HostStatus | None:
        instance_id = instance["InstanceId"]
        state = instance["State"]["Name"]
        if state == "pending":
            return None
        name = instance.get(HOST_NAME_FIELDS[self.host_name]) or self._names.get(instance_id)
        if state not in GONE_STATES and not name:
            log.warning("instance %s runs but has no %s yet; it joins the job once it has one.",
                        instance_id, HOST_NAME_FIELDS[self.host_name])
            return None
        name = name or instance_id
        self._names[instance_id] = name
        notice = self._notices.get(instance_id)
        host_state = GONE if state in GONE_STATES else NOTICED if notice is not None else USABLE
        return HostStatus(name=name, slots=self._slots(instance.get("InstanceType", "")), state=host_state,
                          instance_id=instance_id,
                          notice_at=notice.notice_at if notice else None,
                          terminate_at=notice.terminate_at if notice else None)

    def _slots(self, instance_type: str) -> int:
        if self.slots > 0:
            return self.slots
        if instance_type not in self._slots_by_type:
            self._slots_by_type[instance_type] = self._gpus(instance_type)
        return self._slots_by_type[instance_type]

    def _gpus(self, instance_type: str) -> int:
        with self._provider_errors("ec2:DescribeInstanceTypes"):
            try:
                types = self._ec2.describe_instance_types(InstanceTypes=[instance_type]).get("InstanceTypes", [])
            except botocore.exceptions.ClientError as e:
                if e.response.get("Error", {}).get("Code") != "InvalidInstanceType":
                    raise
                types = []
        if not types:
            log.warning("EC2 does not describe instance type %r; giving its instances 1 slot "
                        "(set slots to override).", instance_type)
            return 1
        gpus = sum(gpu.get("Count", 0) for gpu in (types[0].get("GpuInfo") or {}).get("Gpus", []))
        # An instance type without GPUs still runs one worker.
        return max(gpus, 1)

    # --- errors --------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _provider_errors(self, call: str):
        """Turns botocore's exceptions during `call` into a one-sentence ProviderError."""
        try:
            yield
        except botocore.exceptions.ClientError as e:
            if client_error_codes(e) & MISSING_QUEUE_CODES:
                raise ProviderError(f"the SQS queue {self.queue_url} does not exist; create it "
                                    "or fix the queue URL.") from e
            raise aws_error(e, call, self.region, "the watcher's") from e
        except botocore.exceptions.BotoCoreError as e:
            raise aws_error(e, call, self.region, "the watcher's") from e
