"""The budget: the two rules that keep a job's whole bill within it, as pure functions.

The launch rule (a fleet, before it starts one more server) requires::

    spent + (committed_rate + price of the new server) * horizon_hours <= budget

that is, it never starts a server whose first horizon, together with everything already
running, could push the total past the budget.

The stop rule (the fleet at each pass, the training job at each commit vote) caps what runs.
The *projected spend* is

    projected = spent + running_usd_per_hour * lead_seconds / 3600

what was spent so far (every server billed up to now, the one-minute minimum included) plus
what the servers running now cost until the stop could take effect: `lead_seconds` is the
fleet's time to its next pass, or the job's time to commit, write a durable checkpoint and
end. Per-second billing makes this an upper bound of the bill at that moment (a server still
inside its billed minimum costs nothing more). Once the projection reaches the budget
(projected >= budget), the fleet terminates every instance and the job stops at a durable
checkpoint.

Pure functions of dollars and seconds, so that they are tested without a cloud; spot/provisioning/fleet.py
and accounting.py feed them what the servers cost (billed by meter.billed_seconds).
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

# How far ahead the budget rule looks: a launch must leave room for this many hours of
# everything running plus the new server. Override with TRANSIENTVOD_FLEET_HORIZON_HOURS.
BUDGET_HORIZON_HOURS = 1.0
HORIZON_ENVIRONMENT_VARIABLE = "TRANSIENTVOD_FLEET_HORIZON_HOURS"

# The training job's lead: the seconds from rank 0's verdict to the end of its servers' bill
# (the vote is answered a step later, then the commit, the durable checkpoint, horovodrun's
# exit and the launcher ending the instances). A large model written to S3 over a slow link
# needs more: override with TRANSIENTVOD_BUDGET_LEAD_SECONDS.
JOB_STOP_LEAD_SECONDS = 30.0
LEAD_ENVIRONMENT_VARIABLE = "TRANSIENTVOD_BUDGET_LEAD_SECONDS"


class BudgetError(ValueError):
    """A budget that cannot be kept: not positive, or spent already before anything starts."""


@dataclass(frozen=True)
class LaunchVerdict:
    allowed: bool
    projected_usd: float  # what the total could reach within the horizon if the server starts


@dataclass(frozen=True)
class StopVerdict:
    stop: bool
    projected_usd: float  # spent + what the running servers cost over the lead
    spent_usd: float
    running_usd_per_hour: float
    lead_seconds: float
    budget_usd: float | None


def budget_horizon_hours() -> float:
    """BUDGET_HORIZON_HOURS, or the hours TRANSIENTVOD_FLEET_HORIZON_HOURS sets."""
    return _environment_override(HORIZON_ENVIRONMENT_VARIABLE, BUDGET_HORIZON_HOURS, "hours")


def job_stop_lead_seconds() -> float:
    """JOB_STOP_LEAD_SECONDS, or the seconds TRANSIENTVOD_BUDGET_LEAD_SECONDS sets."""
    return _environment_override(LEAD_ENVIRONMENT_VARIABLE, JOB_STOP_LEAD_SECONDS, "seconds")


def _environment_override(name: str, default: float, unit: str) -> float:
    text = os.environ.get(name)
    if text is None or not text.strip():
        return default
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} is {text!r}; set it to a number of {unit}, 0 or more.")
    return value


def check_budget(budget_usd: float | None, name: str) -> None:
    """A budget is None (no limit) or a positive, finite number of dollars; BudgetError naming
    `name` (the flag or key the user wrote) otherwise."""
    if budget_usd is None:
        return
    if isinstance(budget_usd, bool) or not isinstance(budget_usd, (int, float)) or not math.isfinite(budget_usd) \
            or budget_usd <= 0:
        raise BudgetError(f"{name} is {budget_usd!r}; set it to the most the job may cost, a positive number "
                          "of dollars.")


def projected_spend(spent_usd: float, running_usd_per_hour: float, lead_seconds: float) -> float:
    """What the bill can reach before a stop decided now takes effect: the dollars spent so
    far plus `lead_seconds` of every server running now."""
    return spent_usd + running_usd_per_hour * lead_seconds / 3600.0


def stop_verdict(spent_usd: float, running_usd_per_hour: float, lead_seconds: float,
                 budget_usd: float | None) -> StopVerdict:
    """Whether to stop spending now: the projected spend has reached the budget (a projection
    exactly at the budget stops, since the servers cannot be ended before the lead is over).
    `budget_usd` None means no limit: never stop."""
    projected = projected_spend(spent_usd, running_usd_per_hour, lead_seconds)
    stop = budget_usd is not None and projected >= budget_usd
    return StopVerdict(stop, projected, spent_usd, running_usd_per_hour, lead_seconds, budget_usd)


def spent_at_start(spent_usd: float, budget_usd: float | None) -> bool:
    """A budget already spent before anything starts: what the job's servers cost already
    (found running or ended) is the budget or more."""
    return budget_usd is not None and spent_usd >= budget_usd


def launch_verdict(spent_usd: float, committed_usd_per_hour: float, new_usd_per_hour: float,
                   horizon_hours: float, budget_usd: float | None) -> LaunchVerdict:
    """Whether one more server at `new_usd_per_hour` may start, given the dollars spent so far
    and the $/hour of the servers running now; `budget_usd` None means no limit. A projection
    exactly at the budget is allowed."""
    projected = spent_usd + (committed_usd_per_hour + new_usd_per_hour) * horizon_hours
    return LaunchVerdict(budget_usd is None or projected <= budget_usd, projected)
