"""The planner against the study's measured outcomes, from the study's data only (the copy
shipped in the package), and its commands through the real CLI."""
from __future__ import annotations

import csv
import subprocess

import numpy as np
import pytest

from conftest import REPO, TRANSIENTVOD
from transientvod.planner.scenario import Cluster, Simulator, Workload
from transientvod.planner.study_data import ondemand_runs, trace_runs

# The study's headline (Li et al. 2019; the data README): 4 transient K80s against one
# on-demand K80 trained 3.72x faster for 62.9% less. Both costs count the GPU servers only
# (1 K80 on-demand: 3.91 h x $0.723 = $2.83), and both times are training times.
STUDY_SPEEDUP = 3.72
STUDY_SAVING_PCT = 62.9
K80_SPOT = 0.256  # $/h, the study's price


@pytest.fixture(scope="module")
def simulator():
    return Simulator(Workload(), seed=0)


def finished_means(outcome, study_measure=False):
    ok = ~outcome.failed
    if study_measure:
        return outcome.training_h[ok].mean(), outcome.study_cost_usd[ok].mean()
    return outcome.time_h[ok].mean(), outcome.cost_usd[ok].mean()


def test_headline_four_transient_k80s_against_one_on_demand(simulator):
    one = simulator.run(Cluster("k80", 1, "on-demand", "study", parameter_servers=0), 1000)
    four = simulator.run(Cluster("k80", 4, "spot", "study", parameter_servers=0), 10000, "trace")
    one_time, one_cost = finished_means(one, study_measure=True)
    four_time, four_cost = finished_means(four, study_measure=True)
    speedup = one_time / four_time
    saving = 100 * (1 - four_cost / one_cost)
    assert speedup == pytest.approx(STUDY_SPEEDUP, rel=0.10), speedup
    assert saving == pytest.approx(STUDY_SAVING_PCT, rel=0.10), saving
    # The on-demand baseline is the measured one: 64K steps at the mean of its 10 runs; the
    # cloud's wall time adds the provisioning of one server.
    assert one_time == pytest.approx(ondemand_runs(1).mean_duration_s / 3600, rel=1e-9)
    assert one.time_h[0] == pytest.approx(one_time + simulator.provisioning.seconds(1) / 3600, rel=1e-9)


def measured_transient(workers: int) -> tuple[float, float]:
    """Mean time (h) and GPU cost ($) of the study's transient runs of this size, from the
    trace's uptimes: what the cloud billed for the GPU servers, provisioning included."""
    runs = trace_runs(workers)
    hours = [max(vm.uptime_s for vm in run.vms) / 3600 for run in runs]
    cost = [sum(vm.uptime_s for vm in run.vms) / 3600 * K80_SPOT for run in runs]
    return float(np.mean(hours)), float(np.mean(cost))


def test_the_clouds_bill_matches_the_traced_uptimes_and_keeps_the_studys_order(simulator):
    measured = {n: measured_transient(n) for n in (2, 4, 8)}
    simulated = {n: finished_means(simulator.run(Cluster("k80", n, "spot", "study", parameter_servers=0), 10000,
                                                 "trace"))
                 for n in (2, 4, 8)}
    for results in (measured, simulated):
        times = [results[n][0] for n in (2, 4, 8)]
        costs = [results[n][1] for n in (2, 4, 8)]
        assert times == sorted(times, reverse=True), f"more servers, less time: {results}"
        assert costs == sorted(costs), f"more servers, more money: {results}"
    for n in (2, 4, 8):
        assert simulated[n][0] == pytest.approx(measured[n][0], rel=0.10)
        assert simulated[n][1] == pytest.approx(measured[n][1], rel=0.10)


def test_master_revocation_fails_the_studys_system_but_not_this_one(simulator):
    study = simulator.run(Cluster("k80", 4, "spot", "study"), 3200, "trace")
    elastic = simulator.run(Cluster("k80", 4, "spot", "elastic"), 3200, "trace")
    masters_lost = sum(run.vms[0].revoked for run in trace_runs(4)) / 32
    assert study.failed.mean() == pytest.approx(masters_lost)  # the trace's run whose master went
    assert elastic.failed.mean() < study.failed.mean()


def transientvod(*args):
    return subprocess.run(TRANSIENTVOD + list(args), capture_output=True, text=True, timeout=300, cwd=REPO)


def test_simulate_prints_a_table_and_writes_csv(tmp_path):
    out = tmp_path / "sim.csv"
    done = transientvod("simulate", "--workers", "2,4", "--market", "spot,on-demand", "--runs", "500",
                        "--csv", str(out))
    assert done.returncode == 0, done.stderr
    rows = list(csv.DictReader(open(out)))
    assert [r["configuration"] for r in rows] == ["2 x k80 spot (elastic)", "2 x k80 on-demand (elastic)",
                                                  "4 x k80 spot (elastic)", "4 x k80 on-demand (elastic)"]
    for row in rows:
        assert row["configuration"] in done.stdout
        assert f"{float(row['time_h_mean']):.3f}" in done.stdout
    on_demand = {r["configuration"]: r for r in rows if "on-demand" in r["configuration"]}
    assert all(float(r["failure_pct"]) == 0 and float(r["revocations_mean"]) == 0 for r in on_demand.values())


