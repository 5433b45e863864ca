"""tracking/compare.py against a real SQLite MLflow store, filled through MlflowClient the way a
training job fills it. Expected values are read back from the store, not restated."""
from __future__ import annotations

import csv

import matplotlib.image
import pytest
from mlflow import MlflowClient

from transientvod.tracking.compare import (
    CompareError,
    compare_rows,
    format_table,
    load_runs,
    run_compare,
    write_csv,
    write_scatter,
)
from transientvod.tracking.names import (
    METRIC_ACCURACY,
    METRIC_COST,
    METRIC_ON_DEMAND_COST,
    METRIC_REVOCATIONS,
    METRIC_WALL_HOURS,
    PARAM_INSTANCE_TYPE,
    PARAM_MARKET,
    PARAM_MAX_WORKERS,
    PARAM_MIN_WORKERS,
    TAG_CONFIGURATION,
)
from transientvod.tracking.store import TrackingError

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
START = 1_700_000_000_000  # ms; runs get increasing start times so "oldest first" is well defined


def log_run(client, experiment_id, name, start, params, metrics, tag=None, status="FINISHED"):
    """One run as a job records it: params once, metric histories by step, a final status.
    `metrics` maps a name to a list of (step, value), logged in the order given."""
    run = client.create_run(experiment_id, start_time=start, run_name=name,
                            tags={TAG_CONFIGURATION: tag} if tag else None)
    run_id = run.info.run_id
    for key, value in params.items():
        client.log_param(run_id, key, value)
    for key, history in metrics.items():
        for step, value in history:
            client.log_metric(run_id, key, value, step=step)
    client.set_terminated(run_id, status)
    return run_id


def params(instance_type, market, low, high):
    return {PARAM_INSTANCE_TYPE: instance_type, PARAM_MARKET: market, PARAM_MIN_WORKERS: low, PARAM_MAX_WORKERS: high}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """One store for the module (creating an MLflow SQLite schema takes about a second)."""
    env = pytest.MonkeyPatch()
    env.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    uri = f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)

    main = client.create_experiment("transientvod")
    # Histories: cost grows, accuracy goes up and down, so the latest value is neither the first
    # nor the largest; one history is logged out of step order (latest = highest step).
    ids = {
        "od-1": log_run(client, main, "od-1", START, params("k80", "on-demand", 1, 1), {
            METRIC_COST: [(0, 0.0), (100, 1.4), (200, 2.83)],
            METRIC_ON_DEMAND_COST: [(0, 0.0), (200, 2.83)],
            METRIC_ACCURACY: [(100, 0.80), (200, 0.9307)],
            METRIC_WALL_HOURS: [(200, 3.91)],
        }, tag="1 x k80 on-demand"),
        "spot-4": log_run(client, main, "spot-4", START + 1000, params("k80", "spot", 4, 4), {
            METRIC_COST: [(0, 0.0), (100, 0.6), (200, 1.05)],
            METRIC_ON_DEMAND_COST: [(0, 0.0), (200, 2.92)],
            METRIC_ACCURACY: [(100, 0.85), (150, 0.93), (200, 0.9123)],
            METRIC_REVOCATIONS: [(50, 1), (120, 2), (180, 3)],
            METRIC_WALL_HOURS: [(200, 1.05)],
        }, tag="4 x k80 spot"),
        # No configuration tag: the label is built from the params.
        "spot-2-8": log_run(client, main, "spot-2-8", START + 2000, params("v100", "spot", 2, 8), {
            METRIC_COST: [(200, 1.71), (0, 0.0), (100, 0.9)],
            METRIC_ON_DEMAND_COST: [(200, 4.2)],
            METRIC_ACCURACY: [(200, 0.9011), (100, 0.7)],
            METRIC_REVOCATIONS: [(60, 1)],
            METRIC_WALL_HOURS: [(200, 0.61)],
        }),
    }

    # Baseline choice: the older on-demand run has more workers, so the default must skip it.
    other = client.create_experiment("baseline-choice")
    ids["od-4"] = log_run(client, other, "od-4", START, params("k80", "on-demand", 4, 4), {
        METRIC_COST: [(200, 2.92)], METRIC_ACCURACY: [(200, 0.912)], METRIC_WALL_HOURS: [(200, 0.99)]})
    ids["od-1b"] = log_run(client, other, "od-1b", START + 1000, params("k80", "on-demand", 1, 1), {
        METRIC_COST: [(200, 2.83)], METRIC_ACCURACY: [(200, 0.93)], METRIC_WALL_HOURS: [(200, 3.91)]})
    # A run that crashed before it logged wall hours or accuracy is shown, not dropped.
    ids["crashed"] = log_run(client, other, "crashed", START + 2000, params("k80", "spot", 1, 4), {
        METRIC_COST: [(10, 0.02)]}, status="FAILED")
    # A deleted run is not compared.
    ids["deleted"] = log_run(client, other, "deleted", START + 3000, params("k80", "spot", 1, 1), {
        METRIC_COST: [(10, 9.99)], METRIC_WALL_HOURS: [(10, 9.0)]})
    client.delete_run(ids["deleted"])

    client.create_experiment("empty")
    yield uri, client, ids
    env.undo()


