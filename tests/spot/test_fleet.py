"""The dynamic cluster (transientvod.spot.provisioning.fleet) against a moto server on 127.0.0.1.

What moto does not do, and how the tests cope:
- it accepts any image id in RunInstances, so the fleet checks the image with DescribeImages
  (which moto answers InvalidAMIID.NotFound) before it launches anything;
- it accepts any instance type and never answers InsufficientInstanceCapacity,
  SpotMaxPriceTooLow or Unsupported, so falling back to the next type is not exercised;
- it never revokes a spot instance itself, so a test terminates one, as EC2 would;
- its LaunchTime has whole seconds and its state transition reason says "UTC" where EC2 says
  "GMT"; the fleet reads both.
"""
from __future__ import annotations

import threading
import time

import boto3
import pytest

from conftest import free_port, heavy_modules_imported, reset_moto

from transientvod.spot.providers.provider import ProviderError
from transientvod.spot.provisioning.fleet import Fleet
from transientvod.spot.provisioning.fleet_spec import FleetSpec

JOB = "resnet32-run7"
GPU = "g4dn.xlarge"
BIG_GPU = "g4dn.12xlarge"
PRICES = {GPU: 0.50, BIG_GPU: 3.00}


@pytest.fixture
def aws(ec2_moto, monkeypatch):
    """A fresh moto account for each test."""
    url, ami, session = ec2_moto
    monkeypatch.delenv("TRANSIENTVOD_FLEET_HORIZON_HOURS", raising=False)
    reset_moto(url)
    return Cloud(url, ami, session)


class Cloud:
    """The test's own boto3 client, playing EC2 (and the people and events around the fleet)."""

    def __init__(self, endpoint: str, ami: str, session: boto3.session.Session):
        self.endpoint = endpoint
        self.ami = ami
        self.session = session
        self.ec2 = session.client("ec2", endpoint_url=endpoint)

    def spec(self, **options) -> FleetSpec:
        values = {"job_tag": JOB, "instance_types": [GPU], "target": 3, "image_id": self.ami,
                  "hourly_price": dict(PRICES)}
        values.update(options)
        return FleetSpec(**values)

    def fleet(self, spec: FleetSpec | None = None, **options) -> Fleet:
        return Fleet(spec or self.spec(), endpoint_url=self.endpoint, session=self.session, **options)

    def launch(self, instance_type: str = GPU, job: str = JOB) -> str:
        """An instance someone started by hand, tagged for `job`."""
        return self.ec2.run_instances(
            ImageId=self.ami, MinCount=1, MaxCount=1, InstanceType=instance_type,
            TagSpecifications=[{"ResourceType": "instance", "Tags": [{"Key": "transientvod:job", "Value": job}]}],
        )["Instances"][0]["InstanceId"]

    def instances(self, job: str | None = JOB, states=("pending", "running")) -> dict[str, dict]:
        filters = [{"Name": "instance-state-name", "Values": list(states)}]
        if job is not None:
            filters.append({"Name": "tag:transientvod:job", "Values": [job]})
        reservations = self.ec2.describe_instances(Filters=filters)["Reservations"]
        return {i["InstanceId"]: i for r in reservations for i in r["Instances"]}

    def revoke(self, instance_id: str) -> None:
        """What EC2 does when it takes a spot instance back."""
        self.ec2.terminate_instances(InstanceIds=[instance_id])


class FakeClock:
    def __init__(self, now: float):
        self.now = now

    def __call__(self) -> float:
        return self.now


def dollars(seconds: float, price: float) -> float:
    return seconds / 3600.0 * price


def test_reconcile_from_empty_launches_the_target_as_tagged_spot_instances(aws):
    fleet = aws.fleet()

    actions = fleet.reconcile()

    assert [a.kind for a in actions] == ["launch"] * 3
    assert all(a.instance_type == GPU for a in actions)
    running = aws.instances()
    assert running.keys() == {a.instance_id for a in actions}
    for instance in running.values():
        tags = {t["Key"]: t["Value"] for t in instance["Tags"]}
        assert tags["transientvod:job"] == JOB and tags["Name"]
        assert instance["InstanceLifecycle"] == "spot"
        assert instance["ImageId"] == aws.ami and instance["InstanceType"] == GPU

    assert fleet.reconcile() == []
    assert len(aws.instances()) == 3
    assert fleet.committed_rate() == pytest.approx(3 * PRICES[GPU])


