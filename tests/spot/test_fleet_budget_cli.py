"""`transientvod fleet` and its budget from the command line, against a moto server on
127.0.0.1: no budget is refused unless --no-budget (which says what an hour costs), a bad or
spent budget is one sentence, and a run whose projected spend reaches the budget terminates
every instance and exits with code 4."""
from __future__ import annotations

import subprocess

import pytest

from conftest import REPO, TRANSIENTVOD, reset_moto

JOB = "budget-cli-job"
GPU = "g4dn.xlarge"


@pytest.fixture
def aws(ec2_moto, monkeypatch):
    url, ami, session = ec2_moto
    monkeypatch.delenv("TRANSIENTVOD_FLEET_HORIZON_HOURS", raising=False)
    reset_moto(url)
    return url, ami, session.client("ec2", endpoint_url=url)


def fleet_cli(url: str, ami: str, *extra: str, target: int = 3) -> subprocess.CompletedProcess:
    argv = TRANSIENTVOD + ["fleet", "--job-tag", JOB, "--target", str(target), "--image-id", ami,
                           "--endpoint-url", url, *extra]
    return subprocess.run(argv, capture_output=True, text=True, timeout=90, cwd=REPO)


def job_instances(ec2, states=("pending", "running")) -> dict[str, dict]:
    filters = [{"Name": "instance-state-name", "Values": list(states)},
               {"Name": "tag:transientvod:job", "Values": [JOB]}]
    return {i["InstanceId"]: i for r in ec2.describe_instances(Filters=filters)["Reservations"] for i in r["Instances"]}


def one_sentence(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    sentences = [line for line in done.stderr.splitlines() if line.startswith("transientvod: ")]
    assert len(sentences) == 1, done.stderr  # boto3's own log lines may come before it
    assert done.stderr.strip().splitlines()[-1] == sentences[0]
    return sentences[0]


def test_a_fleet_without_a_budget_is_refused_before_any_aws_call(aws):
    url, ami, ec2 = aws
    for run in ((), ("--dry-run",)):
        done = fleet_cli("http://127.0.0.1:9", ami, "--instance-types", GPU, "--price", f"{GPU}=0.5", *run)
        assert one_sentence(done) == (
            f"transientvod: the fleet of job {JOB} has no budget; give --budget DOLLARS, the most the whole job may "
            "cost (its instances already running included), or --no-budget to run without a limit.")
    assert job_instances(ec2, states=("pending", "running", "terminated")) == {}


def test_no_budget_says_what_an_hour_of_the_fleet_costs(aws):
    url, ami, _ = aws
    done = fleet_cli(url, ami, "--instance-types", f"{GPU},g5.xlarge", "--price", f"{GPU}=0.5",
                     "--price", "g5.xlarge=0.8", "--no-budget", "--dry-run")
    assert done.returncode == 0, done.stderr
    assert ("transientvod fleet: no budget (--no-budget): an hour of the fleet's 3 instances costs $1.50 (3 x "
            "g4dn.xlarge at $0.5/h), up to $2.40 if they are all g5.xlarge ($0.8/h), and nothing stops the spending "
            "but you.") in done.stdout.splitlines()
    assert [line.split()[1] for line in done.stdout.splitlines() if line.startswith("would ")] == ["launch"] * 3

    done = fleet_cli(url, ami, "--instance-types", GPU, "--price", f"{GPU}=0.25", "--no-budget", "--dry-run")
    assert ("transientvod fleet: no budget (--no-budget): an hour of the fleet's 3 instances costs $0.75 (3 x "
            "g4dn.xlarge at $0.25/h), and nothing stops the spending but you.") in done.stdout.splitlines()


@pytest.mark.parametrize("extra, message", [
    (["--budget", "0"], "--budget is 0.0; set it to the most the job may cost, a positive number of dollars."),
    (["--budget", "-3"], "--budget is -3.0; set it to the most the job may cost, a positive number of dollars."),
    (["--budget", "5", "--no-budget"], "--budget and --no-budget contradict each other; give one of them."),
])
def test_a_bad_budget_is_one_sentence(aws, extra, message):
    url, ami, ec2 = aws
    done = fleet_cli(url, ami, "--instance-types", GPU, "--price", f"{GPU}=0.5", *extra)
    assert one_sentence(done) == f"transientvod: {message}"
    assert job_instances(ec2, states=("pending", "running", "terminated")) == {}


def test_a_budget_spent_already_is_refused_and_nothing_is_launched(aws):
    url, ami, ec2 = aws
    tags = [{"ResourceType": "instance", "Tags": [{"Key": "transientvod:job", "Value": JOB}]}]
    by_hand = ec2.run_instances(ImageId=ami, MinCount=1, MaxCount=1, InstanceType=GPU,
                                TagSpecifications=tags)["Instances"][0]["InstanceId"]
    # $36/h: its first billed minute is $0.60, more than the $0.50 budget.
    for run in ((), ("--dry-run",)):
        done = fleet_cli(url, ami, "--instance-types", GPU, "--price", f"{GPU}=36", "--budget", "0.5", *run)
        assert one_sentence(done) == (
            f"transientvod: job {JOB} has cost $0.60 already (1 instances found, 1 of them pending or running), "
            "which is its budget of $0.50 or more; the fleet launched nothing: give a larger --budget.")
        assert "would launch" not in done.stdout
        assert job_instances(ec2).keys() == {by_hand}


def test_a_run_whose_projected_spend_reaches_the_budget_terminates_everything_and_says_so(aws, monkeypatch):
    url, ami, ec2 = aws
    # A zero launch horizon lets the first pass launch; at $3600/h one instance's billed minute
    # is $60, and the second pass projects $60 + half a second = $60.50 past the $60.40 budget.
    monkeypatch.setenv("TRANSIENTVOD_FLEET_HORIZON_HOURS", "0")
    done = fleet_cli(url, ami, "--instance-types", GPU, "--price", f"{GPU}=3600", "--budget", "60.4",
                     "--poll-seconds", "0.5", target=1)
    assert done.returncode == 4, done.stderr
    assert done.stdout.splitlines()[-1] == (
        f"transientvod fleet: job {JOB}'s projected spend $60.50 (spent $60.00 + $3600.00/h running for the next "
        "0.5 s) reached its budget of $60.40, so the fleet terminated every instance of the job and stopped.")
    assert job_instances(ec2) == {}
    assert len(job_instances(ec2, states=("shutting-down", "terminated"))) == 1
