"""The planner's study-data loaders and K80 speed model, on the shipped files and on broken ones."""
from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from conftest import heavy_modules_imported
from transientvod.planner.speed import SpeedModel, calibrate_k80, scaled
from transientvod.planner.study_data import (CENSORED_AT_S, GPU_TYPES, Lifetimes, PlanError, load_lifetimes,
                                             ondemand_runs, ps_curve, trace_runs)
from transientvod.spot.providers.trace import SHIPPED_TRACES

HOUR = 3600.0


def mean_duration_from_file(name: str) -> float:
    """Read straight from the shipped CSV, without the code under test."""
    with open(SHIPPED_TRACES / name, newline="", encoding="utf-8-sig") as f:
        return float(np.mean([float(row["Duration"]) for row in csv.DictReader(f)]))


# ---- the study's files --------------------------------------------------------------------------

@pytest.mark.parametrize("workers", [2, 4, 8])
def test_trace_runs_has_32_runs_of_the_asked_size(workers):
    runs = trace_runs(workers)
    assert len(runs) == 32
    assert all(len(run.vms) == workers and run.vms[0].role == "master" for run in runs)


@pytest.mark.parametrize("gpu, vms, censored", [("k80", 64, 44), ("P100", 40, 32), ("V100", 48, 43)])
def test_lifetimes_per_gpu(gpu, vms, censored):
    lifetimes = load_lifetimes(gpu)
    assert lifetimes.gpu == gpu.lower()
    assert lifetimes.count == vms and int(lifetimes.censored.sum()) == censored
    # Minute-resolution times: one K80 VM was revoked within the minute it started.
    assert np.all(lifetimes.seconds >= 0) and np.count_nonzero(lifetimes.seconds) >= vms - 1
    # Censored VMs ended by GCE's 24 h limit, a few minutes after it; revoked ones before it.
    assert np.all(np.abs(lifetimes.seconds[lifetimes.censored] - 24 * HOUR) < 45 * 60)
    assert np.all(lifetimes.seconds[~lifetimes.censored] < CENSORED_AT_S)
    assert lifetimes.revoked_fraction_within(48 * HOUR) == pytest.approx(1 - censored / vms)


def test_lifetimes_stop_before_the_previous_experiments():
    # The K80 section's first and a known row: a-europe-west1-b-4 lived 12:07 -> 12:39.
    assert 32 * 60.0 in load_lifetimes("k80").seconds
    text = (SHIPPED_TRACES / "vm_lifetimes.csv").read_text(encoding="utf-8-sig")
    below = text.split("Previous experiments")[1]
    assert "test0" in below  # the 2018 rows exist, and none of them were taken as V100 VMs
    assert load_lifetimes("v100").count == 48


@pytest.mark.parametrize("workers, name, hours", [(1, "k80_ondemand_1worker_runs.csv", 3.91),
                                                  (4, "k80_ondemand_4workers_runs.csv", 0.99)])
def test_ondemand_means_match_the_study_headline(workers, name, hours):
    runs = ondemand_runs(workers)
    assert runs.mean_duration_s == pytest.approx(mean_duration_from_file(name), rel=1e-12)
    assert runs.mean_duration_s / HOUR == pytest.approx(hours, rel=0.01)
    assert runs.durations_s.size == 10 and np.all((runs.accuracy > 0.85) & (runs.accuracy < 1))
    assert (runs.cost_usd is None) == (workers == 1)


@pytest.mark.parametrize("workers", range(1, 9))
def test_ps_curves_cover_64k_steps(workers):
    curve = ps_curve(workers)
    assert curve.step[0] == 0 and 64000 <= curve.step[-1] < 64100
    assert curve.steps_per_second > 0


# ---- the K80 speed model ------------------------------------------------------------------------

def test_calibrate_k80_matches_the_on_demand_runs():
    model = calibrate_k80()
    assert model.max_workers == 64 and model.steps_per_second[0] == 0.0
    assert model.throughput(1) == pytest.approx(64000 / mean_duration_from_file("k80_ondemand_1worker_runs.csv"))
    assert model.throughput(4) == pytest.approx(64000 / mean_duration_from_file("k80_ondemand_4workers_runs.csv"))
    assert np.all(np.diff(model.steps_per_second) > 0)
    assert model.time_for(64000, 4) == pytest.approx(mean_duration_from_file("k80_ondemand_4workers_runs.csv"))
    assert model.time_for(64000, 0) == np.inf
    assert "power law" in model.source and "least squares" in model.source and "max relative error" in model.source
    for k in range(1, 9):
        assert f"k={k}:" in model.source


def test_calibrated_curve_sizes_lie_between_their_neighbours_and_scaled_keeps_the_shape():
    model = calibrate_k80(max_workers=16)
    speeds = model.steps_per_second
    for k in (3, 5, 6, 7):
        assert speeds[k - 1] < speeds[k] < speeds[k + 1]
    v100 = scaled(model, "V100", 12.0)
    assert v100.gpu == "v100" and v100.throughput(1) == pytest.approx(12.0)
    assert np.allclose(v100.steps_per_second / 12.0, speeds / speeds[1])
    assert "Assumption" in v100.source
    with pytest.raises(PlanError, match="covers 0 to 16 workers"):
        model.throughput(17)


# ---- sampling lifetimes -------------------------------------------------------------------------