@pytest.fixture(autouse=True)
def _no_telemetry(monkeypatch):
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")


def stored(client, run_id):
    """The latest value of each metric, as MLflow itself reports it."""
    return client.get_run(run_id).data.metrics


def main_rows(uri):
    return {r.run_name: r for r in load_runs(uri)}


# --- load_runs -------------------------------------------------------------------------------


def test_load_runs_reads_latest_values_oldest_first(store):
    uri, client, ids = store
    rows = load_runs(uri)
    assert [r.run_name for r in rows] == ["od-1", "spot-4", "spot-2-8"]
    for row in rows:
        run = client.get_run(row.run_id)
        metrics = run.data.metrics
        assert row.run_id == ids[row.run_name]
        assert row.status == run.info.status == "FINISHED"
        assert row.hours == metrics[METRIC_WALL_HOURS]
        assert row.cost_usd == metrics[METRIC_COST]
        assert row.on_demand_usd == metrics[METRIC_ON_DEMAND_COST]
        assert row.accuracy == metrics[METRIC_ACCURACY]
        assert row.revocations == int(metrics.get(METRIC_REVOCATIONS, 0))
        # "Latest" is the value at the highest step, whatever order it was logged in.
        for key in (METRIC_COST, METRIC_ACCURACY):
            history = client.get_metric_history(row.run_id, key)
            assert metrics[key] == max(history, key=lambda m: m.step).value
    by_name = {r.run_name: r for r in rows}
    assert by_name["spot-4"].configuration == client.get_run(ids["spot-4"]).data.tags[TAG_CONFIGURATION]
    assert by_name["spot-2-8"].configuration == "2-8 x v100 spot"
    assert by_name["od-1"].revocations == 0  # never logged


def test_load_runs_by_id_keeps_the_given_order(store):
    uri, _, ids = store
    wanted = [ids["spot-2-8"], ids["od-4"], ids["od-1"]]
    assert [r.run_id for r in load_runs(uri, run_ids=wanted)] == wanted


def test_deleted_runs_are_left_out_and_unfinished_runs_kept(store):
    uri, client, ids = store
    rows = load_runs(uri, "baseline-choice")
    assert [r.run_name for r in rows] == ["od-4", "od-1b", "crashed"]
    crashed = rows[-1]
    assert crashed.status == "FAILED"
    assert crashed.hours is None and crashed.accuracy is None
    assert crashed.cost_usd == stored(client, ids["crashed"])[METRIC_COST]


# --- compare_rows ----------------------------------------------------------------------------


