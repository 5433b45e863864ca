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

from dataclasses import dataclass

import numpy as np

from transientvod.planner.study_data import PlanError

MONTH_S = 30 * 24 * 3600.0
# The bands the Advisor publishes, as ranges; the open-ended "<5" is 0-5 and ">20" is 20-100
# (nothing narrower is known).
PUBLISHED_BANDS = {"<5": (0.0, 5.0), "5-10": (5.0, 10.0), "10-15": (10.0, 15.0), "15-20": (15.0, 20.0),
                   ">20": (20.0, 100.0)}


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
    """One of the Advisor's bands, '<5', '5-10', '10-15', '15-20' or '>20' (percent of servers
    interrupted a month; spaces and '%' allowed) -> RateBand. Anything else is refused: a band
    the Advisor does not publish (50-60, 7.5) would be a number nobody measured."""
    cleaned = str(text).strip().replace("%", "").replace(" ", "")
    if cleaned not in PUBLISHED_BANDS:
        raise PlanError(f"--revocation-rate {text!r} is not one of the Spot Instance Advisor's bands; give one of "
                        f"{', '.join(PUBLISHED_BANDS)} (percent of servers interrupted a month).")
    return RateBand(*PUBLISHED_BANDS[cleaned])