def test_plan_picks_the_fastest_configuration_within_the_budget():
    done = transientvod("plan", "--figure", "", "--budget", "1.5", "--max-workers", "8", "--runs", "500")
    assert done.returncode == 0, done.stderr
    assert "8 x k80 spot (elastic) wins" in done.stdout, done.stdout
    assert "8 x k80 on-demand (elastic) would be faster" in done.stdout, done.stdout


@pytest.mark.parametrize("args, fragment", [
    (["plan", "--budget", "0.2"], "no configuration keeps the risk"),
    (["simulate", "--gpu", "a100"], "'a100'"),
    (["simulate", "--parameter-servers", "-1"], "parameter servers is -1"),
    (["simulate", "--schedule", "70000:+1"], "at step 70000, but the job has only 64000 steps"),
    (["simulate", "--schedule", "16000:-1"], "a schedule only adds servers"),
    (["simulate", "--schedule", "16000"], "must look like 16000:+1"),
    (["simulate", "--speed", "a100=3"], "GPU or instance type 'a100' is unknown; the planner knows AWS families"),
    (["simulate", "--workers", "3"], "--revocations lifetimes"),
])
def test_bad_planner_input_is_one_sentence(args, fragment):
    done = transientvod(*args)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0] and "Traceback" not in done.stderr, done.stderr


def test_bounded_staleness_speedup_divides_the_on_demand_time(simulator):
    synchronous = simulator.run(Cluster("k80", 4, "on-demand", "elastic"), 10)
    stale = simulator.run(Cluster("k80", 4, "on-demand", "elastic", staleness_speedup=1.32), 10)
    assert stale.training_h == pytest.approx(synchronous.training_h / 1.32)
    assert stale.time_h - stale.training_h == pytest.approx(synchronous.time_h - synchronous.training_h)  # provisioning


def test_a_trace_of_your_own_is_replayed_and_checked(tmp_path):
    good = tmp_path / "mine.csv"
    good.write_text("VM_name,Uptime,Revoked\nr1-master,9000,Job completed\nr1-worker-0,600,Revoked\n")
    done = transientvod("simulate", "--workers", "2", "--trace", str(good), "--runs", "100")
    assert done.returncode == 0, done.stderr
    row = next(line for line in done.stdout.splitlines() if line.startswith("2 x k80 spot (elastic)"))
    assert float(row.split()[6]) >= 1.0, row  # the worker's revocation in every run, the master's in some
    assert str(good) in done.stdout
    missing = tmp_path / "no-uptime.csv"
    missing.write_text("VM_name,Revoked\nr1-master,Job completed\n")
    done = transientvod("simulate", "--workers", "1", "--trace", str(missing))
    assert done.returncode == 2 and "'Uptime'" in done.stderr and "Traceback" not in done.stderr, done.stderr
    negative = tmp_path / "negative.csv"
    negative.write_text("VM_name,Uptime,Revoked\nr1-master,-5,Revoked\n")
    done = transientvod("simulate", "--workers", "1", "--trace", str(negative))
    assert done.returncode == 2 and "negative" in done.stderr and "line 2" in done.stderr, done.stderr


def test_p100_and_v100_speeds_come_from_the_study_and_speed_overrides_them(simulator):
    from transientvod.planner.study_tables import published_rows

    rows = published_rows()
    for gpu in ("p100", "v100"):
        speed = simulator.speed(gpu)
        assert speed.throughput(1) == pytest.approx(64000 / (rows[f"1 {gpu.upper()} transient"].time_h * 3600))
        # More servers: behind the parameter server's capacity (ps_capacity.py), below K80's shape.
        k80 = simulator.speed("k80")
        assert speed.throughput(4) / speed.throughput(1) < k80.throughput(4) / k80.throughput(1)
        assert "capacity" in speed.source
    faster = Simulator(Workload(single_worker_steps_per_s={"v100": 20.0}), seed=0)
    outcome = faster.run(Cluster("v100", 1, "on-demand", "study"), 10)
    assert outcome.training_h[0] == pytest.approx(64000 / 20.0 / 3600)
    done = transientvod("simulate", "--gpu", "v100", "--workers", "1", "--market", "on-demand", "--system", "study",
                        "--runs", "10", "--speed", "v100=20")
    assert done.returncode == 0, done.stderr
    row = next(line for line in done.stdout.splitlines() if line.startswith("1 x v100 on-demand"))
    assert row.split()[-2] == f"{64000 / 20.0 / 3600:.3f}", row  # train h


def test_simulate_a_growing_cluster_from_the_command_line():
    done = transientvod("simulate", "--workers", "1", "--market", "on-demand", "--system", "study", "--runs", "10",
                        "--schedule", "16000:+1,32000:+1,48000:+1")
    assert done.returncode == 0, done.stderr
    row = next(line for line in done.stdout.splitlines() if line.startswith("1 x k80 on-demand"))
    assert "+1 at 16000, +1 at 32000, +1 at 48000" in row
    # Faster than one K80 (3.911 h of training), slower than four from the start (0.995 h).
    assert 0.995 < float(row.split()[-2]) < 3.911, row
