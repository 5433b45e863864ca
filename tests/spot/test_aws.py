"""AwsProvider against real HTTP: boto3 talks to a moto server on 127.0.0.1.

What moto cannot do, and how these tests cope:
- it describes no p3.* instance type (DescribeInstanceTypes answers InvalidInstanceType), so
  p3.2xlarge checks the 1-slot fallback and g4dn.12xlarge (4 T4 GPUs) checks the GPU count;
- it puts no SpotInstanceRequestId on instances and always reports spot requests as
  "fulfilled", so the marked-for-termination path is checked on the rows themselves
  (notices_from_spot_requests), with moto's own rows as the not-marked case;
- it does not enforce IAM, so an access-denied answer is not exercised.
"""
from __future__ import annotations

import json
import logging
import time

import boto3
import pytest

from conftest import free_port, heavy_modules_imported, reset_moto

from transientvod.spot.hosts import GONE, NOTICED, USABLE
from transientvod.spot.providers.aws import (CAPACITY_RESERVATION_WARNING, INTERRUPTION_WARNING, REBALANCE_RECOMMENDATION,
                                   AwsProvider, notice_from_event, notices_from_spot_requests)
from transientvod.spot.providers.provider import ProviderError

JOB = "resnet32-run7"
NOW = 1_796_009_000.0
EVENT_TIME = "2026-11-30T03:37:05Z"
EVENT_UNIX = 1_796_009_825.0  # EVENT_TIME as unix time


@pytest.fixture
def aws(ec2_moto):
    """A fresh moto account for each test."""
    url, ami, session = ec2_moto
    reset_moto(url)
    return Cloud(url, ami, session)


