"""`transientvod status` and `transientvod down` from the command line, and the launcher's
end of a job's instances, against a moto server on 127.0.0.1 (EC2, SQS and S3).

moto marks a spot instance with InstanceLifecycle "spot" as EC2 does, keeps listing
terminated instances, and never interrupts one itself: the tests terminate or stop instances
as EC2 or a person would, and put EC2's interruption event in the queue as EventBridge does.
"""
from __future__ import annotations

import json
import subprocess
import time

import boto3
import pytest

from conftest import REPO, TRANSIENTVOD, reset_moto, wait_until

from transientvod.billing.meter import billed_seconds
from transientvod.config import Config
from transientvod.head.spot_watcher import end_job_instances, job_instances_ended_at_exit
from transientvod.spot.provisioning.fleet import Fleet
from transientvod.spot.provisioning.fleet_spec import FleetSpec
from transientvod.spot.provisioning.job_instances import ENDED_BY_TAG_KEY, JobInstances

JOB = "status-job"
GPU = "g4dn.xlarge"  # $0.526/h in the built-in on-demand table
ON_DEMAND_GPU = 0.526
BUCKET = "status-checkpoints"


@pytest.fixture
def aws(ec2_moto, monkeypatch):
    url, ami, session = ec2_moto
    monkeypatch.delenv("TRANSIENTVOD_FLEET_HORIZON_HOURS", raising=False)
    reset_moto(url)
    return Cloud(url, ami, session)


