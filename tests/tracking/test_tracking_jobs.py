"""Real jobs through `horovodrun`, recorded in real MLflow stores: two runs compared the way
the study compared clusters, and a job whose tracking server goes away and comes back."""
from __future__ import annotations

import csv
import subprocess

import pytest
from mlflow import MlflowClient

from conftest import REPO, TRANSIENTVOD, explain, free_port, mlflow_browser, new_mlflow_store, wait_until
from transientvod.billing.prices import GCE_ON_DEMAND_USD_PER_HOUR, GCE_SPOT_USD_PER_HOUR
from transientvod.tracking import names

pytestmark = pytest.mark.slow

BOTH = "localhost:1,127.0.0.1:1"


def test_two_runs_are_logged_and_compare_reads_them_back(job, tmp_path):
    on_demand = job("on-demand", tracking={"enabled": True}, train={"steps": 200}, cluster={"min_np": 1, "max_np": 1, "network_interface": "lo"},
                    cost={"market": "on-demand"})
    done = on_demand.run(on_demand.discovery("0=localhost:1"))
    assert done.returncode == 0, explain(done)
    spot = job("spot", tracking={"enabled": True}, train={"steps": 300, "eval_every": 100})
    done = spot.run(spot.discovery(f"0={BOTH}", "100=localhost:1", f"200={BOTH}"))
    assert done.returncode == 0, explain(done)

    uri = f"sqlite:///{(tmp_path / 'runs' / 'mlflow.db').resolve()}"  # both runs' default store
    client = MlflowClient(uri)
    stored = {}
    for j in (on_demand, spot):
        summary = j.summary()
        assert summary["mlflow"]["tracking_uri"] == uri
        run = client.get_run(summary["mlflow"]["run_id"])
        assert run.info.status == "FINISHED" and run.info.run_name == j.run_dir.name
        metrics = run.data.metrics
        # What MLflow holds is what the job measured.
        assert metrics[names.METRIC_COST] == pytest.approx(summary["cost"]["cost_usd"], abs=1e-6)
        assert metrics[names.METRIC_ACCURACY] == pytest.approx(summary["test_accuracy"])
        assert metrics[names.METRIC_WALL_HOURS] == pytest.approx(summary["wall_seconds"] / 3600)
        assert metrics[names.METRIC_REVOCATIONS] == summary["revocations_survived"]
        # The bill adds up: every server billed per second, a minute at least, at its price.
        market = run.data.params[names.PARAM_MARKET]
        price = (GCE_ON_DEMAND_USD_PER_HOUR if market == "on-demand" else GCE_SPOT_USD_PER_HOUR)["k80"]
        servers = summary["cost"]["servers"]
        assert all(s["billed_seconds"] >= 60 and s["billed_seconds"] == int(s["billed_seconds"]) for s in servers)
        assert sum(s["usd"] for s in servers) == pytest.approx(summary["cost"]["cost_usd"], abs=1e-5)
        for s in servers:
            assert s["usd"] == pytest.approx(s["billed_seconds"] * price / 3600, abs=1e-6)
        cost_history = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, names.METRIC_COST))
        assert [v for _, v in cost_history] == sorted(v for _, v in cost_history), "cost only grows"
        stored[j.run_dir.name] = metrics

    # The spot run lost 127.0.0.1 and got it back: a rejoin is a new server, billed anew.
    spot_summary = spot.summary()
    assert [s["host"] for s in spot_summary["cost"]["servers"]].count("127.0.0.1") == 2
    workers = {m.value for m in client.get_metric_history(spot_summary["mlflow"]["run_id"], names.METRIC_WORKERS)}
    assert workers == {1.0, 2.0}
    assert len(client.list_artifacts(spot_summary["mlflow"]["run_id"])) == 3

    out = tmp_path / "compare"
    done = subprocess.run(TRANSIENTVOD + ["compare", "--tracking-uri", uri, "--out", str(out)],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, explain(done)
    assert "baseline: on-demand" in done.stdout
    rows = {row["run"]: row for row in csv.DictReader(open(out / "compare.csv"))}
    assert set(rows) == {"on-demand", "spot"}
    base, other = stored["on-demand"], stored["spot"]
    row = rows["spot"]
    assert float(row["time_h"]) == pytest.approx(other[names.METRIC_WALL_HOURS])
    assert float(row["cost_usd"]) == pytest.approx(other[names.METRIC_COST])
    assert float(row["top1_pct"]) == pytest.approx(100 * other[names.METRIC_ACCURACY])
    assert float(row["speedup"]) == pytest.approx(base[names.METRIC_WALL_HOURS] / other[names.METRIC_WALL_HOURS])
    assert float(row["savings_pct"]) == pytest.approx(100 * (1 - other[names.METRIC_COST] / base[names.METRIC_COST]))
    assert (out / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_training_goes_on_while_the_tracking_server_is_down(job, tmp_path):
    serve_mlflow = mlflow_browser().serve_mlflow
    store, port = new_mlflow_store(tmp_path), free_port()
    j = job("outage", train={"steps": 1000}, cluster={"min_np": 1, "max_np": 1, "network_interface": "lo"},
            tracking={"uri": f"http://127.0.0.1:{port}"})
    log_path = tmp_path / "job.log"
    server = serve_mlflow(store, port)
    server.__enter__()
    proc = j.start(j.discovery("0=localhost:1"), log_path)
    try:
        wait_until(lambda: j.last_step() >= 100 or proc.poll() is not None, 120, "step 100")
        server.__exit__(None, None, None)  # the tracking server goes away mid-run
        stopped_at = j.last_step()
        wait_until(lambda: j.last_step() >= stopped_at + 100 or proc.poll() is not None, 60,
                   "training to go on without the server")
        assert proc.poll() is None, "the job ended while the server was away: give it more steps"
        server = serve_mlflow(store, port)
        server.__enter__()  # ... and comes back
        assert proc.wait(timeout=180) == 0, log_path.read_text()[-6000:]
        run_id = j.summary()["mlflow"]["run_id"]
        steps = sorted(m.step for m in MlflowClient(f"http://127.0.0.1:{port}").get_metric_history(run_id, names.METRIC_LOSS))
    finally:
        if proc.poll() is None:
            proc.kill()
        server.__exit__(None, None, None)
    assert steps == list(range(10, 1001, 10)), "every logged step reached MLflow after the outage"
    log = log_path.read_text()
    assert log.count("does not answer") == 1, log[-6000:]
    assert "answers again" in log
