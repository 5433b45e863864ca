"""MLflow's own UI shows what was logged: a real store, a real `mlflow server`, headless Chromium."""
from __future__ import annotations

import shutil
import struct
from pathlib import Path

import pytest

from conftest import mlflow_browser
from transientvod.tracking import names

if shutil.which("chromium") is None:
    pytest.skip("headless Chromium (Debian package chromium) is not installed", allow_module_level=True)


mlflow_screenshot = mlflow_browser()

# A value no other number on the page shares: the latest cost_usd, which the run page shows.
FINAL_COST_USD = 1.2253


def log_sample_run(tracking_uri: str) -> tuple[str, str]:
    """Log one run through transientvod's own tracker, as a job does; returns (experiment id, run id)."""
    from mlflow import MlflowClient

    from transientvod.config import load_config
    from transientvod.tracking.run import close_run, open_run
    from transientvod.tracking.sender import UNSENT_FILE, MetricSender
    from transientvod.tracking.store import sqlite_path

    store_dir = sqlite_path(tracking_uri).parent
    config = load_config(None, [f"run.output_dir={store_dir}", "run.name=ui-sample", f"tracking.uri={tracking_uri}",
                                "exchange.codec=int8", "exchange.staleness=2"])
    run_id = open_run(config)
    sender = MetricSender(tracking_uri, run_id, config.run_dir / UNSENT_FILE)
    for step, cost in [(0, 0.4105), (100, 0.8179), (200, FINAL_COST_USD)]:
        sender.log({names.METRIC_COST: cost, names.METRIC_ON_DEMAND_COST: 3 * cost}, step)
    assert sender.close() == 0
    summary = {"steps": 200, "test_accuracy": 0.9123, "wall_seconds": 3780.0,
               "cost": {"cost_usd": FINAL_COST_USD, "on_demand_usd": 3 * FINAL_COST_USD, "savings_pct": 200 / 3}}
    close_run(config, summary, succeeded=True)
    return MlflowClient(tracking_uri).get_run(run_id).info.experiment_id, run_id


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """(backend store URI, [(experiment id, run id)] * 2): a fresh SQLite store with two runs."""
    uri = f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"
    return uri, [log_sample_run(uri), log_sample_run(uri)]


@pytest.fixture(scope="module")
def served(two_runs):
    """The base URL of `mlflow server` on the two_runs store (one server start, 3-8 s, per module)."""
    with mlflow_screenshot.serve_mlflow(two_runs[0]) as base:
        yield base


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk; fails for anything that is not a PNG."""
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR", f"{path} is not a PNG: {head!r}"
    return struct.unpack(">II", head[16:24])


@pytest.mark.slow
def test_run_page_shows_the_logged_metric(two_runs, served):
    _, [(experiment_id, run_id), _] = two_runs
    url = mlflow_screenshot.run_page_url(served, experiment_id, run_id)
    # The value appears only once the run's data has arrived and been drawn.
    dom = mlflow_screenshot.wait_for_text(url, str(FINAL_COST_USD), timeout=90)
    text = mlflow_screenshot.page_text(dom)
    assert names.METRIC_COST in text, text[:3000]
    assert f"{names.METRIC_COST} {FINAL_COST_USD}" in text, text[:3000]  # the value is the metric's


def test_compare_screenshot_is_a_png_of_the_requested_size(two_runs, tmp_path, capsys):
    uri, _ = two_runs
    out = tmp_path / "shots" / "compare.png"
    # No --runs: the experiment's newest runs, as for the cost page's screenshot, which are these two.
    argv = ["--backend-store-uri", uri, "--out", str(out), "--width", "1200", "--height", "700"]
    assert mlflow_screenshot.main(argv) == 0, capsys.readouterr().err
    assert capsys.readouterr().out.strip() == str(out)
    assert png_size(out) == (1200, 700)
    import matplotlib.image

    pixels = matplotlib.image.imread(out)
    assert pixels.shape[:2] == (700, 1200)
    assert pixels.std() > 0.05, "the screenshot is (nearly) one colour: a blank page"


def test_a_missing_store_is_one_sentence(tmp_path, capsys):
    missing = tmp_path / "nowhere" / "mlflow.db"
    assert mlflow_screenshot.main(["--backend-store-uri", f"sqlite:///{missing}", "--out",
                                   str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [f"mlflow_screenshot: the MLflow store {missing} does not exist; log a run first "
                                "or pass the --backend-store-uri of an existing store."]
    assert not missing.exists()


def test_a_missing_experiment_or_run_is_one_sentence(served):
    # main() prints a UserError's sentence and exits 2, as for the missing store above.
    with pytest.raises(mlflow_screenshot.UserError) as caught:
        mlflow_screenshot.choose_runs(served, "no-such-experiment", None)
    assert str(caught.value) == "the store has no experiment named 'no-such-experiment'; pass the right --experiment."
    with pytest.raises(mlflow_screenshot.UserError) as caught:
        mlflow_screenshot.choose_runs(served, "transientvod", ["0" * 32])
    assert str(caught.value) == f"there is no run {'0' * 32} in the store; check the ids given to --runs."
