"""The budget rule a fleet keeps before it starts one more server.

Before each launch it requires::

    spent + (committed_rate + price of the new server) * horizon_hours <= budget

that is, it never starts a server whose first horizon, together with everything already
running, could push the total past the budget. The rule caps what is started, not what
runs: servers already running keep training (killing a worker mid-step loses work), so
stop the fleet once its spending nears the budget if that is a hard limit.

A pure function of dollars and hours, so that it is tested without a cloud; spot/fleet.py
feeds it what its instances cost (billed by meter.billed_seconds).
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

# How far ahead the budget rule looks: a launch must leave room for this many hours of
# everything running plus the new server. Override with TRANSIENTVOD_FLEET_HORIZON_HOURS.
BUDGET_HORIZON_HOURS = 1.0
HORIZON_ENVIRONMENT_VARIABLE = "TRANSIENTVOD_FLEET_HORIZON_HOURS"


@dataclass(frozen=True)
class LaunchVerdict:
    allowed: bool
    projected_usd: float  # what the total could reach within the horizon if the server starts


def budget_horizon_hours() -> float:
    """BUDGET_HORIZON_HOURS, or the hours TRANSIENTVOD_FLEET_HORIZON_HOURS sets."""
    text = os.environ.get(HORIZON_ENVIRONMENT_VARIABLE)
    if text is None or not text.strip():
        return BUDGET_HORIZON_HOURS
    try:
        hours = float(text)
    except ValueError:
        hours = math.nan
    if not math.isfinite(hours) or hours < 0:
        raise ValueError(f"{HORIZON_ENVIRONMENT_VARIABLE} is {text!r}; set it to a number of hours, 0 or more.")
    return hours


def launch_verdict(spent_usd: float, committed_usd_per_hour: float, new_usd_per_hour: float,
                   horizon_hours: float, budget_usd: float | None) -> LaunchVerdict:
    """Whether one more server at `new_usd_per_hour` may start, given the dollars spent so far
    and the $/hour of the servers running now; `budget_usd` None means no limit. A projection
    exactly at the budget is allowed."""
    projected = spent_usd + (committed_usd_per_hour + new_usd_per_hour) * horizon_hours
    return LaunchVerdict(budget_usd is None or projected <= budget_usd, projected)
