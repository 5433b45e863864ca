"""A real `horovodrun` job billed at AWS spot prices: rank 0 asks DescribeSpotPriceHistory
(a moto server on 127.0.0.1, reached through AWS_ENDPOINT_URL as a user's own endpoint
would be) and the bill in the summary and in MLflow is the one those prices give.

moto answers one fixed spot price per zone (see test_prices.py), so the expected price is read
from moto with a plain boto3 call, never written into the test."""
from __future__ import annotations

import boto3
import pytest
from mlflow import MlflowClient

from conftest import explain, moto_aws
from transientvod.billing.prices import AWS_ON_DEMAND_USD_PER_HOUR
from transientvod.tracking import names

pytestmark = pytest.mark.slow

GPU, ZONE = "g4dn.xlarge", "us-east-1a"


def test_a_spot_job_on_aws_is_billed_at_the_price_history(job, tmp_path, monkeypatch):
    with moto_aws(tmp_path) as url:
        monkeypatch.setenv("AWS_ENDPOINT_URL", url)
        rows = boto3.client("ec2").describe_spot_price_history(InstanceTypes=[GPU], AvailabilityZone=ZONE,
                                                               ProductDescriptions=["Linux/UNIX"])["SpotPriceHistory"]
        spot_price = float(next(r for r in rows if r["AvailabilityZone"] == ZONE)["SpotPrice"])
        j = job("aws-spot", tracking={"enabled": True}, train={"steps": 100},
                cluster={"min_np": 1, "max_np": 1, "network_interface": "lo"},
                cost={"cloud": "aws", "instance_type": GPU, "market": "spot", "region": "us-east-1", "zone": ZONE})
        done = j.run(j.discovery("0=localhost:1"))
    assert done.returncode == 0, explain(done)

    cost = j.summary()["cost"]
    [server] = cost["servers"]
    assert (server["host"], server["instance_type"], server["market"]) == ("localhost", GPU, "spot")
    seconds = server["billed_seconds"]
    assert seconds >= 60 and seconds == int(seconds)
    on_demand_price = AWS_ON_DEMAND_USD_PER_HOUR[GPU]
    assert cost["on_demand_usd"] == pytest.approx(seconds * on_demand_price / 3600, abs=1e-6)
    # moto's price is so low that the dollars round to micro-dollar zero; the savings, computed
    # from the unrounded bill, show which price was used (a lost price would give 100 %, the
    # on-demand one 0 %).
    assert cost["cost_usd"] == round(seconds * spot_price / 3600, 6)
    assert cost["savings_pct"] == round(100 * (1 - spot_price / on_demand_price), 3)
    mlflow = j.summary()["mlflow"]
    metrics = MlflowClient(mlflow["tracking_uri"]).get_run(mlflow["run_id"]).data.metrics
    assert metrics[names.METRIC_COST] == cost["cost_usd"]
    assert metrics[names.METRIC_ON_DEMAND_COST] == pytest.approx(cost["on_demand_usd"], abs=1e-6)
