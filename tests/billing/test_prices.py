"""billing.prices: the catalog, price tables, and the spot price history (and a meter on it).

The AWS tests run boto3 against a moto server on 127.0.0.1. What moto does not do, and how
the tests cope:
- its spot price history is one fixed row per zone (price 0.00001, dated 2006) whatever the
  time range, so price changes over time are checked on hand-written rows (from_rows), and
  the plumbing test compares with what a plain boto3 call answers, not with a number;
- it ignores the AvailabilityZone parameter and answers every zone, which the history
  filters itself (and which, without a zone, gives the several-zones error for real);
- it has no p3.* rows, so the AWS tests use g4dn.xlarge.
"""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import boto3
import pytest

from conftest import free_port, moto_aws

from transientvod.billing.meter import CostMeter
from transientvod.billing.prices import PriceCatalog, PriceError, SpotPriceHistory, load_price_table

HOUR = 3600.0
K80_SPOT = 0.256
T0 = datetime(2024, 3, 1, 12, 0, tzinfo=timezone.utc)
UNIX0 = T0.timestamp()
GPU = "g4dn.xlarge"
ZONE = "us-east-1a"


def gce_meter() -> CostMeter:
    return CostMeter(PriceCatalog("gce"))


def spot_row(minutes: float, price: str, zone: str = ZONE, instance_type: str = GPU) -> dict:
    """One row as DescribeSpotPriceHistory answers it, `minutes` after T0."""
    return {"InstanceType": instance_type, "AvailabilityZone": zone, "SpotPrice": price,
            "Timestamp": T0 + timedelta(minutes=minutes), "ProductDescription": "Linux/UNIX"}


# --- the catalog -------------------------------------------------------------------------------

def test_gce_prices_are_the_studys_and_case_insensitive():
    catalog = PriceCatalog("gce")
    assert catalog.hourly("K80", "spot") == catalog.hourly("k80", "spot") == K80_SPOT
    assert catalog.on_demand_hourly("V100") == 2.144
    assert catalog.hourly("p100", "on-demand") == 1.43
    assert catalog.cost("ps", "spot", 0.0, 2 * HOUR) == pytest.approx(0.082)


def test_unknown_instance_type_names_it_and_where():
    with pytest.raises(PriceError, match=r"'a100'.*gce region us-east1.*k80, p100, ps, v100"):
        PriceCatalog("gce", region="us-east1").hourly("a100", "spot")
    with pytest.raises(PriceError, match=r"'x1.32xlarge'.*aws region us-east-1"):
        PriceCatalog("aws", region="us-east-1").on_demand_hourly("x1.32xlarge")
    # The built-in table holds us-east-1 list prices; elsewhere they would be wrong, not missing.
    with pytest.raises(PriceError, match=r"'p3.2xlarge'.*aws region eu-west-1.*price table"):
        PriceCatalog("aws", region="eu-west-1").on_demand_hourly("p3.2xlarge")
    # And a meter refuses the host at its join, not at the end of the run.
    with pytest.raises(PriceError, match="'a100'"):
        gce_meter().join("w1", 0.0, "a100", "spot")


def test_unknown_market_or_cloud():
    with pytest.raises(PriceError, match=r"market 'preemptible' is unknown; use one of spot, on-demand"):
        PriceCatalog("gce").hourly("k80", "preemptible")
    with pytest.raises(PriceError, match="market 'reserved'"):
        gce_meter().join("w1", 0.0, "k80", "reserved")
    with pytest.raises(PriceError, match="cloud 'azure' is unknown"):
        PriceCatalog("azure")


def test_aws_on_demand_table_and_overrides(tmp_path):
    table = tmp_path / "prices.csv"
    table.write_text("instance_type,on_demand_usd_per_hour\nP3.2xlarge,3.5\n\nx1.32xlarge,13.338\n")
    assert load_price_table(table) == {"p3.2xlarge": 3.5, "x1.32xlarge": 13.338}
    catalog = PriceCatalog("aws", on_demand_overrides=load_price_table(table))
    assert catalog.on_demand_hourly("p3.2xlarge") == 3.5
    assert catalog.on_demand_hourly("g5.xlarge") == 1.006
    assert PriceCatalog("aws", region="eu-west-1", on_demand_overrides={"p3.2xlarge": 3.823}).cost(
        "p3.2xlarge", "on-demand", UNIX0, UNIX0 + 1800) == pytest.approx(3.823 / 2)


