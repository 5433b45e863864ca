"""billing.meter: per-second bills computed by hand, on the study's static GCE prices, and
billing.meter.billed_seconds, the one rule the fleet and the planner bill by too."""
from __future__ import annotations

import json

import pytest

from transientvod.billing.meter import (MINIMUM_BILLED_SECONDS, CostMeter, billed_seconds,
                                        usd_per_accuracy_point)
from transientvod.billing.prices import PriceCatalog

HOUR = 3600.0
K80_SPOT, K80_ON_DEMAND, PS_ON_DEMAND = 0.256, 0.723, 0.143


def gce_meter() -> CostMeter:
    return CostMeter(PriceCatalog("gce"))


# --- the rule ------------------------------------------------------------------------------------

@pytest.mark.parametrize("seconds, billed", [
    (0.0, 60.0), (10.0, 60.0), (59.999, 60.0), (60.0, 60.0),  # the one-minute minimum
    (60.2, 61.0), (90.4, 91.0), (3600.0001, 3601.0),  # a partial second is billed whole
    (1090.1 - 1000.1, 90.0),  # 90.00000000000011 in floats: not a started 91st second
    (-5.0, 60.0),  # clocks that disagree (EC2's LaunchTime vs ours): still the minimum
])
def test_billed_seconds_rounds_up_with_a_one_minute_minimum(seconds, billed):
    assert billed_seconds(seconds) == billed
    assert isinstance(billed_seconds(seconds), float)


def test_billed_seconds_takes_another_minimum():
    assert MINIMUM_BILLED_SECONDS == 60.0
    assert billed_seconds(10.2, minimum=0.0) == 11.0
    assert billed_seconds(10.2, minimum=120.0) == 120.0
    assert CostMeter(PriceCatalog("gce"), minimum_billed_seconds=0).billed_seconds(10.2) == 11.0


# --- bills computed by hand ---------------------------------------------------------------------

def test_two_hosts_joining_at_different_times():
    meter = gce_meter()
    assert meter.join("w1", 0.0, "k80", "spot")
    assert meter.join("w2", 100.0, "k80", "spot")
    bill = meter.bill(400.0)
    assert [(line.host, line.billed_seconds, line.end) for line in bill.lines] == [("w1", 400, None), ("w2", 300, None)]
    assert bill.host_seconds == 700
    assert bill.cost_usd == pytest.approx(700 * K80_SPOT / HOUR)
    assert bill.on_demand_usd == pytest.approx(700 * K80_ON_DEMAND / HOUR)


def test_revoked_host_is_billed_until_its_revocation():
    meter = gce_meter()
    meter.join("w1", 0.0, "k80", "spot")
    # The host leaves the ring at its notice; GCE takes it 30 s later, at 1000 s.
    assert meter.leave("w1", 1000.0)
    before = meter.bill(500.0)
    assert (before.lines[0].billed_seconds, before.lines[0].end) == (500, None)
    assert before.cost_usd == pytest.approx(500 * K80_SPOT / HOUR)
    after = meter.bill(2000.0)
    assert (after.lines[0].billed_seconds, after.lines[0].end) == (1000, 1000.0)
    assert after.cost_usd == pytest.approx(1000 * K80_SPOT / HOUR)


def test_running_usd_per_hour_counts_what_runs_at_that_moment():
    meter = gce_meter()
    meter.join("w1", 0.0, "k80", "spot")
    meter.join("w2", 100.0, "k80", "spot")
    meter.add_always_on("ps", "ps", 0.0)
    assert meter.running_usd_per_hour(50.0) == pytest.approx(K80_SPOT + PS_ON_DEMAND)  # w2 not yet started
    assert meter.running_usd_per_hour(200.0) == pytest.approx(2 * K80_SPOT + PS_ON_DEMAND)
    meter.leave("w1", 1000.0)  # revoked at 1000 s: it runs, and bills, until then
    assert meter.running_usd_per_hour(500.0) == pytest.approx(2 * K80_SPOT + PS_ON_DEMAND)
    assert meter.running_usd_per_hour(1000.0) == pytest.approx(K80_SPOT + PS_ON_DEMAND)
    meter.stop_always_on("ps", 1200.0)
    assert meter.running_usd_per_hour(1300.0) == pytest.approx(K80_SPOT)


def test_a_host_that_rejoins_is_a_new_server_with_its_own_minimum():
    meter = gce_meter()
    meter.join("w1", 0.0, "k80", "spot")
    meter.leave("w1", 10.0)
    assert meter.join("w1", 100.0, "k80", "spot")
    bill = meter.bill(130.0)
    assert [(line.start, line.end, line.billed_seconds) for line in bill.lines] == [(0.0, 10.0, 60), (100.0, None, 60)]
    assert bill.cost_usd == pytest.approx(120 * K80_SPOT / HOUR)


@pytest.mark.parametrize("start, end, billed", [(0.0, 90.2, 91), (0.0, 10.0, 60), (0.0, 60.0, 60), (0.0, 0.0, 60),
                                                (1000.1, 1090.1, 90), (5.0, 65.000001, 61)])