class Cloud:
    """The test's own boto3 clients, playing EC2 and EventBridge."""

    def __init__(self, endpoint: str, ami: str, session: boto3.session.Session):
        self.endpoint = endpoint
        self.ami = ami
        self.session = session
        self.ec2 = session.client("ec2", endpoint_url=endpoint)
        self.sqs = session.client("sqs", endpoint_url=endpoint)

    def launch(self, instance_type: str, job: str | None = JOB, spot: bool = True) -> dict:
        params = {"ImageId": self.ami, "MinCount": 1, "MaxCount": 1, "InstanceType": instance_type}
        if job is not None:
            params["TagSpecifications"] = [{"ResourceType": "instance",
                                            "Tags": [{"Key": "transientvod:job", "Value": job}]}]
        if spot:
            params["InstanceMarketOptions"] = {"MarketType": "spot",
                                               "SpotOptions": {"SpotInstanceType": "one-time"}}
        instance = self.ec2.run_instances(**params)["Instances"][0]
        return instance

    def queue(self, name: str = "notices") -> str:
        return self.sqs.create_queue(QueueName=name)["QueueUrl"]

    def send_event(self, queue_url: str, detail_type: str, instance_id: str, time_text: str | None = EVENT_TIME,
                   action: str = "terminate", **detail_fields):
        """The event exactly as an EventBridge rule with an SQS target delivers it (the
        shapes of AWS's documentation: instance-action on the two warnings, and the
        capacity-reservation warning's instance-termination-time)."""
        detail = {"instance-id": instance_id}
        if detail_type in (INTERRUPTION_WARNING, CAPACITY_RESERVATION_WARNING):
            detail["instance-action"] = action
        detail.update(detail_fields)
        event = {"version": "0", "id": "7e7c6b8a-1f3c-4c1e-9a0b-2d8e5b0c4f11", "detail-type": detail_type,
                 "source": "aws.ec2", "account": "123456789012", "region": "us-east-1",
                 "resources": [f"arn:aws:ec2:us-east-1:123456789012:instance/{instance_id}"], "detail": detail}
        if time_text is not None:
            event["time"] = time_text
        self.sqs.send_message(QueueUrl=queue_url, MessageBody=json.dumps(event))

    def messages_left(self, queue_url: str) -> int:
        attributes = self.sqs.get_queue_attributes(
            QueueUrl=queue_url, AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"])
        return sum(int(v) for v in attributes["Attributes"].values())

    def provider(self, **options) -> AwsProvider:
        return AwsProvider(JOB, endpoint_url=self.endpoint, session=self.session, **options)


def by_id(hosts) -> dict:
    return {h.instance_id: h for h in hosts}


def test_discovery_lists_the_jobs_running_instances_with_names_and_slots(aws):
    four_gpus = aws.launch("g4dn.12xlarge")
    no_gpus = aws.launch("m5.large", spot=False)
    undescribed = aws.launch("p3.2xlarge")  # moto does not describe p3 types
    aws.launch("g4dn.12xlarge", job=None)
    aws.launch("g4dn.12xlarge", job="another-job")

    hosts = aws.provider().poll(NOW)

    assert by_id(hosts).keys() == {four_gpus["InstanceId"], no_gpus["InstanceId"], undescribed["InstanceId"]}
    assert all(h.state == USABLE and h.notice_at is None for h in hosts)
    assert {h.instance_id: (h.name, h.slots) for h in hosts} == {
        four_gpus["InstanceId"]: (four_gpus["PrivateDnsName"], 4),
        no_gpus["InstanceId"]: (no_gpus["PrivateDnsName"], 1),
        undescribed["InstanceId"]: (undescribed["PrivateDnsName"], 1),
    }

    hosts = aws.provider(host_name="private-ip", slots=2).poll(NOW)
    assert {h.instance_id: (h.name, h.slots) for h in hosts} == {
        i["InstanceId"]: (i["PrivateIpAddress"], 2) for i in (four_gpus, no_gpus, undescribed)}


def test_terminated_and_stopped_instances_are_gone(aws):
    kept, terminated, stopped = (aws.launch("g4dn.12xlarge") for _ in range(3))
    provider = aws.provider()
    assert {h.state for h in provider.poll(NOW)} == {USABLE}

    aws.ec2.terminate_instances(InstanceIds=[terminated["InstanceId"]])
    aws.ec2.stop_instances(InstanceIds=[stopped["InstanceId"]])
    hosts = by_id(provider.poll(NOW + 5))

    assert hosts[kept["InstanceId"]].state == USABLE
    assert hosts[terminated["InstanceId"]].state == GONE
    assert hosts[stopped["InstanceId"]].state == GONE
    # It keeps the name it ran under, so the watcher can match it to the host it was.
    assert hosts[terminated["InstanceId"]].name == terminated["PrivateDnsName"]


def test_interruption_warning_in_the_queue_notices_the_instance_before_ec2_takes_it(aws):
    warned, other = aws.launch("g4dn.12xlarge"), aws.launch("g4dn.12xlarge")
    queue = aws.queue()
    provider = aws.provider(queue_url=queue)
    assert {h.state for h in provider.poll(NOW)} == {USABLE}

    aws.send_event(queue, INTERRUPTION_WARNING, warned["InstanceId"])
    hosts = by_id(provider.poll(NOW + 900))

    assert hosts[warned["InstanceId"]].state == NOTICED
    assert hosts[warned["InstanceId"]].notice_at == EVENT_UNIX
    assert hosts[warned["InstanceId"]].terminate_at == EVENT_UNIX + 120
    assert hosts[other["InstanceId"]].state == USABLE
    assert aws.messages_left(queue) == 0

    # Still noticed once the message is gone from the queue.
    later = by_id(provider.poll(NOW + 905))[warned["InstanceId"]]
    assert (later.state, later.notice_at, later.terminate_at) == (NOTICED, EVENT_UNIX, EVENT_UNIX + 120)

    aws.ec2.terminate_instances(InstanceIds=[warned["InstanceId"]])
    gone = by_id(provider.poll(NOW + 1000))[warned["InstanceId"]]
    assert (gone.state, gone.notice_at, gone.terminate_at) == (GONE, EVENT_UNIX, EVENT_UNIX + 120)


def test_rebalance_recommendation_notices_without_an_end_until_a_warning_follows(aws):
    instance = aws.launch("g4dn.12xlarge")
    queue = aws.queue()
    provider = aws.provider(queue_url=queue)

    aws.send_event(queue, REBALANCE_RECOMMENDATION, instance["InstanceId"], time_text=None)
    host = provider.poll(NOW)[0]
    assert (host.state, host.notice_at, host.terminate_at) == (NOTICED, NOW, None)
    assert aws.messages_left(queue) == 0
    host = provider.poll(NOW + 5)[0]
    assert (host.state, host.notice_at, host.terminate_at) == (NOTICED, NOW, None)

    aws.send_event(queue, INTERRUPTION_WARNING, instance["InstanceId"], time_text=None)
    host = provider.poll(NOW + 10)[0]
    assert (host.state, host.notice_at, host.terminate_at) == (NOTICED, NOW, NOW + 10 + 120)


def test_garbled_and_unrelated_messages_are_deleted_and_the_rest_still_counts(aws):
    warned, other = aws.launch("g4dn.12xlarge"), aws.launch("g4dn.12xlarge")
    queue = aws.queue()
    for body in ("not json {", "[1, 2]", '{"detail-type": "EC2 Spot Instance Interruption Warning", '
                 '"source": "aws.ec2", "detail": {}}',
                 json.dumps({"detail-type": "EC2 Instance State-change Notification", "source": "aws.ec2",
                             "detail": {"instance-id": other["InstanceId"], "state": "running"}})):
        aws.sqs.send_message(QueueUrl=queue, MessageBody=body)
    aws.send_event(queue, INTERRUPTION_WARNING, warned["InstanceId"])

    hosts = by_id(aws.provider(queue_url=queue).poll(NOW))

    assert hosts[warned["InstanceId"]].state == NOTICED
    assert hosts[other["InstanceId"]].state == USABLE
    assert aws.messages_left(queue) == 0


def test_event_parsing_reads_the_sns_envelope_and_rejects_what_is_not_an_event():
    event = {"detail-type": INTERRUPTION_WARNING, "source": "aws.ec2", "time": EVENT_TIME,
             "detail": {"instance-id": "i-0abc", "instance-action": "stop"}}
    notice = notice_from_event(json.dumps({"Type": "Notification", "Message": json.dumps(event)}), NOW)
    assert (notice.instance_id, notice.notice_at, notice.terminate_at) == ("i-0abc", EVENT_UNIX, EVENT_UNIX + 120)
    assert notice_from_event(json.dumps({**event, "source": "my.app"}), NOW) is None
    assert notice_from_event(json.dumps({**event, "time": "yesterday"}), NOW).notice_at == NOW
    with pytest.raises(ValueError, match="not JSON"):
        notice_from_event("", NOW)
    with pytest.raises(ValueError, match="instance-id"):
        notice_from_event(json.dumps({**event, "detail": {"instance-id": 7}}), NOW)


def test_hibernate_warning_through_the_queue_has_no_two_minutes(aws):
    hibernating, stopping = aws.launch("g4dn.12xlarge"), aws.launch("g4dn.12xlarge")
    queue = aws.queue()
    aws.send_event(queue, INTERRUPTION_WARNING, hibernating["InstanceId"], action="hibernate")
    aws.send_event(queue, INTERRUPTION_WARNING, stopping["InstanceId"], action="stop")

    hosts = by_id(aws.provider(queue_url=queue).poll(EVENT_UNIX + 1))

    assert (hosts[hibernating["InstanceId"]].state, hosts[hibernating["InstanceId"]].terminate_at) == \
        (NOTICED, EVENT_UNIX)
    assert (hosts[stopping["InstanceId"]].state, hosts[stopping["InstanceId"]].terminate_at) == \
        (NOTICED, EVENT_UNIX + 120)


def test_capacity_reservation_warning_is_read_with_its_own_termination_time(aws):
    instance, other = aws.launch("g4dn.12xlarge", spot=False), aws.launch("g4dn.12xlarge", spot=False)
    queue = aws.queue()
    aws.send_event(queue, CAPACITY_RESERVATION_WARNING, instance["InstanceId"],
                   **{"instance-termination-time": "2026-11-30T03:47:05Z", "availability-zone": "us-east-1a",
                      "instance-lifecycle": "capacity-block"})

    hosts = by_id(aws.provider(queue_url=queue).poll(EVENT_UNIX + 1))

    noticed = hosts[instance["InstanceId"]]
    assert (noticed.state, noticed.notice_at, noticed.terminate_at) == (NOTICED, EVENT_UNIX, EVENT_UNIX + 600)
    assert hosts[other["InstanceId"]].state == USABLE
    assert aws.messages_left(queue) == 0


def test_bad_notice_events_get_one_sentence_each(aws, caplog):
    instance = aws.launch("g4dn.12xlarge")
    queue = aws.queue()
    caplog.set_level(logging.INFO, logger="transientvod.spot.providers.aws")
    # No instance id: dropped with a sentence naming what is missing.
    aws.sqs.send_message(QueueUrl=queue, MessageBody=json.dumps(
        {"version": "0", "detail-type": CAPACITY_RESERVATION_WARNING, "source": "aws.ec2", "time": EVENT_TIME,
         "detail": {"instance-action": "terminate", "instance-termination-time": EVENT_TIME}}))
    # An unreadable termination time: still a notice, going now, and said so.
    aws.send_event(queue, CAPACITY_RESERVATION_WARNING, instance["InstanceId"],
                   **{"instance-termination-time": "in ten minutes"})

    host = aws.provider(queue_url=queue).poll(EVENT_UNIX + 30)[0]

    assert (host.state, host.notice_at, host.terminate_at) == (NOTICED, EVENT_UNIX, EVENT_UNIX)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("names no instance-id" in w for w in warnings), warnings
    assert any("'in ten minutes', which is not an ISO 8601 time" in w for w in warnings), warnings
    assert any("30 s ago" in w for w in warnings), warnings  # the time it names has passed
    assert all(w.count(". ") == 0 for w in warnings), warnings  # one sentence each
    assert aws.messages_left(queue) == 0


def test_spot_request_status_codes_that_mark_an_instance_notice_it(aws):
    # moto never sets these codes (its requests stay "fulfilled") and puts no
    # SpotInstanceRequestId on instances, so the mapping is checked on rows shaped like
    # DescribeSpotInstanceRequests' answer; moto's own rows are the not-marked case.
    rows = [{"SpotInstanceRequestId": f"sir-{n}", "InstanceId": f"i-{n}", "Status": {"Code": code}}
            for n, code in enumerate(["marked-for-termination", "marked-for-stop", "marked-for-hibernation",
                                      "instance-terminated-by-price", "instance-terminated-no-capacity",
                                      "fulfilled", "request-canceled-and-instance-running"])]
    rows.append({"SpotInstanceRequestId": "sir-open", "Status": {"Code": "marked-for-termination"}})
    notices = {n.instance_id: n for n in notices_from_spot_requests(rows, NOW)}
    assert notices.keys() == {"i-0", "i-1", "i-2", "i-3", "i-4"}
    assert notices["i-0"].terminate_at == NOW + 120 and notices["i-0"].notice_at == NOW
    assert notices["i-3"].terminate_at == NOW
    # Hibernation starts at once: no two minutes to spend.
    assert notices["i-2"].terminate_at == NOW

    aws.ec2.request_spot_instances(SpotPrice="1", InstanceCount=1,
                                   LaunchSpecification={"ImageId": aws.ami, "InstanceType": "g4dn.12xlarge"})
    moto_rows = aws.ec2.describe_spot_instance_requests()["SpotInstanceRequests"]
    assert moto_rows and notices_from_spot_requests(moto_rows, NOW) == []


def test_no_credentials_is_one_sentence(aws, tmp_path, monkeypatch):
    empty = tmp_path / "empty"
    empty.write_text("")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                 "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                 "AWS_CONTAINER_CREDENTIALS_FULL_URI"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(empty))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(empty))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")

    with pytest.raises(ProviderError) as raised:
        AwsProvider(JOB, endpoint_url=aws.endpoint).poll(NOW)  # its own session, reading this environment
    assert str(raised.value) == ("no AWS credentials found; configure them (aws configure, environment "
                                 "variables, or an instance role).")


def test_unreachable_endpoint_fails_quickly_naming_it(aws):
    closed = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()
    with pytest.raises(ProviderError, match="cannot reach the AWS endpoint") as raised:
        AwsProvider(JOB, endpoint_url=closed).poll(NOW)
    assert time.monotonic() - started < 10
    assert closed in str(raised.value) and "ec2:DescribeInstances" in str(raised.value)
    assert str(raised.value).count(". ") == 0 and str(raised.value).endswith(".")


def test_missing_queue_is_named(aws):
    missing = f"{aws.endpoint}/123456789012/no-such-queue"
    with pytest.raises(ProviderError) as raised:
        aws.provider(queue_url=missing).poll(NOW)
    assert str(raised.value) == f"the SQS queue {missing} does not exist; create it or fix the queue URL."


def test_options_are_checked():
    with pytest.raises(ValueError, match="host_name is 'public-dns'"):
        AwsProvider(JOB, host_name="public-dns", region="us-east-1")
    with pytest.raises(ValueError, match="slots is -1"):
        AwsProvider(JOB, slots=-1, region="us-east-1")


def test_importing_it_pulls_in_neither_torch_nor_horovod():
    assert heavy_modules_imported("transientvod.spot.providers.aws") == []
