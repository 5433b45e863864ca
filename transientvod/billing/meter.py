"""The bill of a job's servers, per second, revoked ones up to their revocation.

`CostMeter` is fed the job's membership events (a host joins the ring, leaves it, or is
known to be revoked at a later moment; an always-on coordinator or parameter server runs
throughout) and answers a `Bill` at any moment: what was spent, what the same billed seconds
would have cost on demand, and one line per server segment. Its `state()` is plain JSON, so
the training loop keeps it in its checkpoint and the meter survives a restart.

`billed_seconds` is the one rule of how long a server is billed for; the fleet and the
planner's simulation bill by it too. `usd_per_accuracy_point` is the study's yardstick.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass

from transientvod.billing.prices import PriceCatalog, checked_market, iso_utc
from transientvod.config import ON_DEMAND

# EC2 (Linux) and GCE bill per second with a minimum of one minute per server started.
MINIMUM_BILLED_SECONDS = 60.0


def billed_seconds(seconds: float, minimum: float = MINIMUM_BILLED_SECONDS) -> float:
    """Whole seconds the cloud bills for a server that ran `seconds`: max(minimum, ceil(seconds)).

    A partial second is billed as a whole one: AWS and GCE both bill in one-second
    increments, and rounding up errs on the side of the higher bill (the fleet's budget rule
    then starts less, never more). A host that leaves and comes back is a new server with a
    new minimum. Plain Python that numba can compile: the planner's simulation jits it.
    """
    # Rounded to microseconds first: 1090.1 - 1000.1 is 90.00000000000011 in floats, not 91 s.
    return max(minimum, float(math.ceil(round(seconds, 6))))


@dataclass(frozen=True)
class BillLine:
    """One server segment: a host from its join to its leave, or an always-on server."""

    host: str
    instance_type: str
    market: str
    start: float
    end: float | None  # None: still running at the bill's moment
    billed_seconds: float
    usd: float
    on_demand_usd: float  # the same billed seconds at the type's on-demand price
    always_on: bool = False


@dataclass(frozen=True)
class Bill:
    cost_usd: float
    on_demand_usd: float  # every line's billed seconds at its type's on-demand price
    savings_pct: float  # 100 x (1 - cost / on-demand); 0 when nothing was billed
    host_seconds: float  # billed seconds of every server, always-on ones included
    lines: tuple[BillLine, ...]


@dataclass
class _Segment:
    host: str
    instance_type: str
    market: str
    start: float
    end: float | None = None  # may lie in the future: a revoked host is billed until EC2/GCE takes it
    always_on: bool = False


class CostMeter:
    """Bills the job's servers per second from membership events.

    `join`/`leave` follow the hosts of the ring; repeating an event is a no-op that answers
    False (discovery reports the same membership many times). `add_always_on` bills a server
    on demand from a moment until `stop_always_on`. `bill(now)` answers what the cloud would
    charge if every running server ended now.
    """

    def __init__(self, catalog: PriceCatalog, minimum_billed_seconds: float = MINIMUM_BILLED_SECONDS):
        if not (isinstance(minimum_billed_seconds, (int, float)) and math.isfinite(minimum_billed_seconds)
                and minimum_billed_seconds >= 0):
            raise ValueError(f"minimum_billed_seconds is {minimum_billed_seconds!r}; it must be a number "
                             "of seconds, 0 or more.")
        self.catalog = catalog
        self.minimum_billed_seconds = float(minimum_billed_seconds)
        self._segments: list[_Segment] = []
        # The open segment of each host in the ring, and of each always-on server: two name
        # spaces, so that set_members never ends a parameter server.
        self._hosts: dict[str, _Segment] = {}
        self._always_on: dict[str, _Segment] = {}

    # --- membership ------------------------------------------------------------------------------

    def join(self, host: str, at: float, instance_type: str, market: str) -> bool:
        """Starts billing `host` at `at`; False if it is in already."""
        if host in self._hosts:
            return False
        self._start(self._hosts, _Segment(host, instance_type, market, float(at)))
        return True

    def leave(self, host: str, at: float) -> bool:
        """Ends `host`'s segment at `at`, which may lie in the future (a revoked host is billed
        until its revocation); False if the host is not in."""
        return self._end(self._hosts, host, at)

    def set_members(self, members: Mapping[str, tuple[str, str]], at: float) -> tuple[list[str], list[str]]:
        """Makes the ring `members` ({host: (instance_type, market)}) from `at` on: joins the new
        hosts, leaves the missing ones. Answers (joined, left)."""
        joined = [host for host, (instance_type, market) in members.items()
                  if self.join(host, at, instance_type, market)]
        left = [host for host in list(self._hosts) if host not in members and self.leave(host, at)]
        return joined, left

    def add_always_on(self, name: str, instance_type: str, at: float) -> bool:
        """Bills `name` on demand from `at` (a coordinator, a parameter server, a storage node);
        False if it runs already."""
        if name in self._always_on:
            return False
        self._start(self._always_on, _Segment(name, instance_type, ON_DEMAND, float(at), always_on=True))
        return True

    def stop_always_on(self, name: str, at: float) -> bool:
        return self._end(self._always_on, name, at)

    # --- the bill --------------------------------------------------------------------------------

    def billed_seconds(self, seconds: float) -> float:
        """Whole seconds the cloud bills for a segment of `seconds`, at this meter's minimum."""
        return billed_seconds(seconds, self.minimum_billed_seconds)

    def bill(self, now: float) -> Bill:
        """What the servers cost up to `now`: ended segments in full, running ones as if they
        ended now; segments that start after `now` are left out."""
        lines = []
        for segment in self._segments:
            if segment.start > now:
                continue
            ended = segment.end is not None and segment.end <= now
            end = segment.end if ended else now
            seconds = self.billed_seconds(end - segment.start)
            # The minimum is charged as if the server ran that long, at the prices of that time.
            billed_until = segment.start + seconds
            lines.append(BillLine(
                host=segment.host, instance_type=segment.instance_type, market=segment.market,
                start=segment.start, end=end if ended else None, billed_seconds=seconds,
                usd=self.catalog.cost(segment.instance_type, segment.market, segment.start, billed_until),
                on_demand_usd=self.catalog.on_demand_hourly(segment.instance_type) * seconds / 3600.0,
                always_on=segment.always_on))
        cost = sum(line.usd for line in lines)
        on_demand = sum(line.on_demand_usd for line in lines)
        savings = 100.0 * (1.0 - cost / on_demand) if on_demand > 0 else 0.0
        return Bill(cost_usd=cost, on_demand_usd=on_demand, savings_pct=savings,
                    host_seconds=sum(line.billed_seconds for line in lines), lines=tuple(lines))

    def running_usd_per_hour(self, now: float) -> float:
        """Dollars per hour of the servers running at `now` (started, not yet ended; a revoked
        host billed until a later revocation still runs), at their prices of that moment:
        what each further second of the job adds to the bill (billing/budget.py's projection)."""
        return sum(self.catalog.hourly(segment.instance_type, segment.market, now) for segment in self._segments
                   if segment.start <= now and (segment.end is None or segment.end > now))

    # --- surviving a restart ---------------------------------------------------------------------

    def state(self) -> dict:
        """Every segment, ended or running, as plain JSON data (kept in the job's checkpoint)."""
        return {"minimum_billed_seconds": self.minimum_billed_seconds,
                "segments": [asdict(segment) for segment in self._segments]}

    @classmethod
    def from_state(cls, catalog: PriceCatalog, state: Mapping) -> CostMeter:
        """The meter whose state() was `state`."""
        try:
            meter = cls(catalog, state["minimum_billed_seconds"])
            for fields in state["segments"]:
                segment = _Segment(**fields)
                meter._segments.append(segment)
                if segment.end is None:
                    (meter._always_on if segment.always_on else meter._hosts)[segment.host] = segment
        except (KeyError, TypeError) as e:
            raise ValueError(f"the cost meter state is not one that CostMeter.state() wrote ({e!r}).") from e
        return meter

    # --- segments ----------------------------------------------------------------------------------

    def _start(self, open_segments: dict[str, _Segment], segment: _Segment) -> None:
        # Priced now, so that a type or market the catalog cannot price fails at the join,
        # not at the end of the run.
        self.catalog.on_demand_hourly(segment.instance_type)
        checked_market(segment.market)
        open_segments[segment.host] = segment
        self._segments.append(segment)

    @staticmethod
    def _end(open_segments: dict[str, _Segment], name: str, at: float) -> bool:
        segment = open_segments.get(name)
        if segment is None:
            return False
        if at < segment.start:
            raise ValueError(f"{name} cannot leave at {iso_utc(at)}, before it joined at {iso_utc(segment.start)}.")
        segment.end = float(at)
        del open_segments[name]
        return True


def usd_per_accuracy_point(cost: float, accuracy: float) -> float:
    """The study's yardstick: dollars per point of top-1 accuracy (accuracy as 0..1)."""
    if not 0 < accuracy <= 1:
        raise ValueError(f"accuracy is {accuracy!r}; give it as a fraction above 0 and at most 1 (0.9123 for 91.23%).")
    return cost / (100.0 * accuracy)