def test_per_second_rounding_with_a_one_minute_minimum(start, end, billed):
    meter = gce_meter()
    meter.join("w1", start, "p100", "on-demand")
    meter.leave("w1", end)
    bill = meter.bill(end + 1000)
    assert bill.lines[0].billed_seconds == billed
    assert bill.cost_usd == pytest.approx(billed * 1.43 / HOUR)
    assert bill.savings_pct == pytest.approx(0.0)


def test_always_on_server_is_billed_on_demand_until_stopped():
    meter = gce_meter()
    assert meter.add_always_on("ps", "ps", 0.0)
    assert not meter.add_always_on("ps", "ps", 5.0)
    meter.join("w1", 0.0, "k80", "spot")
    # The ring's membership never ends the parameter server.
    assert meter.set_members({}, 1800.0) == ([], ["w1"])
    assert meter.stop_always_on("ps", HOUR)
    bill = meter.bill(2 * HOUR)
    ps = [line for line in bill.lines if line.always_on]
    assert [(line.host, line.market, line.billed_seconds, line.usd) for line in ps] == [
        ("ps", "on-demand", HOUR, pytest.approx(PS_ON_DEMAND))]
    assert bill.cost_usd == pytest.approx(PS_ON_DEMAND + 0.5 * K80_SPOT)
    assert bill.on_demand_usd == pytest.approx(PS_ON_DEMAND + 0.5 * K80_ON_DEMAND)


def test_repeated_membership_events_are_no_ops():
    meter = gce_meter()
    assert meter.join("w1", 0.0, "k80", "spot")
    assert not meter.join("w1", 50.0, "k80", "spot")
    assert not meter.leave("w2", 50.0)
    assert meter.leave("w1", 100.0)
    assert not meter.leave("w1", 200.0)
    assert len(meter.bill(300.0).lines) == 1
    meter.join("w3", 100.0, "k80", "spot")
    with pytest.raises(ValueError, match="w3 cannot leave at .* before it joined"):
        meter.leave("w3", 50.0)


def test_set_members_joins_the_new_and_leaves_the_missing():
    meter = gce_meter()
    assert meter.set_members({"a": ("k80", "spot"), "b": ("k80", "spot")}, 0.0) == (["a", "b"], [])
    assert meter.set_members({"b": ("k80", "spot"), "c": ("v100", "on-demand")}, 600.0) == (["c"], ["a"])
    bill = meter.bill(1200.0)
    assert {(line.host, line.billed_seconds) for line in bill.lines} == {("a", 600), ("b", 1200), ("c", 600)}
    assert bill.cost_usd == pytest.approx(1800 * K80_SPOT / HOUR + 600 * 2.144 / HOUR)


def test_the_studys_four_k80_transient_run():
    """4 transient K80 workers and one on-demand PS for 1.05 h (ICAC 2019, Table: 4 K80 transient)."""
    meter = gce_meter()
    meter.add_always_on("ps", "PS", 0.0)
    meter.set_members({f"worker-{i}": ("K80", "spot") for i in range(4)}, 0.0)
    bill = meter.bill(1.05 * HOUR)
    assert bill.host_seconds == 5 * 3780
    assert bill.cost_usd == pytest.approx(1.22535)  # (4 x 0.256 + 0.143) x 1.05
    assert bill.on_demand_usd == pytest.approx(3.18675)  # (4 x 0.723 + 0.143) x 1.05
    # 100 x (1 - 1.167 / 3.035): the PS is on demand both ways.
    assert bill.savings_pct == pytest.approx(61.54859967, abs=1e-6)
    assert usd_per_accuracy_point(bill.cost_usd, 0.9123) == pytest.approx(1.22535 / 91.23)


def test_usd_per_accuracy_point_wants_a_fraction():
    assert usd_per_accuracy_point(2.83, 0.9307) == pytest.approx(2.83 / 93.07)
    for accuracy in (0.0, -0.5, 91.2):
        with pytest.raises(ValueError, match="accuracy"):
            usd_per_accuracy_point(1.0, accuracy)


def test_state_round_trip_gives_the_same_bill():
    meter = gce_meter()
    meter.add_always_on("ps", "ps", 0.0)
    meter.join("w1", 0.0, "k80", "spot")
    meter.join("w2", 10.0, "k80", "spot")
    meter.leave("w1", 500.0)
    meter.leave("w2", 5000.0)  # revoked later than the checkpoint
    meter.join("w3", 700.0, "v100", "on-demand")
    state = json.loads(json.dumps(meter.state()))
    restored = CostMeter.from_state(PriceCatalog("gce"), state)
    for now in (900.0, 6000.0):
        assert restored.bill(now) == meter.bill(now)
    # The restored meter goes on where the old one stopped.
    assert not restored.join("w3", 800.0, "v100", "on-demand")
    assert restored.leave("w3", 1000.0) and restored.stop_always_on("ps", 1000.0)
    assert restored.bill(6000.0).lines[-1].billed_seconds == 300
    with pytest.raises(ValueError, match="cost meter state"):
        CostMeter.from_state(PriceCatalog("gce"), {"segments": []})
