"""billing.budget: the fleet's budget rule as plain numbers (the fleet on moto is in
tests/spot/test_fleet.py), and the horizon's environment override."""
from __future__ import annotations

import pytest

from transientvod.billing.budget import (BUDGET_HORIZON_HOURS, HORIZON_ENVIRONMENT_VARIABLE, budget_horizon_hours,
                                         launch_verdict)


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
