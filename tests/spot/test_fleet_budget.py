"""The fleet's budget as a hard limit (spot/provisioning/fleet.py with billing/budget.py's stop rule),
against a moto server on 127.0.0.1 and a clock the test moves: the projected spend reaches
the budget and every instance ends; a budget spent already launches nothing."""
from __future__ import annotations

import time

import pytest
from test_fleet import GPU, JOB, PRICES, FakeClock, aws  # noqa: F401 (aws: the fixture)

from transientvod.billing.budget import BudgetError

HALF_AN_HOUR = 1800.0


def test_the_fleet_stops_and_terminates_everything_when_the_projected_spend_reaches_the_budget(aws, monkeypatch):
    # Half an hour of launch horizon lets two $0.50/h instances start under $1.00 (the launch
    # rule); the stop rule then ends them once an hour of both has been spent.
    monkeypatch.setenv("TRANSIENTVOD_FLEET_HORIZON_HOURS", "0.5")
    clock = FakeClock(time.time())
    fleet = aws.fleet(aws.spec(target=2, budget=1.00), clock=clock)
    passes = []

    def a_quarter_hour_later():
        """Called after each pass: the running instances and the bill, then 15 minutes pass."""
        passes.append((clock.now, len(aws.instances())))
        clock.now += 900.0
        return len(passes) > 20  # a fleet that never stops fails the assertions below

    fleet.run(poll_seconds=0.01, until=a_quarter_hour_later)

    verdict = fleet.budget_stop
    assert verdict is not None and verdict.stop
    # Passes at 0, 15, 30 and 45 minutes kept both; at 60 minutes the two had spent $1.00
    # (moto's whole-second LaunchTime is at most a second earlier than the clock's start).
    assert [running for _, running in passes] == [2, 2, 2, 2]
    assert verdict.budget_usd == 1.00
    assert 1.00 <= verdict.spent_usd <= 1.00 + 2 * PRICES[GPU] * 2 / 3600
    assert verdict.projected_usd >= verdict.spent_usd and verdict.running_usd_per_hour == 2 * PRICES[GPU]
    assert aws.instances() == {}  # nothing pending or running
    ended = aws.instances(states=("shutting-down", "terminated"))
    assert len(ended) == 2  # nothing was launched after the budget was reached


def test_a_budget_spent_already_is_refused_and_nothing_is_launched_or_ended(aws):
    by_hand = aws.launch()  # the job's instance, started before the fleet
    launched = aws.instances()[by_hand]["LaunchTime"].timestamp()
    clock = FakeClock(launched + 3600.0)  # an hour of $0.50/h: $0.50 spent
    fleet = aws.fleet(aws.spec(target=3, budget=0.50), clock=clock)

    with pytest.raises(BudgetError) as raised:
        fleet.run(poll_seconds=0.01)

    assert str(raised.value) == (f"job {JOB} has cost $0.50 already (1 instances found, 1 of them pending or "
                                 "running), which is its budget of $0.50 or more; the fleet launched nothing: give "
                                 "a larger --budget.")
    assert aws.instances().keys() == {by_hand}  # nothing launched, and the refusal ended nothing
    assert fleet.budget_stop is None


def test_without_a_budget_the_stop_rule_never_stops(aws):
    clock = FakeClock(time.time())
    fleet = aws.fleet(aws.spec(target=1), clock=clock)
    fleet.reconcile()
    clock.now += 100 * 3600.0
    verdict = fleet.budget_verdict(30.0)
    assert not verdict.stop and verdict.budget_usd is None
    assert verdict.spent_usd == pytest.approx(100 * PRICES[GPU], rel=1e-3)
    fleet.terminate_all()
