"""billing.job: a training job's ring followed by the meter, on the study's GCE prices (the
same bill at AWS spot prices, in a real job, is test_aws_bill_job.py)."""
from __future__ import annotations

import json

import pytest

from transientvod.billing.job import JobBill, always_on_types, check_prices
from transientvod.billing.prices import PriceError
from transientvod.config import Config

HOUR = 3600.0
K80_SPOT, PS_ON_DEMAND = 0.256, 0.143


def config(**cost) -> Config:
    c = Config()
    for key, value in cost.items():
        setattr(c.cost, key, value)
    return c


def test_the_ring_joins_and_leaves_and_a_revoked_host_is_billed_until_its_revocation():
    bill = JobBill(config(), None, 0.0)
    assert bill.follow_ring(["a", "a", "b"], 0.0) == (["a", "b"], [])  # one entry per worker
    # b left the ring at its notice at 100 s; the cloud takes it at 130 s.
    assert bill.follow_ring(["a"], 100.0, revoked_at={"b": 130.0}) == ([], ["b"])
    lines = {line.host: line for line in bill.bill(HOUR).lines}
    assert lines["b"].end == 130.0 and lines["b"].billed_seconds == 130
    final = bill.finish(HOUR)
    assert final.cost_usd == pytest.approx((HOUR + 130) * K80_SPOT / HOUR)


def test_always_on_servers_and_a_restart_from_the_ledger():
    c = config(always_on="ps, ps")
    assert always_on_types(c) == ["ps", "ps"]
    bill = JobBill(c, None, 0.0)
    bill.follow_ring(["a"], 0.0)
    ledger = json.loads(json.dumps(bill.ledger()))
    # The job died after its checkpoint at 600 s and came back at 1000 s, on a new host.
    again = JobBill(c, ledger, 1000.0)
    again.restart(600.0, 1000.0)
    again.follow_ring(["b"], 1000.0)
    final = again.finish(1600.0)
    by_host = {}
    for line in final.lines:
        by_host.setdefault(line.host, []).append(line.billed_seconds)
    assert by_host == {"a": [600], "b": [600], "always-on-0-ps": [600, 600], "always-on-1-ps": [600, 600]}
    assert final.cost_usd == pytest.approx(1200 * K80_SPOT / HOUR + 2400 * PS_ON_DEMAND / HOUR)


def test_what_a_stopped_job_spent_is_its_ledger_billed_until_it_was_saved():
    c = config(always_on="ps")
    bill = JobBill(c, None, 0.0)
    bill.follow_ring(["a", "b"], 0.0)
    assert bill.running_usd_per_hour(10.0) == pytest.approx(2 * K80_SPOT + PS_ON_DEMAND)
    ledger = json.loads(json.dumps(bill.ledger()))
    # Saved at 600 s; read an hour later, the servers are billed up to 600 s, not to now.
    spent = JobBill(c, ledger, HOUR).spent_until(600.0)
    assert spent == pytest.approx(1200 * K80_SPOT / HOUR + 600 * PS_ON_DEMAND / HOUR)


def test_check_prices_names_what_cannot_be_priced():
    check_prices(config(), now=0.0)
    with pytest.raises(PriceError, match="'a100'"):
        check_prices(config(instance_type="a100"), now=0.0)
    with pytest.raises(PriceError, match="'x9'"):
        check_prices(config(always_on="ps,x9"), now=0.0)