def test_a_revoked_instance_is_replaced_and_the_count_returns_to_target(aws):
    fleet = aws.fleet()
    fleet.reconcile()
    revoked = sorted(aws.instances())[0]

    aws.revoke(revoked)
    actions = fleet.reconcile()

    assert [a.kind for a in actions] == ["replace"]
    assert revoked in actions[0].reason and "terminated" in actions[0].reason
    running = aws.instances()
    assert len(running) == 3 and revoked not in running and actions[0].instance_id in running
    assert fleet.reconcile() == []


def test_budget_holds_launches_and_bills_per_second_with_a_one_minute_minimum(aws, monkeypatch):
    monkeypatch.setenv("TRANSIENTVOD_FLEET_HORIZON_HOURS", "1")
    clock = FakeClock(time.time())
    fleet = aws.fleet(aws.spec(budget=1.20), clock=clock)
    price = PRICES[GPU]

    # Launch 1: 0 + 0.50/h x 1 h = 0.50 fits; launch 2: one minute of the first (0.0083)
    # + 1.00/h x 1 h fits; launch 3: 0.0167 + 1.50 > 1.20 holds.
    actions = fleet.reconcile()
    assert [a.kind for a in actions] == ["launch", "launch", "hold"]
    hold = actions[-1]
    assert "$1.52" in hold.reason and "$1.20" in hold.reason and "2 of 3" in hold.reason
    running = aws.instances()
    assert len(running) == 2
    launched_at = {i: instance["LaunchTime"].timestamp() for i, instance in running.items()}
    assert fleet.spent() == pytest.approx(2 * dollars(60, price))  # seconds old: the minimum

    clock.now = max(launched_at.values()) + 600
    expected = sum(dollars(clock.now - t, price) for t in launched_at.values())
    assert fleet.spent() == pytest.approx(expected)
    assert fleet.committed_rate() == pytest.approx(2 * price)
    # 0.167 spent + 1.50/h x 1 h > 1.20: still holding.
    assert [a.kind for a in fleet.reconcile()] == ["hold"]

    # EC2 takes one back; it ran well under a minute by EC2's own clock, so it bills the minimum.
    revoked, kept = sorted(launched_at)
    aws.revoke(revoked)
    actions = fleet.reconcile()
    # 0.0083 + 0.0833 + 1.00/h x 1 h fits; then 0.1 + 1.50/h x 1 h does not.
    assert [a.kind for a in actions] == ["replace", "hold"]
    assert revoked in actions[0].reason
    replacement = aws.instances()[actions[0].instance_id]["LaunchTime"].timestamp()
    assert fleet.spent() == pytest.approx(dollars(60, price) + dollars(clock.now - launched_at[kept], price)
                                          + dollars(max(60, clock.now - replacement), price))


def test_a_partial_second_is_billed_whole_as_the_job_bill_does(aws):
    """The fleet bills by billing.meter.billed_seconds. Until it did, it billed the exact
    seconds past the minimum (90.4 s of an instance was 90.4 s; now 91 s, like the job's bill)."""
    clock = FakeClock(time.time())
    fleet = aws.fleet(aws.spec(target=1), clock=clock)
    [action] = fleet.reconcile()
    launched = aws.instances()[action.instance_id]["LaunchTime"].timestamp()
    price = PRICES[GPU]
    clock.now = launched + 90.4
    assert fleet.spent() == pytest.approx(dollars(91, price))
    assert fleet.spent() != pytest.approx(dollars(90.4, price))
    clock.now = launched + 59.4  # under a minute: the minimum, as before
    assert fleet.spent() == pytest.approx(dollars(60, price))


