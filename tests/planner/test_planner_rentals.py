"""The planner's prices and GPU counts for what users rent today (planner/rentals.py): boto3
against a moto server on 127.0.0.1. What moto does: DescribeInstanceTypes answers its catalogue
of real instance types (GpuInfo included, except for the retired p3); DescribeSpotPriceHistory
answers one row per zone that offers the type, $0.00001 dated 2006-01-02, whatever the time
range: so every spot price here is 20 years old, which the age warning must say."""
from __future__ import annotations

from datetime import datetime, timezone

import pytest

from conftest import moto_aws
from transientvod.planner.rentals import (AWS_FAMILIES, AWS_ON_DEMAND_DATE, AWS_ON_DEMAND_USD_PER_HOUR,
                                          GCE_MACHINE_TYPES, GCE_TABLE_DATE, check_known, rent)
from transientvod.planner.study_data import PlanError

NOW = datetime(2026, 12, 7, tzinfo=timezone.utc).timestamp()
MOTO_SPOT_DATE = datetime(2006, 1, 2, 15, 4, 5, tzinfo=timezone.utc).timestamp()


@pytest.fixture(scope="module")
def moto(tmp_path_factory):
    import boto3

    with moto_aws(tmp_path_factory.mktemp("aws")) as url:
        yield url, boto3.session.Session()


def test_gpu_counts_from_describe_instance_types_and_spot_from_the_history(moto):
    url, session = moto
    names = ["g4dn.12xlarge", "g5.xlarge", "g6.xlarge", "p4d.24xlarge", "p5.48xlarge"]
    rentals, notes = rent(names, "us-east-1", url, session=session, now=NOW)
    assert {n: (r.gpu, r.gpus) for n, r in rentals.items()} == {
        "g4dn.12xlarge": ("T4", 4), "g5.xlarge": ("A10G", 1), "g6.xlarge": ("L4", 1), "p4d.24xlarge": ("A100", 8),
        "p5.48xlarge": ("H100", 8)}
    for name, rental in rentals.items():
        assert rental.spot.usd_per_hour == 0.00001 and rental.spot.dated == MOTO_SPOT_DATE
        assert "DescribeSpotPriceHistory, us-east-1, cheapest zone us-east-1" in rental.spot.source
        assert rental.on_demand.usd_per_hour == AWS_ON_DEMAND_USD_PER_HOUR[name]
        assert f"dated {AWS_ON_DEMAND_DATE}" in rental.on_demand.source
    # Every zone that offers g5.xlarge answered; the note lists them with their prices.
    g5 = next(line for line in notes if line.startswith("g5.xlarge:"))
    assert "1 x A10G" in g5 and g5.count("us-east-1") >= 5 and f"dated {AWS_ON_DEMAND_DATE}" in g5
    # Both prices of every type are older than 7 days, and the warning names the age.
    spot_age = (NOW - MOTO_SPOT_DATE) / 86400
    assert f"warning: the spot price of g5.xlarge is {spot_age:,.0f} days old (2006-01-02)" in "\n".join(notes)
    assert sum(line.startswith("warning: the on-demand price of") for line in notes) == len(names)


def test_a_fresh_price_gets_no_warning(moto):
    url, session = moto
    _, notes = rent(["g5.xlarge"], "us-east-1", url, session=session, now=MOTO_SPOT_DATE + 6 * 86400,
                    on_demand_prices={"g5.xlarge": 1.0})
    assert not [line for line in notes if line.startswith("warning")], notes


def test_an_empty_spot_history_is_one_sentence(moto):
    url, session = moto
    # moto's af-south-1 offers no g5.xlarge: EC2 answers no history rows.
    with pytest.raises(PlanError, match=r"^EC2's spot price history for g5.xlarge in af-south-1 is empty over the "
                                        r"last 7 days; it is not sold as spot there"):
        rent(["g5.xlarge"], "af-south-1", url, session=session, now=NOW, on_demand_prices={"g5.xlarge": 1.0})


def test_other_regions_need_a_price_table(moto):
    url, session = moto
    with pytest.raises(PlanError, match="built-in on-demand prices are us-east-1's, not eu-west-1's; give a price "
                                        "table with --prices CSV"):
        rent(["g5.xlarge"], "eu-west-1", url, session=session, now=NOW)


def test_a_type_ec2_does_not_know(moto):
    """p3 is a known family, but moto's catalogue has retired it: EC2's own answer, one sentence."""
    url, session = moto
    with pytest.raises(PlanError, match=r"^EC2 in us-east-1 does not know one of g5.xlarge, p3.2xlarge \(.*\); "
                                        r"check the names.$"):
        rent(["g5.xlarge", "p3.2xlarge"], "us-east-1", url, session=session, now=NOW)


@pytest.mark.parametrize("name", ["m5.xlarge", "g7.xlarge", "n1-standard-4", "t4", "g5"])
def test_unknown_types_name_the_known_families(name):
    with pytest.raises(PlanError) as raised:
        check_known(name)
    message = str(raised.value)
    assert message.startswith(f"GPU or instance type {name!r} is unknown; the planner knows AWS families")
    assert all(family in message for family in AWS_FAMILIES) and "a3-highgpu-8g" in message
    assert message.endswith("the study's k80, p100, v100.") and "\n" not in message  # one sentence


