"""Revocations for a cloud without traces: a server's life from an interruption rate band.

    band = parse_band("5-10")              # EC2 Spot Instance Advisor: 5-10 % interrupted a month
    lives = band.sample(rng, (runs, 4))    # seconds from each server's start

EC2's Spot Instance Advisor publishes, per instance type and region, the band of the share of
instances interrupted in a month: < 5 %, 5-10 %, 10-15 %, 15-20 %, > 20 %. That is all it
says, so the model is the crudest one that matches it: each run draws its monthly rate p
uniformly in the band (the band is what is known), and each server lives an exponential
time with hazard -ln(1 - p) per 30 days, so that a share p of servers is interrupted within
a month. What a trace has and this lacks: revocations bunched in time and across servers
(several of one cluster at once), a hazard that changes with the server's age, the day and
the zone, and GCE's 24 h limit. Never imports torch or horovod.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from transientvod.planner.study_data import PlanError

MONTH_S = 30 * 24 * 3600.0
# The Advisor's open-ended bands as ranges: "<5" is 0-5, ">20" is 20-100 (nothing narrower is known).
OPEN_BANDS = {"<5": (0.0, 5.0), ">20": (20.0, 100.0)}


@dataclass(frozen=True)
class RateBand:
    """Monthly interruption rate between low_pct and high_pct (percent of servers)."""

    low_pct: float
    high_pct: float

    @property
    def label(self) -> str:
        return f"{self.low_pct:g}-{self.high_pct:g} % a month"

    def sample(self, rng: np.random.Generator, shape) -> np.ndarray:
        """Lives in seconds ([runs, ...]): one monthly rate per run, one exponential life per server."""
        shape = tuple(np.atleast_1d(shape))
        p = rng.uniform(self.low_pct, self.high_pct, shape[0]) / 100.0
        with np.errstate(divide="ignore"):
            hazard = -np.log1p(-p) / MONTH_S  # per second; inf at p = 1: every server goes at once
            scale = (1.0 / hazard).reshape((-1,) + (1,) * (len(shape) - 1))  # mean life; inf at p = 0
        unit = rng.exponential(1.0, shape)
        return np.where(np.isfinite(scale), unit * scale, np.where(scale == 0, 0.0, np.inf))


def parse_band(text: str) -> RateBand:
    """'5-10', '7.5', '<5' or '>20' (percent of servers interrupted a month) -> RateBand."""
    cleaned = str(text).strip().replace("%", "").replace(" ", "")
    if cleaned in OPEN_BANDS:
        return RateBand(*OPEN_BANDS[cleaned])
    if cleaned.startswith("-"):
        raise PlanError(f"--revocation-rate {text!r} must lie within 0-100 % (low first).")
    low, sep, high = cleaned.partition("-")
    try:
        low = float(low)
        high = float(high) if sep else low
    except ValueError:
        raise PlanError(f"--revocation-rate {text!r} must be a percentage of servers interrupted a month, or a band "
                        "such as 5-10, <5 or >20.") from None
    if not (math.isfinite(low) and math.isfinite(high) and 0 <= low <= high <= 100):
        raise PlanError(f"--revocation-rate {text!r} must lie within 0-100 % (low first).")
    return RateBand(low, high)
