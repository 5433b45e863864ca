"""What one server costs per hour, and over an interval, on one cloud.

`PriceCatalog` answers with the study's static GCE prices, or with AWS on-demand list
prices (a built-in us-east-1 table, or a CSV price table from `load_price_table`) plus the
spot price history EC2 publishes (`SpotPriceHistory`, which integrates the
piecewise-constant spot price over time). The per-second bill with its minimum is meter.py's.

Times are unix seconds (floats); the catalog and the spot history also take datetimes.
Never imports torch or horovod: the launcher side imports this module too.
"""
from __future__ import annotations

import bisect
import csv
import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone

import botocore.exceptions

from transientvod.aws_clients import aws_client, aws_error_sentence
from transientvod.config import CLOUDS, MARKETS, ON_DEMAND, SPOT

# The study's GCE prices, $/hour (Li, Walls, Xu, Guo, "Speeding up Deep Learning with
# Transient Servers", ICAC 2019; shared/data/gce-2019/README.md). Static: GCE preemptible
# prices did not move then, so a run's cost is price x billed seconds.
GCE_ON_DEMAND_USD_PER_HOUR = {"k80": 0.723, "p100": 1.43, "v100": 2.144, "ps": 0.143}
GCE_SPOT_USD_PER_HOUR = {"k80": 0.256, "p100": 0.551, "v100": 0.861, "ps": 0.041}

# A snapshot of AWS on-demand list prices, Linux, region us-east-1, $/hour. List prices
# change and differ by region: pass your own with on_demand_overrides=load_price_table(path).
# The table is used only for us-east-1 (or no region given); other regions need a price table.
AWS_PRICE_TABLE_REGION = "us-east-1"
AWS_ON_DEMAND_USD_PER_HOUR = {
    "p3.2xlarge": 3.06, "p3.8xlarge": 12.24, "p3.16xlarge": 24.48,
    "g4dn.xlarge": 0.526, "g4dn.2xlarge": 0.752, "g4dn.12xlarge": 3.912,
    "g5.xlarge": 1.006, "g5.2xlarge": 1.212, "g5.12xlarge": 5.672,
    "c5.xlarge": 0.17, "m5.xlarge": 0.192,
}

PRICE_TABLE_COLUMNS = ("instance_type", "on_demand_usd_per_hour")

# A spot price history fetched from AWS is trusted this long for moments after the fetch:
# EC2 changes spot prices a few times a day at most, and a meter asked for a bill every few
# seconds must not call AWS every time.
SPOT_PRICE_FRESH_SECONDS = 300.0


class PriceError(ValueError):
    """A server cannot be priced (unknown instance type, cloud or market, a broken price
    table, no spot price history for the moment, AWS unreachable); one sentence naming what to fix."""


def _unix(moment) -> float:
    """Unix seconds of a float or a datetime (a naive datetime is UTC, as AWS speaks)."""
    if isinstance(moment, datetime):
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=timezone.utc)
        return moment.timestamp()
    return float(moment)


def iso_utc(unix_seconds: float) -> str:
    return datetime.fromtimestamp(unix_seconds, timezone.utc).isoformat()


def _check_price(price, what: str) -> float:
    """`price` as a finite, non-negative $/hour, or PriceError naming `what`."""
    try:
        value = float(price)
    except (TypeError, ValueError):
        raise PriceError(f"{what} is {price!r}; it must be a number of dollars per hour.") from None
    if not math.isfinite(value) or value < 0:
        raise PriceError(f"{what} is {price!r}; it must be a dollar amount per hour, 0 or more.")
    return value


def checked_market(market: str) -> str:
    if market not in MARKETS:
        raise PriceError(f"market {market!r} is unknown; use one of {', '.join(MARKETS)}.")
    return market