def test_gce_machine_types_from_the_dated_table():
    rentals, notes = rent(["g2-standard-4", "a2-highgpu-1g", "a3-highgpu-8g"], now=NOW)
    assert {n: (r.gpu, r.gpus) for n, r in rentals.items()} == {"g2-standard-4": ("L4", 1),
                                                                 "a2-highgpu-1g": ("A100", 1),
                                                                 "a3-highgpu-8g": ("H100", 8)}
    assert rentals["a3-highgpu-8g"].spot.usd_per_hour == GCE_MACHINE_TYPES["a3-highgpu-8g"][3]
    assert all(f"dated {GCE_TABLE_DATE}" in line for line in notes if not line.startswith("warning"))
    assert sum(line.startswith("warning") and "days old (2024-06-01)" in line for line in notes) == 6


# ---- simulate and plan with today's types, prices from moto -------------------------------------

def transientvod(*args):
    import subprocess

    from conftest import REPO, TRANSIENTVOD

    return subprocess.run(TRANSIENTVOD + list(args), capture_output=True, text=True, timeout=300, cwd=REPO)


def test_simulate_prices_an_aws_instance_from_ec2(moto):
    url, _ = moto
    done = transientvod("simulate", "--gpu", "g5.xlarge", "--workers", "2", "--market", "on-demand,spot",
                        "--speed", "g5.xlarge=10", "--steps", "36000", "--runs", "10", "--endpoint-url", url,
                        "--revocation-rate", "5-10")
    assert done.returncode == 0, done.stderr
    assert "g5.xlarge: 1 x A10G (DescribeInstanceTypes); on-demand $1.006/h" in done.stdout
    assert "warning: the spot price of g5.xlarge is" in done.stdout
    rows = {line.split()[3]: line.split() for line in done.stdout.splitlines() if line.startswith("2 x g5.xlarge")}
    # Columns after the five words of "2 x g5.xlarge on-demand (elastic)": fail %, revocations, time h, ...
    time_h, cost = float(rows["on-demand"][7]), float(rows["on-demand"][10])
    assert cost == pytest.approx(time_h * 2 * 1.006, abs=0.01)  # 2 instances at the table's price
    assert float(rows["spot"][10]) == 0.0  # moto's $0.00001 an hour


def test_plan_over_todays_types(moto):
    url, _ = moto
    done = transientvod("plan", "--figure", "", "--budget", "20", "--gpus", "g5.xlarge,a2-highgpu-1g",
                        "--speed", "g5.xlarge=10",
                        "--speed", "a2-highgpu-1g=25", "--revocation-rate", "<5", "--max-workers", "3", "--runs",
                        "200", "--endpoint-url", url)
    assert done.returncode == 0, done.stderr
    assert "revocations from an interruption rate of 0-5 % a month" in done.stdout and " wins: " in done.stdout
    assert "a2-highgpu-1g: 1 x A100; on-demand $3.6734/h (built-in us-central1 table, dated 2024-06-01)" in done.stdout


@pytest.mark.parametrize("args, sentence", [
    (["--gpu", "g5.xlarge", "--speed", "g5.xlarge=10"], "g5.xlarge has no revocation traces or lifetimes"),
    (["--gpu", "g5.xlarge", "--revocation-rate", "5-10"], "no speed is known for g5.xlarge"),
    (["--gpu", "m5.xlarge"], "GPU or instance type 'm5.xlarge' is unknown; the planner knows AWS families g4dn"),
    (["--gpu", "g5.xlarge", "--speed", "g5.xlarge=10", "--revocation-rate", "5-10", "--region", "af-south-1",
      "--prices", "PRICES"], "spot price history for g5.xlarge in af-south-1 is empty"),
])
def test_bad_input_is_one_sentence(moto, tmp_path, args, sentence):
    url, _ = moto
    prices = tmp_path / "prices.csv"
    prices.write_text("instance_type,on_demand_usd_per_hour\ng5.xlarge,1.1\n")
    done = transientvod("simulate", "--workers", "2", "--runs", "10", "--endpoint-url", url,
                        *[str(prices) if a == "PRICES" else a for a in args])
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and sentence in lines[0] and "Traceback" not in done.stderr, done.stderr


def test_a_runs_ranks_make_up_multi_gpu_instances():
    """--speed-from-run counts ranks (one a GPU): k instances of 4 GPUs train as 4k ranks did."""
    import numpy as np

    from transientvod.planner.rentals import Price, Rental
    from transientvod.planner.scenario import Simulator, Workload
    from transientvod.planner.speed import SpeedModel

    ranks = SpeedModel("g4dn.12xlarge", np.arange(17) * 2.0, "measured")  # 2 steps/s a rank, 0..16 ranks
    price = Price(3.912, NOW, "test")
    simulator = Simulator(Workload(speed_models={"g4dn.12xlarge": ranks}),
                          rentals={"g4dn.12xlarge": Rental("g4dn.12xlarge", "aws", "T4", 4, price, price)})
    instances = simulator.speed("g4dn.12xlarge")
    assert instances.max_workers == 4 and list(instances.steps_per_second) == [0.0, 8.0, 16.0, 24.0, 32.0]