@pytest.mark.parametrize("text, where", [
    ("type,price\np3.2xlarge,3\n", r"line 1: the header lacks instance_type, on_demand_usd_per_hour"),
    ("instance_type,on_demand_usd_per_hour\np3.2xlarge,3.06\ng5.xlarge,cheap\n", r"line 3: the price of g5.xlarge"),
    ("instance_type,on_demand_usd_per_hour\np3.2xlarge,-1\n", r"line 2: the price of p3.2xlarge is '-1'"),
    ("instance_type,on_demand_usd_per_hour\np3.2xlarge,3\np3.2xlarge,4\n", r"line 3: p3.2xlarge is priced twice"),
    ("instance_type,on_demand_usd_per_hour\n,3\n", r"line 2: the instance type is empty"),
])
def test_bad_price_table_names_the_file_and_line(tmp_path, text, where):
    table = tmp_path / "prices.csv"
    table.write_text(text)
    with pytest.raises(PriceError, match=f"price table {table}, {where}"):
        load_price_table(table)


def test_missing_price_table(tmp_path):
    with pytest.raises(PriceError, match=f"cannot read price table {tmp_path / 'nope.csv'}"):
        load_price_table(tmp_path / "nope.csv")


# --- spot price history on hand-written rows -----------------------------------------------------

def test_spot_price_changes_mid_segment_are_integrated_piecewise():
    rows = [spot_row(-60, "0.30"), spot_row(30, "0.60"), spot_row(45, "0.15"), spot_row(10, "0.90", zone="us-east-1b")]
    history = SpotPriceHistory.from_rows(rows, zone=ZONE)
    assert history.price_at(GPU, T0) == 0.30
    assert history.price_at("G4DN.XLARGE", T0 + timedelta(minutes=30)) == 0.60
    # 30 min at 0.30, 15 min at 0.60, 45 min at 0.15.
    assert history.cost(GPU, T0, T0 + timedelta(minutes=90)) == pytest.approx(0.15 + 0.15 + 0.1125)
    assert history.cost(GPU, T0 + timedelta(minutes=35), T0 + timedelta(minutes=40)) == pytest.approx(0.05)

    catalog = PriceCatalog("aws", spot_history=history)
    meter = CostMeter(catalog)
    meter.join("w1", UNIX0, GPU, "spot")
    meter.leave("w1", UNIX0 + 90 * 60)
    bill = meter.bill(UNIX0 + 2 * HOUR)
    assert bill.cost_usd == pytest.approx(0.4125)
    assert bill.on_demand_usd == pytest.approx(1.5 * 0.526)
    assert bill.savings_pct == pytest.approx(100 * (1 - 0.4125 / 0.789))
    # The one-minute minimum is charged at the prices of the minute after the join.
    meter.join("w2", UNIX0 + 29.5 * 60, GPU, "spot")
    meter.leave("w2", UNIX0 + 29.5 * 60 + 5)
    assert meter.bill(UNIX0 + 2 * HOUR).lines[1].usd == pytest.approx((30 * 0.30 + 30 * 0.60) / HOUR)


def test_spot_price_before_the_first_row_is_an_error():
    history = SpotPriceHistory.from_rows([spot_row(0, "0.30")], zone=ZONE)
    expected = r"no spot price of g4dn.xlarge in zone us-east-1a .* 2024-03-01T11:59:00\+00:00"
    with pytest.raises(PriceError, match=expected):
        history.price_at(GPU, T0 - timedelta(minutes=1))
    with pytest.raises(PriceError, match="no spot price"):
        history.cost(GPU, UNIX0 - 1, UNIX0 + 60)
    with pytest.raises(PriceError, match="no g5.xlarge rows"):
        history.price_at("g5.xlarge", T0)