def test_dry_run_says_what_it_would_do_and_launches_nothing(aws):
    fleet = aws.fleet(aws.spec(budget=1.20), dry_run=True)

    actions = fleet.reconcile()

    # The budget rule counts the launches it only imagines.
    assert [a.kind for a in actions] == ["launch", "launch", "hold"]
    assert all(a.instance_id is None for a in actions)
    assert aws.instances(job=None, states=("pending", "running", "terminated")) == {}

    aws.launch()
    actions = fleet.terminate_all()
    assert [a.kind for a in actions] == ["terminate"]
    assert len(aws.instances()) == 1


def test_terminate_all_ends_every_instance_of_the_job_and_no_other(aws):
    by_hand = aws.launch()  # tagged for the job before the fleet started: it counts and it ends
    other_job = aws.launch(job="another-job")
    fleet = aws.fleet(aws.spec(target=2))

    assert [a.kind for a in fleet.reconcile()] == ["launch"]
    actions = fleet.terminate_all()

    assert [a.kind for a in actions] == ["terminate", "terminate"]
    assert by_hand in {a.instance_id for a in actions}
    assert aws.instances() == {}
    assert aws.instances(job="another-job").keys() == {other_job}
    assert fleet.committed_rate() == 0.0


def test_run_keeps_the_target_until_stopped_then_terminates_everything(aws):
    fleet = aws.fleet(aws.spec(target=2))
    stop = threading.Event()
    failures = []

    def run():
        try:
            fleet.run(poll_seconds=0.05, stop=stop)
        except BaseException as e:  # noqa: BLE001 (the test thread reports it)
            failures.append(e)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        running = wait_for(lambda: len(aws.instances()) == 2 and aws.instances())
        aws.revoke(sorted(running)[0])
        wait_for(lambda: len(aws.instances()) == 2 and sorted(running)[0] not in aws.instances())
    finally:
        stop.set()
        thread.join(timeout=20)
    assert not thread.is_alive() and failures == []
    assert aws.instances() == {}
    assert len(aws.instances(states=("shutting-down", "terminated"))) == 3


def test_ctrl_c_in_run_still_terminates_everything(aws):
    fleet = aws.fleet(aws.spec(target=1))
    calls = []

    def until():
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return False

    with pytest.raises(KeyboardInterrupt):
        fleet.run(poll_seconds=0.01, until=until)
    assert aws.instances() == {}
    assert len(aws.instances(states=("shutting-down", "terminated"))) == 1


def wait_for(condition, timeout: float = 15.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        answer = condition()
        if answer:
            return answer
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


def test_an_image_that_does_not_exist_is_named_before_anything_launches(aws):
    for dry_run in (False, True):
        fleet = aws.fleet(aws.spec(image_id="ami-12345678"), dry_run=dry_run)
        with pytest.raises(ProviderError) as raised:
            fleet.reconcile()
        assert str(raised.value) == ("the image ami-12345678 does not exist in region us-east-1; "
                                     "fix image_id or the region.")
    assert aws.instances(job=None) == {}


def test_prices_are_required_for_every_type_the_fleet_meets(aws):
    with pytest.raises(ValueError, match="'p3.2xlarge' has no price"):
        aws.spec(instance_types=[GPU, "p3.2xlarge"])
    aws.launch("m5.large")  # tagged for the job, of a type the spec does not price
    with pytest.raises(ValueError, match="is a m5.large, which hourly_price does not price"):
        aws.fleet().reconcile()
    assert len(aws.instances()) == 1


def test_spec_values_are_checked(aws):
    for options, message in [({"target": -1}, "target is -1"), ({"instance_types": []}, "instance_types is empty"),
                             ({"budget": 0}, "budget is 0"), ({"budget": -5.0}, "budget is -5.0"),
                             ({"hourly_price": {GPU: 0.0}}, "price of 'g4dn.xlarge' is 0.0"),
                             ({"job_tag": ""}, "job_tag is empty")]:
        with pytest.raises(ValueError, match=message):
            aws.spec(**options)


def test_a_broken_horizon_override_is_one_sentence(aws, monkeypatch):
    monkeypatch.setenv("TRANSIENTVOD_FLEET_HORIZON_HOURS", "soon")
    with pytest.raises(ValueError, match="TRANSIENTVOD_FLEET_HORIZON_HOURS is 'soon'"):
        aws.fleet()


def test_unreachable_endpoint_fails_quickly_naming_it(aws):
    closed = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()
    with pytest.raises(ProviderError, match="cannot reach the AWS endpoint") as raised:
        Fleet(aws.spec(), endpoint_url=closed).reconcile()
    assert time.monotonic() - started < 10
    assert closed in str(raised.value)
    assert str(raised.value).count(". ") == 0 and str(raised.value).endswith(".")


def test_no_credentials_is_one_sentence(aws, tmp_path, monkeypatch):
    empty = tmp_path / "empty"
    empty.write_text("")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                 "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                 "AWS_CONTAINER_CREDENTIALS_FULL_URI"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(empty))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(empty))

    with pytest.raises(ProviderError) as raised:
        Fleet(aws.spec(), endpoint_url=aws.endpoint).reconcile()  # its own session, reading this environment
    assert str(raised.value) == ("no AWS credentials found; configure them (aws configure, environment "
                                 "variables, or an instance role).")


def test_importing_it_pulls_in_neither_torch_nor_horovod():
    assert heavy_modules_imported("transientvod.spot.provisioning.fleet") == []


def test_an_error_in_run_still_terminates_everything(aws):
    fleet = aws.fleet(aws.spec(target=2))

    def until():
        raise RuntimeError("a bug in the caller")

    with pytest.raises(RuntimeError, match="a bug in the caller"):
        fleet.run(poll_seconds=0.01, until=until)
    assert aws.instances() == {}
    assert len(aws.instances(states=("shutting-down", "terminated"))) == 2


def tags_of(instance: dict) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in instance.get("Tags", [])}


