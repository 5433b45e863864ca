"""A training job's bill: the hosts in Horovod's ring feed the cost meter.

Whoever is rank 0 keeps it. After every (re)start of the ring the workers tell each other
their host names; a host whose first worker joins starts a billing segment at its configured
type and market, a host with no worker left ends one. A host that left because it was
revoked is billed up to its revocation when the caller knows that moment (accounting.py reads
it from the host-state file: a replayed trace, an EC2 two-minute notice): the cloud bills a
server until it takes it, not until the job let it go. Always-on servers (`cost.always_on`,
for example the study's parameter server) are billed on-demand from the job's start to its end.

The meter's state is plain JSON kept in the elastic state and the checkpoint, so a new rank 0
after a revocation, or a job restarted from its checkpoint, carries the bill on.

Imports neither torch nor horovod nor spot/: the launcher checks prices with it before a job starts.
"""
from __future__ import annotations

import time

from transientvod.billing.meter import Bill, CostMeter
from transientvod.billing.prices import PriceCatalog, SpotPriceHistory, load_price_table
from transientvod.config import Config


def price_catalog(config: Config) -> PriceCatalog:
    c = config.cost
    overrides = load_price_table(c.price_table) if c.price_table else None
    region = c.region or config.spot.region
    spot_history = None
    if c.cloud == "aws" and c.market == "spot":
        spot_history = SpotPriceHistory(region=region, zone=c.zone, endpoint_url=config.spot.endpoint_url or None)
    return PriceCatalog(cloud=c.cloud, region=region, zone=c.zone, on_demand_overrides=overrides,
                        spot_history=spot_history)


def always_on_types(config: Config) -> list[str]:
    return [t.strip() for t in config.cost.always_on.split(",") if t.strip()]


def check_prices(config: Config, now: float | None = None) -> None:
    """Every price the job will need can be found (raises PriceError naming the type and region)."""
    catalog = price_catalog(config)
    now = time.time() if now is None else now
    for instance_type in [config.cost.instance_type] + always_on_types(config):
        catalog.on_demand_hourly(instance_type)
    catalog.hourly(config.cost.instance_type, config.cost.market, now)


class JobBill:
    """The cost meter of one job, rebuilt from (and saved to) a JSON ledger."""

    def __init__(self, config: Config, ledger: dict | None, now: float, catalog: PriceCatalog | None = None):
        self.config = config
        # Pass the catalog on when rebuilding: it holds the spot price history already fetched.
        self.catalog = catalog or price_catalog(config)
        if ledger:
            self.meter = CostMeter.from_state(self.catalog, ledger)
        else:
            self.meter = CostMeter(self.catalog)
            for name, instance_type in self._always_on_names().items():
                self.meter.add_always_on(name, instance_type, now)

    def follow_ring(self, hosts: list[str], now: float, revoked_at: dict[str, float] | None = None) -> tuple[list[str], list[str]]:
        """The ring now holds `hosts` (one entry per worker); returns (joined, left), each sorted
        (the ring is a set, whose order changes from process to process with string hashing).
        `revoked_at`: the known revocation moments of hosts, billed until then if later."""
        ring = set(hosts)
        left_later = [host for host, when in (revoked_at or {}).items()
                      if host not in ring and when > now and self.meter.leave(host, when)]
        member = (self.config.cost.instance_type, self.config.cost.market)
        joined, left = self.meter.set_members({host: member for host in ring}, now)
        return sorted(joined), sorted(left + left_later)

    def restart(self, last_seen: float, now: float) -> None:
        """The job was down: the servers of its previous run are billed up to `last_seen` (the
        last moment the ledger was saved), the always-on ones start again now."""
        self.meter.set_members({}, last_seen)
        names = self._always_on_names()
        for name in names:
            self.meter.stop_always_on(name, last_seen)
        for name, instance_type in names.items():
            self.meter.add_always_on(name, instance_type, now)

    def spent_until(self, last_seen: float) -> float:
        """Dollars of the ledger's servers billed up to `last_seen` (the last moment it was
        saved), as a restart bills them; this bill's meter is then ended, so use it only to read
        what a stopped job spent."""
        self.meter.set_members({}, last_seen)
        for name in self._always_on_names():
            self.meter.stop_always_on(name, last_seen)
        return self.meter.bill(last_seen).cost_usd

    def running_usd_per_hour(self, now: float) -> float:
        return self.meter.running_usd_per_hour(now)

    def finish(self, now: float) -> Bill:
        """The job ended: every server stops being billed now."""
        self.meter.set_members({}, now)
        for name in self._always_on_names():
            self.meter.stop_always_on(name, now)
        return self.meter.bill(now)

    def _always_on_names(self) -> dict[str, str]:
        return {f"always-on-{i}-{t}": t for i, t in enumerate(always_on_types(self.config))}

    def bill(self, now: float) -> Bill:
        return self.meter.bill(now)

    def ledger(self) -> dict:
        return self.meter.state()