def test_spot_prices_of_several_zones_need_a_zone():
    rows = [spot_row(0, "0.30"), spot_row(0, "0.20", zone="us-east-1b")]
    with pytest.raises(PriceError, match=r"several zones \(us-east-1a, us-east-1b\); set the zone"):
        SpotPriceHistory.from_rows(rows, region="us-east-1").price_at(GPU, T0)
    assert SpotPriceHistory.from_rows(rows, zone="us-east-1b").price_at(GPU, T0) == 0.20
    # One zone present: it is the zone.
    assert SpotPriceHistory.from_rows(rows[:1]).price_at(GPU, T0) == 0.30


# --- spot price history from a moto server ----------------------------------------------------------

@pytest.fixture(scope="module")
def moto(tmp_path_factory):
    """(url, session) of a moto server for this module."""
    with moto_aws(tmp_path_factory.mktemp("aws")) as url:
        yield url, boto3.session.Session()


def count_calls(session: boto3.session.Session) -> list:
    """Every DescribeSpotPriceHistory request the session's clients send from now on."""
    calls = []
    session.events.register("before-call.ec2.DescribeSpotPriceHistory", lambda **kwargs: calls.append(1))
    return calls


def test_spot_price_comes_from_describe_spot_price_history(moto):
    url, session = moto
    answered = session.client("ec2", endpoint_url=url).describe_spot_price_history(
        InstanceTypes=[GPU], ProductDescriptions=["Linux/UNIX"], StartTime=T0, EndTime=T0)["SpotPriceHistory"]
    expected = float(next(row["SpotPrice"] for row in answered if row["AvailabilityZone"] == ZONE))
    history = SpotPriceHistory(region="us-east-1", zone=ZONE, endpoint_url=url, session=session)
    catalog = PriceCatalog("aws", region="us-east-1", zone=ZONE, spot_history=history)
    assert catalog.hourly(GPU, "spot", T0) == expected
    assert catalog.cost(GPU, "spot", UNIX0, UNIX0 + 2 * HOUR) == pytest.approx(2 * expected)
    # moto answers every zone; without a zone the price is ambiguous.
    assert len({row["AvailabilityZone"] for row in answered}) > 1
    with pytest.raises(PriceError, match=r"several zones .* set the zone"):
        SpotPriceHistory(region="us-east-1", endpoint_url=url, session=session).price_at(GPU, T0)


def test_a_covered_time_range_is_not_fetched_again(moto):
    url, _ = moto
    session = boto3.session.Session()
    calls = count_calls(session)
    history = SpotPriceHistory(region="us-east-1", zone=ZONE, endpoint_url=url, session=session)
    history.cost(GPU, UNIX0, UNIX0 + HOUR)
    assert len(calls) == 1
    history.price_at(GPU, UNIX0 + 600)
    history.cost(GPU, UNIX0 + 60, UNIX0 + 1800)
    assert len(calls) == 1
    history.price_at(GPU, UNIX0 + 2 * HOUR)  # beyond what was fetched
    assert len(calls) == 2
    history.cost(GPU, UNIX0, UNIX0 + 2 * HOUR)
    assert len(calls) == 2


def test_recent_spot_prices_go_stale(moto):
    url, _ = moto
    session = boto3.session.Session()
    calls = count_calls(session)
    now = [UNIX0 + 100]
    history = SpotPriceHistory(region="us-east-1", zone=ZONE, endpoint_url=url, session=session,
                               clock=lambda: now[0])
    history.price_at(GPU, UNIX0 + 200)  # after the fetch: EC2 may change the price later
    history.price_at(GPU, UNIX0 + 200)
    assert len(calls) == 1
    now[0] += 3600
    history.price_at(GPU, UNIX0 + 200)
    assert len(calls) == 2


def test_aws_errors_are_one_sentence(moto, monkeypatch, tmp_path):
    _, session = moto
    unreachable = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(PriceError, match=r"cannot reach the AWS endpoint .* for ec2:DescribeSpotPriceHistory"):
        SpotPriceHistory(region="us-east-1", zone=ZONE, endpoint_url=unreachable, session=session).price_at(GPU, T0)
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    (tmp_path / "no-credentials").write_text("")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    with pytest.raises(PriceError, match="no AWS credentials found"):
        SpotPriceHistory(region="us-east-1", zone=ZONE, endpoint_url=unreachable).price_at(GPU, T0)
