"""`transientvod fleet` from the command line, against a moto server on 127.0.0.1: what it
budgets each instance type at, and one sentence for each bad price."""
from __future__ import annotations

import subprocess

import pytest

from conftest import REPO, TRANSIENTVOD, reset_moto


@pytest.fixture
def fleet_cli(ec2_moto, monkeypatch):
    """Runs `transientvod fleet --dry-run` for a 3-instance job with a $1.20 budget."""
    url, ami, _ = ec2_moto
    monkeypatch.delenv("TRANSIENTVOD_FLEET_HORIZON_HOURS", raising=False)  # one hour ahead
    reset_moto(url)

    def run(*extra: str) -> subprocess.CompletedProcess:
        argv = TRANSIENTVOD + ["fleet", "--job-tag", "cli-job", "--target", "3", "--image-id", ami,
                               "--budget", "1.20", "--endpoint-url", url, "--dry-run", *extra]
        return subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=REPO)
    return run


def actions(done: subprocess.CompletedProcess) -> list[str]:
    return [line.split()[1] for line in done.stdout.splitlines() if line.startswith("would ")]


def test_a_type_without_a_price_is_budgeted_at_its_on_demand_price(fleet_cli):
    done = fleet_cli("--instance-types", "g4dn.xlarge")
    assert done.returncode == 0, done.stderr
    assert ("transientvod fleet: budgeting g4dn.xlarge at its on-demand $0.526/h in us-east-1, the most a spot "
            "instance costs at EC2's default maximum price; --price g4dn.xlarge=... budgets lower.") in done.stdout
    # Two at $0.526/h fit an hour of $1.20; a third would not.
    assert actions(done) == ["launch", "launch", "hold"]


def test_a_given_price_is_what_the_budget_uses(fleet_cli):
    done = fleet_cli("--instance-types", "g4dn.xlarge", "--price", "g4dn.xlarge=0.20")
    assert done.returncode == 0, done.stderr
    assert "budgeting" not in done.stdout
    assert actions(done) == ["launch", "launch", "launch"]


@pytest.mark.parametrize("extra, message", [
    (["--instance-types", "g9.huge"],
     "instance type 'g9.huge' has no --price and it is not in the built-in on-demand table; "
     "give --price g9.huge=DOLLARS_PER_HOUR."),
    (["--instance-types", "g4dn.xlarge", "--region", "eu-west-1"],
     "instance type 'g4dn.xlarge' has no --price and the built-in on-demand table covers aws us-east-1 only "
     "(this fleet runs in eu-west-1); give --price g4dn.xlarge=DOLLARS_PER_HOUR."),
    (["--instance-types", "g4dn.xlarge", "--price", "g4dn.xlarge:0.2"],
     "--price 'g4dn.xlarge:0.2' must look like INSTANCE_TYPE=DOLLARS_PER_HOUR, for example p3.2xlarge=0.918."),
    (["--instance-types", "g4dn.xlarge", "--price", "g4dn.xlarge=-1"],
     "the price of 'g4dn.xlarge' is -1.0; it must be a positive"),
])
def test_bad_prices_are_one_sentence(fleet_cli, extra, message):
    done = fleet_cli(*extra)
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert done.stderr.startswith(f"transientvod: {message}")
    assert actions(done) == []