def load_price_table(path) -> dict[str, float]:
    """On-demand $/hour per instance type from a CSV file with the header
    ``instance_type,on_demand_usd_per_hour`` (type names are lower-cased)."""
    try:
        with open(path, newline="") as file:
            reader = csv.DictReader(file)
            columns = [c.strip() for c in reader.fieldnames or []]
            missing = [c for c in PRICE_TABLE_COLUMNS if c not in columns]
            if missing:
                raise PriceError(f"price table {path}, line 1: the header lacks {', '.join(missing)}; "
                                 f"it must be {','.join(PRICE_TABLE_COLUMNS)}.")
            reader.fieldnames = columns
            prices = {}
            for row in reader:
                where = f"price table {path}, line {reader.line_num}"
                if not any((value or "").strip() for value in row.values()):
                    continue  # a blank line
                instance_type = (row["instance_type"] or "").strip().lower()
                if not instance_type:
                    raise PriceError(f"{where}: the instance type is empty.")
                if instance_type in prices:
                    raise PriceError(f"{where}: {instance_type} is priced twice; keep one row.")
                prices[instance_type] = _check_price((row["on_demand_usd_per_hour"] or "").strip(),
                                                     f"{where}: the price of {instance_type}")
    except OSError as e:
        raise PriceError(f"cannot read price table {path} ({e.strerror or e}); fix the path.") from e
    except (csv.Error, UnicodeDecodeError) as e:
        raise PriceError(f"price table {path} is not a readable CSV file ({e}).") from e
    return prices


@dataclass(frozen=True)
class _SpotRows:
    """The spot price history of one (instance type, zone) known for [covered_from, covered_to]."""

    moments: tuple[float, ...]  # unix seconds, ascending
    prices: tuple[float, ...]  # $/hour from each moment on
    zones: frozenset[str]
    covered_from: float
    covered_to: float
    fetched_at: float  # unix time of the fetch; inf for hand-written rows

    def covers(self, start: float, end: float, now: float) -> bool:
        if start < self.covered_from or end > self.covered_to:
            return False
        # Beyond the fetch, EC2 may have changed the price since: trusted only while fresh.
        return end <= self.fetched_at or now < self.fetched_at + SPOT_PRICE_FRESH_SECONDS