def test_sample_draws_censored_as_inf_at_the_censored_fraction():
    lifetimes = load_lifetimes("k80")
    draws = lifetimes.sample(np.random.default_rng(7), (400, 500))
    assert draws.shape == (400, 500)
    p = lifetimes.censored_fraction
    assert abs(np.mean(np.isinf(draws)) - p) < 5 * np.sqrt(p * (1 - p) / draws.size)
    assert set(draws[np.isfinite(draws)]) <= set(lifetimes.seconds[~lifetimes.censored])


def test_sample_beyond_never_goes_back_in_time():
    lifetimes = load_lifetimes("k80")
    rng = np.random.default_rng(3)
    survived = np.concatenate([rng.uniform(0, 30 * HOUR, 20000), lifetimes.seconds, [0.0, np.inf]])
    drawn = lifetimes.sample_beyond(rng, survived)
    assert drawn.shape == survived.shape and np.all(drawn >= survived)
    # Past the last revocation only the censored VMs are left.
    last_revocation = lifetimes.seconds[~lifetimes.censored].max()
    assert np.all(np.isinf(lifetimes.sample_beyond(rng, np.full(1000, last_revocation))))


def test_sample_beyond_draws_only_from_longer_lives():
    lifetimes = Lifetimes("k80", seconds=[10.0, 20.0, 30.0, 86500.0], censored=[False, False, False, True])
    drawn = lifetimes.sample_beyond(np.random.default_rng(0), np.full(30000, 15.0))
    assert set(np.unique(drawn)) == {20.0, 30.0, np.inf}
    assert np.allclose([np.mean(drawn == v) for v in (20.0, 30.0, np.inf)], 1 / 3, atol=0.02)
    all_revoked = Lifetimes("k80", seconds=[10.0, 20.0], censored=[False, False])
    assert np.all(np.isinf(all_revoked.sample_beyond(np.random.default_rng(0), np.array([20.0, 25.0]))))


# ---- broken input: one PlanError sentence naming the thing ---------------------------------------

def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_trace_missing_a_column(tmp_path):
    path = write(tmp_path / "t.csv", "VM_name,Revoked\nr1-master,Job completed\nr1-worker-0,Revoked\n")
    with pytest.raises(PlanError, match="no column 'Uptime'"):
        trace_runs(2, path)


def test_trace_with_a_negative_uptime(tmp_path):
    path = write(tmp_path / "t.csv", "VM_name,Uptime,Revoked\nr1-master,100,Job completed\nr1-worker-0,-5,Revoked\n")
    with pytest.raises(PlanError, match=r"line 3: Uptime -5 is negative"):
        trace_runs(2, path)


def test_trace_sizes_the_study_did_not_measure():
    with pytest.raises(PlanError, match="2, 4 and 8 workers, not 3"):
        trace_runs(3)


@pytest.mark.parametrize("gpu", ["a100", "A100"])
def test_unknown_gpu_type(gpu):
    with pytest.raises(PlanError, match=f"GPU type '{gpu}' is unknown; the study measured {', '.join(GPU_TYPES)}"):
        load_lifetimes(gpu)


def test_lifetimes_terminate_before_start(tmp_path):
    path = write(tmp_path / "life.csv", "K80,,\nVM name,Start,Terminate\nvm-0,2/18/19 23:40,2/19/19 23:46\n"
                                        "vm-1,2/19/19 12:07,2/19/19 11:07\n")
    with pytest.raises(PlanError, match=r"life.csv line 4: VM 'vm-1' terminates .* before it starts"):
        load_lifetimes("k80", path)


@pytest.mark.parametrize("text, match", [
    ("K80,,\nVM name,Start\nvm-0,2/18/19 23:40\n", r"line 2: the header has no column 'Terminate'"),
    ("K80,,\nVM name,Start,Terminate\nvm-0,2/18/19 23:40,yesterday\n", r"line 3: Terminate 'yesterday' of VM 'vm-0'"),
    ("K80,,\nvm-0,2/18/19 23:40,2/19/19 23:46\n", r"line 2: a VM line comes before the header line"),
    ("V100,,\nVM name,Start,Terminate\nvm-0,2/18/19 23:40,2/19/19 23:46\n", r"has no K80 section .*are V100"),
])
def test_broken_lifetimes_files(tmp_path, text, match):
    with pytest.raises(PlanError, match=match):
        load_lifetimes("k80", write(tmp_path / "life.csv", text))


def test_ondemand_missing_duration(tmp_path):
    path = write(tmp_path / "od.csv", "Zone,Run,Accuracy,Cost\nus-east1-c,1,0.91,3.0\n")
    with pytest.raises(PlanError, match=r"od.csv line 1 has no column 'Duration'"):
        ondemand_runs(4, path)


def test_ondemand_negative_duration(tmp_path):
    path = write(tmp_path / "od.csv", "Zone,Run,Duration,Accuracy\nus-east1-c,1,3600,0.91\nus-east1-c,2,-1,0.9\n")
    with pytest.raises(PlanError, match=r"od.csv line 3: Duration '-1' is not a positive number of seconds"):
        ondemand_runs(1, path)


def test_plan_errors_are_value_errors_and_a_bad_speed_model_is_refused():
    assert issubclass(PlanError, ValueError)
    with pytest.raises(PlanError):
        SpeedModel(gpu="k80", steps_per_second=np.array([0.0, -1.0]), source="")


def test_the_planner_imports_neither_torch_nor_horovod():
    assert heavy_modules_imported("transientvod.planner.study_data", "transientvod.planner.speed") == []