class Cloud:
    def __init__(self, url: str, ami: str, session: boto3.session.Session):
        self.url = url
        self.ami = ami
        self.session = session
        self.ec2 = session.client("ec2", endpoint_url=url)

    def launch(self, spot: bool = True, job: str = JOB) -> str:
        options = {"InstanceMarketOptions": {"MarketType": "spot"}} if spot else {}
        return self.ec2.run_instances(
            ImageId=self.ami, MinCount=1, MaxCount=1, InstanceType=GPU,
            TagSpecifications=[{"ResourceType": "instance", "Tags": [{"Key": "transientvod:job", "Value": job}]}],
            **options)["Instances"][0]["InstanceId"]

    def instances(self, states=("pending", "running", "stopping", "stopped"), job: str = JOB) -> dict[str, dict]:
        reservations = self.ec2.describe_instances(Filters=[
            {"Name": "tag:transientvod:job", "Values": [job]},
            {"Name": "instance-state-name", "Values": list(states)}])["Reservations"]
        return {i["InstanceId"]: i for r in reservations for i in r["Instances"]}

    def cli(self, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(TRANSIENTVOD + list(argv) + ["--endpoint-url", self.url], capture_output=True,
                              text=True, timeout=timeout, cwd=REPO)


def write_checkpoint(cloud: Cloud, step: int, world_sizes: list[int]) -> str:
    """A real checkpoint in moto's S3, written by the project's S3 store (as rank 0 writes one)."""
    import torch

    from transientvod.checkpoint.s3 import S3CheckpointStore

    cloud.session.client("s3", endpoint_url=cloud.url).create_bucket(Bucket=BUCKET)
    uri = f"s3://{BUCKET}/{JOB}"
    store = S3CheckpointStore(uri, endpoint_url=cloud.url)
    for at in (step - 50, step):
        store.save(at, {"model": {"w": torch.zeros(3)}, "progress": {"step": at, "world_sizes": world_sizes}},
                   "run: {}\n")
    return uri


def test_status_json_shows_instances_cost_step_and_world_size(aws):
    spot_ids = [aws.launch(), aws.launch()]
    on_demand = aws.launch(spot=False)
    checkpoint_dir = write_checkpoint(aws, step=150, world_sizes=[2, 3])
    before = time.time()
    done = aws.cli("status", "--job-tag", JOB, "--checkpoint-dir", checkpoint_dir, "--json")
    after = time.time()
    assert done.returncode == 0, done.stderr
    status = json.loads(done.stdout)
    by_id = {i["instance_id"]: i for i in status["instances"]}
    assert set(by_id) == {*spot_ids, on_demand}
    assert [by_id[i]["market"] for i in spot_ids] == ["spot", "spot"] and by_id[on_demand]["market"] == "on-demand"
    assert {i["state"] for i in by_id.values()} <= {"pending", "running"} and status["running"] == 3
    launched = {iid: i["LaunchTime"].timestamp() for iid, i in aws.instances().items()}
    for iid, line in by_id.items():
        # Billed from LaunchTime up to the moment status ran, by the one rule; priced as the fleet prices.
        assert billed_seconds(before - launched[iid] - 1) <= line["billed_seconds"] <= billed_seconds(after - launched[iid])
        assert line["usd_per_hour"] == ON_DEMAND_GPU and line["price_source"] == "on-demand table, aws us-east-1"
        assert line["usd"] == pytest.approx(line["billed_seconds"] / 3600 * ON_DEMAND_GPU)
    assert status["cost_usd"] > 0
    assert status["cost_usd"] == pytest.approx(sum(i["usd"] for i in by_id.values()))
    assert status["checkpoint"] == {"step": 150, "world_size": 3, "location": f"{checkpoint_dir}/step-000000150"}
    assert status["last_notice"] is None


def test_status_text_says_what_it_lacks_and_prices_given(aws):
    instance = aws.launch()
    done = aws.cli("status", "--job-tag", JOB, "--price", f"{GPU}=0.20")
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert f"job {JOB} in us-east-1" in text
    line = next(row for row in text.splitlines() if instance in row)
    assert f"{GPU}  spot  " in line and "at $0.2/h (--price)" in line
    assert "cost so far: $0.0" in text
    assert "checkpoint: no checkpoint dir given (--checkpoint-dir or --config)" in text
    assert ("last notice: none in spot request status, instance state; no notice queue given "
            "(--queue-url or --config)") in text


def test_status_reads_the_last_notice_from_the_queue_and_leaves_it_there(aws):
    instance = aws.launch()
    other_job = aws.launch(job="another-job")
    sqs = aws.session.client("sqs", endpoint_url=aws.url)
    queue = sqs.create_queue(QueueName=f"transientvod-{JOB}-notices")["QueueUrl"]
    for iid, when in ((other_job, "2026-12-07T05:00:09Z"), (instance, "2026-12-07T05:00:00Z")):
        sqs.send_message(QueueUrl=queue, MessageBody=json.dumps({
            "source": "aws.ec2", "detail-type": "EC2 Spot Instance Interruption Warning", "time": when,
            "detail": {"instance-id": iid, "instance-action": "terminate"}}))
    done = aws.cli("status", "--job-tag", JOB, "--queue-url", queue, "--json")
    assert done.returncode == 0, done.stderr
    # The other job's later notice is not this job's.
    assert json.loads(done.stdout)["last_notice"] == {
        "instance_id": instance, "reason": "EC2 Spot Instance Interruption Warning",
        "at": "2026-12-07T05:00:00+00:00", "source": "notice queue"}
    left = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["ApproximateNumberOfMessages"])
    assert left["Attributes"]["ApproximateNumberOfMessages"] == "2"  # the watcher still gets both


def test_down_ends_every_instance_then_says_nothing_was_running(aws):
    running = [aws.launch(), aws.launch(spot=False)]
    stopped = aws.launch(spot=False)
    aws.ec2.stop_instances(InstanceIds=[stopped])
    bystander = aws.launch(job="another-job")
    done = aws.cli("down", "--job-tag", JOB, "--json")
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert {e["instance_id"] for e in answer["ended"]} == {*running, stopped}
    assert answer["message"].startswith(f"down terminated 3 instances of job {JOB}: ")
    assert aws.instances() == {}
    ended = aws.instances(states=("shutting-down", "terminated"))
    assert set(ended) == {*running, stopped}
    assert all({"Key": ENDED_BY_TAG_KEY, "Value": "down"} in i["Tags"] for i in ended.values())
    assert set(aws.instances(job="another-job")) == {bystander}

    # status, after: nothing running, the ended ones still listed and billed up to their end.
    after = json.loads(aws.cli("status", "--job-tag", JOB, "--json").stdout)
    assert after["running"] == 0
    assert {i["instance_id"]: i["ended_by"] for i in after["instances"]} == dict.fromkeys([*running, stopped], "down")
    assert all(i["state"] in ("shutting-down", "terminated") and i["billed_seconds"] >= 60 for i in after["instances"])

    again = aws.cli("down", "--job-tag", JOB)
    assert again.returncode == 0, again.stderr
    assert again.stdout == (f"transientvod down: job {JOB} has no instance pending, running, stopping or "
                            "stopped; nothing to end.\n")