class SpotPriceHistory:
    """EC2 spot prices over time (Linux/UNIX), from DescribeSpotPriceHistory, cached per
    (instance type, zone) so that a moment already covered costs no AWS call.

    Without a `zone`, the history must hold a single zone: spot prices differ by zone, and
    billing a host at another zone's price (or the cheapest one) would be wrong.
    `clock` gives the unix time now, which decides when a fetched history is stale.
    """

    def __init__(self, region: str = "", zone: str = "", endpoint_url: str | None = None,
                 session=None, clock=time.time):
        self.region = region
        self.zone = zone
        self._endpoint_url = endpoint_url
        self._session = session
        self._clock = clock
        self._client = None  # created at the first fetch, so an unused history needs no AWS setup
        self._rows: dict[tuple[str, str], _SpotRows] = {}
        self._hand_written = False

    @classmethod
    def from_rows(cls, rows: Iterable[Mapping], zone: str = "", region: str = "") -> SpotPriceHistory:
        """A history of rows shaped like DescribeSpotPriceHistory's (InstanceType,
        AvailabilityZone, SpotPrice as a string, Timestamp as a datetime); it never calls AWS."""
        history = cls(region=region, zone=zone)
        history._hand_written = True
        by_type: dict[str, list[Mapping]] = {}
        for row in rows:
            by_type.setdefault(str(row["InstanceType"]).lower(), []).append(row)
        for instance_type, type_rows in by_type.items():
            history._rows[(instance_type, zone)] = history._parse(instance_type, type_rows, -math.inf, math.inf,
                                                                  math.inf)
        return history

    def price_at(self, instance_type: str, at) -> float:
        """The spot $/hour in effect at `at`: the latest history row at or before it."""
        instance_type, at = instance_type.lower(), _unix(at)
        rows = self._history(instance_type, at, at)
        return rows.prices[self._index_at(instance_type, rows, at)]

    def cost(self, instance_type: str, start, end) -> float:
        """Dollars one server of `instance_type` cost from `start` to `end`, the price
        changing wherever the history says it changed."""
        instance_type, start, end = instance_type.lower(), _unix(start), _unix(end)
        if end < start:
            raise PriceError(f"the interval ends ({iso_utc(end)}) before it starts ({iso_utc(start)}).")
        rows = self._history(instance_type, start, end)
        index = self._index_at(instance_type, rows, start)
        dollars, since, price = 0.0, start, rows.prices[index]
        for moment, next_price in zip(rows.moments[index + 1:], rows.prices[index + 1:]):
            if moment >= end:
                break
            dollars += price * (moment - since) / 3600.0
            since, price = moment, next_price
        return dollars + price * (end - since) / 3600.0

    # --- the rows ------------------------------------------------------------------------------

    def _where(self) -> str:
        if self.zone:
            return f"zone {self.zone}"
        return f"region {self.region}" if self.region else "the given history"

    def _history(self, instance_type: str, start: float, end: float) -> _SpotRows:
        key = (instance_type, self.zone)
        known = self._rows.get(key)
        if self._hand_written:
            if known is None:
                raise PriceError(f"the spot price history has no {instance_type} rows in {self._where()}; "
                                 "add them or use a history fetched from AWS.")
            return known
        now = self._clock()
        if known is not None and known.covers(start, end, now):
            return known
        # Fetch the union with what is known, so one span per key stays enough.
        if known is not None:
            start, end = min(start, known.covered_from), max(end, known.covered_to)
        fetched = self._parse(instance_type, self._fetch(instance_type, start, end), start, end, now)
        self._rows[key] = fetched
        return fetched

    def _fetch(self, instance_type: str, start: float, end: float) -> list[dict]:
        call = "ec2:DescribeSpotPriceHistory"
        # AWS answers the rows within [StartTime, EndTime] and also the last change before
        # StartTime, which is the price in effect at `start`.
        params = {"ProductDescriptions": ["Linux/UNIX"], "InstanceTypes": [instance_type],
                  "StartTime": datetime.fromtimestamp(start, timezone.utc),
                  "EndTime": datetime.fromtimestamp(end, timezone.utc)}
        if self.zone:
            params["AvailabilityZone"] = self.zone
        try:
            if self._client is None:
                # A bill is asked for from the training loop: the factory's short timeouts fail
                # fast rather than stall a step for a minute.
                self._client = aws_client("ec2", self.region or None, self._endpoint_url, self._session)
                # The region boto3 chose, for the messages.
                self.region = self._client.meta.region_name
            pages = self._client.get_paginator("describe_spot_price_history").paginate(**params)
            return [row for page in pages for row in page.get("SpotPriceHistory", [])]
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as e:
            raise PriceError(aws_error_sentence(e, call, self.region or None, "the cost meter's")) from e

    def _parse(self, instance_type: str, rows: Iterable[Mapping], covered_from: float, covered_to: float,
               fetched_at: float) -> _SpotRows:
        timeline = []
        zones = set()
        for row in rows:
            zone = row.get("AvailabilityZone", "")
            # Filtered here too: not every EC2 endpoint honours the AvailabilityZone parameter.
            if self.zone and zone != self.zone:
                continue
            if str(row.get("InstanceType", instance_type)).lower() != instance_type:
                continue
            price = _check_price(row.get("SpotPrice"), f"the spot price of {instance_type} in zone {zone} "
                                                       f"at {row.get('Timestamp')}")
            timeline.append((_unix(row["Timestamp"]), price))
            zones.add(zone)
        timeline.sort(key=lambda moment_price: moment_price[0])
        return _SpotRows(tuple(m for m, _ in timeline), tuple(p for _, p in timeline), frozenset(zones),
                         covered_from, covered_to, fetched_at)

    def _index_at(self, instance_type: str, rows: _SpotRows, at: float) -> int:
        """The index of the latest row at or before `at`."""
        if len(rows.zones) > 1:
            raise PriceError(f"the spot prices of {instance_type} in {self._where()} come from several zones "
                             f"({', '.join(sorted(rows.zones))}); set the zone the hosts run in.")
        index = bisect.bisect_right(rows.moments, at) - 1
        if index < 0:
            raise PriceError(f"no spot price of {instance_type} in {self._where()} is known at or "
                             f"before {iso_utc(at)}.")
        return index