def test_instances_launch_to_terminate_on_shutdown_with_their_tags_in_the_metadata(aws):
    # What the instance's watchdog needs: its shutdown ends the bill, and it reads the heartbeat tag.
    fleet = aws.fleet(aws.spec(target=2), clock=FakeClock(1_800_000_000.0))
    fleet.reconcile()
    for instance_id, instance in aws.instances().items():
        behaviour = aws.ec2.describe_instance_attribute(InstanceId=instance_id,
                                                        Attribute="instanceInitiatedShutdownBehavior")
        assert behaviour["InstanceInitiatedShutdownBehavior"]["Value"] == "terminate"
        assert instance["MetadataOptions"]["InstanceMetadataTags"] == "enabled"
        assert tags_of(instance)["transientvod:heartbeat"] == "1800000000"  # the first, from the launch


def test_each_pass_writes_the_heartbeat_on_every_live_instance_of_the_job(aws):
    clock = FakeClock(1_800_000_000.0)
    fleet = aws.fleet(aws.spec(target=2), clock=clock)
    fleet.reconcile()
    other_job = aws.launch(job="another-job")
    for now in (1_800_000_030.0, 1_800_000_060.0):
        clock.now = now
        assert fleet.reconcile() == []
        assert {tags_of(i)["transientvod:heartbeat"] for i in aws.instances().values()} == {str(int(now))}
    assert "transientvod:heartbeat" not in tags_of(aws.instances(job="another-job")[other_job])
    # An instance that ended gets no more heartbeats (and a replacement its first at launch).
    revoked = sorted(aws.instances())[0]
    aws.revoke(revoked)
    clock.now = 1_800_000_090.0
    assert [a.kind for a in fleet.reconcile()] == ["replace"]
    ended = aws.instances(states=("shutting-down", "terminated"))[revoked]
    assert tags_of(ended)["transientvod:heartbeat"] == "1800000060"
    assert {tags_of(i)["transientvod:heartbeat"] for i in aws.instances().values()} == {"1800000090"}


def test_a_dry_run_writes_no_heartbeat(aws):
    fleet = aws.fleet(aws.spec(target=1))
    fleet.reconcile()
    [instance_id] = aws.instances()
    dry = aws.fleet(aws.spec(target=1), dry_run=True, clock=FakeClock(1_900_000_000.0))
    assert dry.reconcile() == []
    assert tags_of(aws.instances()[instance_id])["transientvod:heartbeat"] != "1900000000"