def test_default_baseline_is_the_smallest_on_demand_run(store):
    uri, client, ids = store
    rows = compare_rows(load_runs(uri))
    assert [r.run_name for r in rows if r.is_baseline] == ["od-1"]
    base = stored(client, ids["od-1"])
    for row in rows:
        mine = stored(client, row.run_id)
        assert row.speedup == pytest.approx(base[METRIC_WALL_HOURS] / mine[METRIC_WALL_HOURS])
        assert row.savings_pct == pytest.approx(100 * (1 - mine[METRIC_COST] / base[METRIC_COST]))
    assert rows[0].speedup == 1.0 and rows[0].savings_pct == 0.0

    # Fewest max_workers wins over being the oldest on-demand run.
    other = compare_rows(load_runs(uri, "baseline-choice"))
    assert [r.run_name for r in other if r.is_baseline] == ["od-1b"]
    assert other[-1].speedup is None  # the crashed run has no wall hours


def test_explicit_baseline(store):
    uri, client, ids = store
    rows = compare_rows(load_runs(uri), baseline_run_id=ids["spot-4"])
    assert [r.run_name for r in rows if r.is_baseline] == ["spot-4"]
    base, od = stored(client, ids["spot-4"]), stored(client, ids["od-1"])
    assert rows[0].speedup == pytest.approx(base[METRIC_WALL_HOURS] / od[METRIC_WALL_HOURS])
    assert rows[0].savings_pct == pytest.approx(100 * (1 - od[METRIC_COST] / base[METRIC_COST]))
    assert f"baseline: spot-4 ({ids['spot-4']})" in format_table(rows)


def test_with_no_on_demand_run_the_first_row_is_the_baseline(store):
    uri, _, ids = store
    rows = compare_rows(load_runs(uri, run_ids=[ids["spot-2-8"], ids["spot-4"]]))
    assert [r.is_baseline for r in rows] == [True, False]


# --- output ----------------------------------------------------------------------------------


def test_table_shows_each_runs_numbers(store):
    uri, client, ids = store
    rows = compare_rows(load_runs(uri))
    text = format_table(rows)
    header = text.splitlines()[0]
    for column in ("run", "configuration", "revocations", "time (h)", "cost ($)", "top-1 (%)", "speed-up",
                   "savings (%)"):
        assert column in header
    assert f"baseline: od-1 ({ids['od-1']}), 1 x k80 on-demand" in text
    for row in rows:
        metrics = stored(client, row.run_id)
        line = next(t for t in text.splitlines() if t.startswith(row.run_name + " "))
        expected = [row.configuration, str(int(metrics.get(METRIC_REVOCATIONS, 0))),
                    f"{metrics[METRIC_WALL_HOURS]:.4f}", f"{metrics[METRIC_COST]:.4f}",
                    f"{100 * metrics[METRIC_ACCURACY]:.2f}", f"{row.speedup:.2f}x", f"{row.savings_pct:.1f}"]
        for cell in expected:
            assert cell in line, (cell, line)


def test_a_run_without_hours_or_accuracy_shows_dashes(store):
    uri, _, _ = store
    text = format_table(load_runs(uri, "baseline-choice"))
    line = next(t for t in text.splitlines() if t.startswith("crashed "))
    revocations, hours, cost, top1, speedup, savings = line.split()[-6:]
    assert hours == top1 == speedup == "-"
    # What it did record is still shown.
    assert revocations == "0" and cost == "0.0200" and savings != "-"