class PriceCatalog:
    """What a server costs on one cloud: `on_demand_hourly`, `hourly` in a market at a
    moment, and `cost` over an interval.

    gce: the study's static prices. aws: `on_demand_overrides` over the built-in us-east-1
    table for on-demand, and `spot_history` (by default one fetched from AWS for `region`
    and `zone`) for spot. Instance type names are case-insensitive.
    """

    def __init__(self, cloud: str = "gce", region: str = "", zone: str = "",
                 on_demand_overrides: Mapping[str, float] | None = None,
                 spot_history: SpotPriceHistory | None = None):
        if cloud not in CLOUDS:
            raise PriceError(f"cloud {cloud!r} is unknown; use one of {', '.join(CLOUDS)}.")
        self.cloud = cloud
        self.region = region
        self.zone = zone
        if cloud == "gce":
            built_in = GCE_ON_DEMAND_USD_PER_HOUR
        else:
            built_in = AWS_ON_DEMAND_USD_PER_HOUR if region in ("", AWS_PRICE_TABLE_REGION) else {}
        overrides = {str(t).lower(): _check_price(p, f"the on-demand price of {t}")
                     for t, p in (on_demand_overrides or {}).items()}
        self._on_demand = {**built_in, **overrides}
        self._spot_history = spot_history

    def on_demand_hourly(self, instance_type: str) -> float:
        price = self._on_demand.get(instance_type.lower())
        if price is None:
            raise self._unknown_type(instance_type)
        return price

    def hourly(self, instance_type: str, market: str, at=None) -> float:
        """$/hour of one server in `market` at `at` (unix seconds or a datetime; None means now)."""
        if checked_market(market) == ON_DEMAND:
            return self.on_demand_hourly(instance_type)
        if self.cloud == "gce":
            return self._gce_spot(instance_type)
        if at is None:
            at = time.time()
        return self.spot_history.price_at(instance_type, at)

    def cost(self, instance_type: str, market: str, start, end) -> float:
        """Dollars one server cost from `start` to `end` (no minimum: CostMeter bills that)."""
        start, end = _unix(start), _unix(end)
        if end < start:
            raise PriceError(f"the interval ends ({iso_utc(end)}) before it starts ({iso_utc(start)}).")
        if checked_market(market) == SPOT and self.cloud == "aws":
            # Priced first, so an unknown type fails the same way in both markets.
            self.on_demand_hourly(instance_type)
            return self.spot_history.cost(instance_type, start, end)
        return self.hourly(instance_type, market, start) * (end - start) / 3600.0

    @property
    def spot_history(self) -> SpotPriceHistory:
        if self._spot_history is None:
            self._spot_history = SpotPriceHistory(region=self.region, zone=self.zone)
        return self._spot_history

    def _gce_spot(self, instance_type: str) -> float:
        price = GCE_SPOT_USD_PER_HOUR.get(instance_type.lower())
        if price is None:
            raise self._unknown_type(instance_type)
        return price

    def _unknown_type(self, instance_type: str) -> PriceError:
        if self.cloud == "gce":
            where = f"gce region {self.region}" if self.region else "gce"
            return PriceError(f"instance type {instance_type!r} has no price on {where}; the study's "
                              f"types are {', '.join(sorted(GCE_ON_DEMAND_USD_PER_HOUR))}.")
        region = self.region or AWS_PRICE_TABLE_REGION
        return PriceError(f"instance type {instance_type!r} has no on-demand price on aws region {region}; "
                          f"add it to a price table ({','.join(PRICE_TABLE_COLUMNS)}) and pass "
                          "load_price_table(path) as on_demand_overrides.")