def test_down_without_a_job_tag_or_endpoint_is_one_sentence(aws):
    done = subprocess.run(TRANSIENTVOD + ["down"], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 2
    assert done.stderr == ("transientvod: down needs the job's tag; give --job-tag JOB (the value of the "
                           "transientvod:job tag) or --config FILE with spot.job_tag.\n")
    unreachable = subprocess.run(TRANSIENTVOD + ["down", "--job-tag", JOB, "--endpoint-url", "http://127.0.0.1:9"],
                                 capture_output=True, text=True, timeout=60, cwd=REPO)
    assert unreachable.returncode == 2
    # The last line is the sentence; no traceback (botocore's own INFO log line may come before it).
    assert "Traceback" not in unreachable.stderr
    assert unreachable.stderr.strip().splitlines()[-1].startswith(
        "transientvod: cannot reach the AWS endpoint http://127.0.0.1:9")


def test_down_stops_a_running_fleet_which_launches_no_replacement(aws):
    fleet = subprocess.Popen(
        TRANSIENTVOD + ["fleet", "--job-tag", JOB, "--instance-types", GPU, "--price", f"{GPU}=0.5", "--target", "2",
                        "--image-id", aws.ami, "--budget", "10", "--endpoint-url", aws.url, "--poll-seconds", "0.5",
                        "--instance-profile", "none"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        wait_until(lambda: len(aws.instances(states=("pending", "running"))) == 2 or fleet.poll() is not None,
                   timeout=60, what="the fleet's two instances")
        assert fleet.poll() is None, fleet.communicate()
        launched = set(aws.instances(states=("pending", "running")))
        done = aws.cli("down", "--job-tag", JOB)
        assert done.returncode == 0, done.stderr
        assert f"down terminated 2 instances of job {JOB}" in done.stdout
        out, err = fleet.communicate(timeout=60)
    finally:
        if fleet.poll() is None:
            fleet.kill()
            fleet.communicate()
    assert fleet.returncode == 0, err
    assert (f"transientvod fleet: job {JOB} was ended by transientvod down (instance "
            in out), out
    assert "the fleet stopped and terminated the rest." in out
    assert aws.instances() == {}
    # Nothing was launched after the two that down ended.
    assert set(aws.instances(states=("pending", "running", "stopping", "stopped", "shutting-down",
                                     "terminated"))) == launched


def test_a_new_fleet_is_not_stopped_by_an_earlier_down(aws):
    aws.launch()
    JobInstances(JOB, endpoint_url=aws.url, session=aws.session).end_all(by="down")
    spec = FleetSpec(job_tag=JOB, instance_types=[GPU], target=1, image_id=aws.ami, hourly_price={GPU: 0.5})
    fleet = Fleet(spec, endpoint_url=aws.url, session=aws.session)
    actions = fleet.reconcile()
    assert [a.kind for a in actions] == ["launch"] and fleet.ended_by is None
    # A down after the fleet's first pass stops it.
    JobInstances(JOB, endpoint_url=aws.url, session=aws.session).end_all(by="down")
    assert fleet.reconcile() == [] and fleet.ended_by[0] == "down"
    fleet.terminate_all()


def aws_job_config(aws: Cloud, **spot) -> Config:
    config = Config()
    config.spot.provider = "aws"
    config.spot.job_tag = JOB
    config.spot.endpoint_url = aws.url
    for name, value in spot.items():
        setattr(config.spot, name, value)
    return config


def test_the_launcher_ends_the_jobs_instances_when_the_job_fails(aws, capsys):
    ids = {aws.launch(), aws.launch(spot=False)}
    with pytest.raises(KeyboardInterrupt), job_instances_ended_at_exit(aws_job_config(aws)):
        raise KeyboardInterrupt  # Ctrl-C while horovodrun runs
    assert aws.instances() == {}
    ended = aws.instances(states=("shutting-down", "terminated"))
    assert set(ended) == ids
    assert all({"Key": ENDED_BY_TAG_KEY, "Value": "launcher"} in i["Tags"] for i in ended.values())
    out = capsys.readouterr().out
    assert out.startswith(f"transientvod: the job ended; the launcher terminated 2 instances of job {JOB}: ")
    # Nothing left: one sentence that says so.
    assert end_job_instances(aws_job_config(aws)) == []
    assert "nothing to end" in capsys.readouterr().out


def test_the_launcher_keeps_the_instances_when_told_to(aws):
    ids = {aws.launch()}
    with job_instances_ended_at_exit(aws_job_config(aws, end_instances_at_exit=False)):
        pass
    assert set(aws.instances()) == ids


def test_an_unreachable_cloud_at_the_end_is_one_sentence_naming_down(aws, capsys):
    config = aws_job_config(aws, endpoint_url="http://127.0.0.1:9")
    assert end_job_instances(config) == []
    err = capsys.readouterr().err
    assert err.startswith(f"transientvod: could not end the instances of job {JOB} (cannot reach the AWS endpoint")
    assert err.endswith(f"run 'transientvod down --job-tag {JOB}'.\n") and len(err.splitlines()) == 1


def test_the_shared_module_imports_neither_torch_nor_horovod():
    from conftest import heavy_modules_imported

    assert heavy_modules_imported("transientvod.spot.provisioning.job_instances", "transientvod.spot.provisioning.job_status") == []


def test_status_finds_the_job_its_checkpoints_and_queue_through_the_config(aws, tmp_path):
    import yaml

    instance = aws.launch()
    checkpoint_dir = write_checkpoint(aws, step=80, world_sizes=[4])
    queue = aws.session.client("sqs", endpoint_url=aws.url).create_queue(QueueName="status-notices")["QueueUrl"]
    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump({
        "spot": {"provider": "aws", "job_tag": JOB, "region": "us-east-1", "endpoint_url": aws.url,
                 "queue_url": queue},
        "checkpoint": {"dir": checkpoint_dir}}))
    done = subprocess.run(TRANSIENTVOD + ["status", "--config", str(config), "--json"], capture_output=True,
                          text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr
    status = json.loads(done.stdout)
    assert [i["instance_id"] for i in status["instances"]] == [instance]
    assert status["checkpoint"] == {"step": 80, "world_size": 4, "location": f"{checkpoint_dir}/step-000000080"}
    assert status["notice_sources"] == ["spot request status", "instance state", "notice queue"]


def test_status_of_a_local_checkpoint_dir_not_there_says_so_and_makes_nothing(aws, tmp_path):
    missing = tmp_path / "checkpoints"
    done = aws.cli("status", "--job-tag", JOB, "--checkpoint-dir", str(missing))
    assert done.returncode == 0, done.stderr
    assert f"checkpoint: no checkpoint in {missing} yet" in done.stdout
    assert "instances: none (EC2 lists no instance tagged transientvod:job=status-job in us-east-1)" in done.stdout
    assert not missing.exists()


@pytest.mark.slow
def test_a_failed_aws_job_started_by_train_ends_its_instances(aws, job):
    """A whole `transientvod train` with spot.provider aws: its only instance is stopped, so no
    host ever joins and horovodrun gives up after cluster.elastic_timeout; the launcher's end
    then terminates the stopped instance (it would bill its disks, and could be started again)."""
    stopped = aws.launch()
    aws.ec2.stop_instances(InstanceIds=[stopped])
    bystander = aws.launch(job="another-job")
    tiny = job("aws-end", spot={"provider": "aws", "job_tag": JOB, "region": "us-east-1", "endpoint_url": aws.url},
               cluster={"min_np": 1, "max_np": 1, "elastic_timeout": 5, "network_interface": "lo"},
               tracking={"enabled": False})
    done = tiny.run(timeout=240)
    assert done.returncode != 0
    assert "fewer than cluster.min_np (1) workers" in done.stderr, done.stderr[-3000:]
    assert (f"transientvod: the job ended; the launcher terminated 1 instance of job {JOB}: {stopped} "
            f"({GPU}, stopped).") in done.stdout, done.stdout[-3000:]
    ended = aws.instances(states=("shutting-down", "terminated"))
    assert set(ended) == {stopped}
    assert {"Key": ENDED_BY_TAG_KEY, "Value": "launcher"} in ended[stopped]["Tags"]
    assert set(aws.instances(job="another-job")) == {bystander}
