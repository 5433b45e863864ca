"""billing.budget: the launch rule, the stop rule (projected spend) and the budget checks as
plain numbers (the fleet on moto is in tests/spot/test_fleet.py, the job's stop in
tests/billing/test_budget_stop.py), and the environment overrides."""
from __future__ import annotations

import pytest

from transientvod.billing.budget import (BUDGET_HORIZON_HOURS, HORIZON_ENVIRONMENT_VARIABLE, JOB_STOP_LEAD_SECONDS,
                                         LEAD_ENVIRONMENT_VARIABLE, BudgetError, budget_horizon_hours, check_budget,
                                         job_stop_lead_seconds, launch_verdict, projected_spend, spent_at_start,
                                         stop_verdict)


@pytest.mark.parametrize("spent, rate, price, hours, budget, allowed, projected", [
    (0.0, 0.0, 0.50, 1.0, 1.20, True, 0.50),  # the first server
    (0.0083, 0.50, 0.50, 1.0, 1.20, True, 1.0083),  # a second beside the first
    (0.0167, 1.00, 0.50, 1.0, 1.20, False, 1.5167),  # a third would break it: hold
    (0.20, 0.50, 0.50, 1.0, 1.20, True, 1.20),  # exactly at the budget is allowed
    (0.0, 0.50, 3.00, 0.0, 1.20, True, 0.0),  # a zero horizon looks only at what was spent
    (1.30, 0.0, 0.50, 0.0, 1.20, False, 1.30),  # ... and holds once that is over
    (100.0, 9.0, 9.0, 24.0, None, True, 532.0),  # no budget: no limit
])
def test_launch_verdict(spent, rate, price, hours, budget, allowed, projected):
    verdict = launch_verdict(spent, rate, price, hours, budget)
    assert verdict.allowed is allowed
    assert verdict.projected_usd == pytest.approx(projected)


def test_horizon_defaults_and_override(monkeypatch):
    monkeypatch.delenv(HORIZON_ENVIRONMENT_VARIABLE, raising=False)
    assert budget_horizon_hours() == BUDGET_HORIZON_HOURS == 1.0
    monkeypatch.setenv(HORIZON_ENVIRONMENT_VARIABLE, " ")
    assert budget_horizon_hours() == 1.0
    monkeypatch.setenv(HORIZON_ENVIRONMENT_VARIABLE, "0.25")
    assert budget_horizon_hours() == 0.25
    for text in ("soon", "-1", "inf", "nan"):
        monkeypatch.setenv(HORIZON_ENVIRONMENT_VARIABLE, text)
        with pytest.raises(ValueError, match=f"{HORIZON_ENVIRONMENT_VARIABLE} is '{text}'; set it to a number"):
            budget_horizon_hours()


# --- the stop rule: projected spend against the budget -------------------------------------------

@pytest.mark.parametrize("spent, rate, lead, budget, stop, projected", [
    (1.00, 3.60, 30.0, 2.00, False, 1.03),  # 30 s of $3.60/h is 3 cents: far from the budget
    (1.97, 3.60, 30.0, 2.00, True, 2.00),  # exactly at the budget: stop (the lead cannot be cut short)
    (1.96, 3.60, 30.0, 2.00, False, 1.99),  # a cent under it: not yet
    (2.50, 0.0, 30.0, 2.00, True, 2.50),  # nothing running, but spent past it already
    (1.99, 3.60, 0.0, 2.00, False, 1.99),  # no lead: only what was spent counts
    (100.0, 50.0, 3600.0, None, False, 150.0),  # no budget: never stop
])
def test_stop_verdict(spent, rate, lead, budget, stop, projected):
    verdict = stop_verdict(spent, rate, lead, budget)
    assert verdict.stop is stop
    assert verdict.projected_usd == pytest.approx(projected)
    assert projected_spend(spent, rate, lead) == pytest.approx(projected)
    assert (verdict.spent_usd, verdict.running_usd_per_hour, verdict.lead_seconds, verdict.budget_usd) == \
        (spent, rate, lead, budget)


def test_spent_at_start():
    assert spent_at_start(5.0, 5.0) and spent_at_start(5.01, 5.0)
    assert not spent_at_start(4.99, 5.0)
    assert not spent_at_start(1e9, None)


@pytest.mark.parametrize("budget", [0, 0.0, -1.5, float("nan"), float("inf"), True])
def test_a_budget_that_is_not_a_positive_number_is_one_sentence(budget):
    with pytest.raises(BudgetError) as e:
        check_budget(budget, "--budget")
    assert str(e.value) == (f"--budget is {budget!r}; set it to the most the job may cost, a positive number of "
                            "dollars.")


def test_positive_budgets_and_none_pass():
    for budget in (None, 0.01, 50, 1e6):
        check_budget(budget, "--budget")


def test_job_lead_defaults_and_override(monkeypatch):
    monkeypatch.delenv(LEAD_ENVIRONMENT_VARIABLE, raising=False)
    assert job_stop_lead_seconds() == JOB_STOP_LEAD_SECONDS == 30.0
    monkeypatch.setenv(LEAD_ENVIRONMENT_VARIABLE, "90")
    assert job_stop_lead_seconds() == 90.0
    monkeypatch.setenv(LEAD_ENVIRONMENT_VARIABLE, "-3")
    with pytest.raises(ValueError, match=f"{LEAD_ENVIRONMENT_VARIABLE} is '-3'; set it to a number of seconds"):
        job_stop_lead_seconds()