def test_csv_parses_back_to_the_stored_numbers(store, tmp_path):
    uri, client, ids = store
    rows = compare_rows(load_runs(uri))
    path = write_csv(rows, tmp_path / "deep" / "er" / "compare.csv")
    with open(path, newline="") as f:
        parsed = list(csv.DictReader(f))
    base = stored(client, ids["od-1"])
    assert [p["run_id"] for p in parsed] == [r.run_id for r in rows]
    for line in parsed:
        metrics = stored(client, line["run_id"])
        assert float(line["time_h"]) == metrics[METRIC_WALL_HOURS]
        assert float(line["cost_usd"]) == metrics[METRIC_COST]
        assert float(line["top1_pct"]) == pytest.approx(100 * metrics[METRIC_ACCURACY], rel=1e-15)
        assert float(line["speedup"]) == pytest.approx(base[METRIC_WALL_HOURS] / metrics[METRIC_WALL_HOURS],
                                                       rel=1e-15)
        assert float(line["savings_pct"]) == pytest.approx(100 * (1 - metrics[METRIC_COST] / base[METRIC_COST]),
                                                           rel=1e-12, abs=1e-12)
        assert int(line["revocations"]) == int(metrics.get(METRIC_REVOCATIONS, 0))
        assert line["baseline"] == ("1" if line["run_id"] == ids["od-1"] else "0")
    # Not recorded is empty, not a made-up number.
    crashed = write_csv(load_runs(uri, "baseline-choice"), tmp_path / "crashed.csv")
    with open(crashed, newline="") as f:
        last = list(csv.DictReader(f))[-1]
    assert last["time_h"] == "" and last["top1_pct"] == "" and last["speedup"] == ""


def test_scatter_is_a_png(store, tmp_path):
    uri, _, _ = store
    path = write_scatter(compare_rows(load_runs(uri)), tmp_path / "figs" / "compare.png")
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 1000
    image = matplotlib.image.imread(path)
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100


def test_run_compare_prints_and_writes(store, tmp_path, capsys):
    uri, _, ids = store
    out = tmp_path / "out"
    assert run_compare(uri, None, (), ids["od-1"], out) == 0
    printed = capsys.readouterr().out
    assert "spot-2-8" in printed and f"baseline: od-1 ({ids['od-1']})" in printed
    for name in ("compare.csv", "compare.png"):
        assert (out / name).stat().st_size > 0
        assert str(out / name) in printed


# --- what a user can get wrong ---------------------------------------------------------------


def test_unknown_run_id(store):
    uri, _, ids = store
    missing = "0" * 32
    with pytest.raises(CompareError, match=f"run {missing} does not exist in {uri}"):
        load_runs(uri, run_ids=[ids["od-1"], missing])


def test_unknown_experiment_names_the_known_ones(store):
    uri, _, _ = store
    with pytest.raises(CompareError, match="'nope' does not exist") as e:
        load_runs(uri, "nope")
    assert "baseline-choice" in str(e.value) and "transientvod" in str(e.value)


def test_experiment_without_runs(store):
    uri, _, _ = store
    with pytest.raises(CompareError, match="'empty'.*has no runs"):
        load_runs(uri, "empty")


def test_baseline_not_among_the_runs(store):
    uri, _, ids = store
    with pytest.raises(CompareError, match=f"baseline run {ids['od-4']} is not among"):
        compare_rows(load_runs(uri), ids["od-4"])


def test_missing_store_is_an_error_and_is_not_created(tmp_path):
    path = tmp_path / "nowhere" / "mlflow.db"
    uri = f"sqlite:///{path}"
    with pytest.raises(TrackingError, match="no MLflow store at .*nowhere/mlflow.db"):
        load_runs(uri)
    assert not path.parent.exists()


def test_a_file_that_is_not_an_mlflow_store(tmp_path):
    path = tmp_path / "notes.db"
    path.write_text("not a database")
    with pytest.raises(TrackingError, match="notes.db"):
        load_runs(f"sqlite:///{path}")
    assert path.read_text() == "not a database"


def test_unwritable_output_path(store, tmp_path):
    uri, _, _ = store
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    rows = load_runs(uri)
    for write in (write_csv, write_scatter):
        with pytest.raises(CompareError, match="a-file/sub"):
            write(rows, blocker / "sub" / "out")
    with pytest.raises(CompareError, match="a-file/sub"):
        run_compare(uri, None, (), None, blocker / "sub")
