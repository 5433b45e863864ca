"""Mixed clusters: the rates of every set of servers (planner/mixed.py), bounded staleness on
steady and fluctuating speeds, and mixed clusters through the simulator and the CLI."""
from __future__ import annotations

import subprocess

import numpy as np
import pytest

from conftest import REPO, TRANSIENTVOD
from transientvod.planner.mixed import rate_by_set, staleness_rate
from transientvod.planner.scenario import Cluster, Simulator, Workload
from transientvod.planner.study_data import PlanError

MIX = (("k80", 2), ("p100", 2))


@pytest.fixture(scope="module")
def simulator():
    return Simulator(Workload(), seed=0)


@pytest.fixture(scope="module")
def k80_shape(simulator):
    k80 = simulator.speed("k80")
    return np.asarray(k80.steps_per_second) / k80.steps_per_second[1]


@pytest.mark.parametrize("rule", ["sum", "slowest"])
def test_one_type_gets_its_calibrated_speed_either_way(simulator, k80_shape, rule):
    k80 = simulator.speed("k80")
    rates = rate_by_set([k80.throughput(1)] * 4, k80_shape, rule)
    for mask in range(16):
        assert rates[mask] == pytest.approx(k80.throughput(bin(mask).count("1")), rel=1e-12)


def test_async_adds_speeds_and_sync_waits_for_the_slowest(k80_shape):
    speeds = [2.0, 2.0, 5.0, 5.0]
    total = rate_by_set(speeds, k80_shape, "sum")
    slowest = rate_by_set(speeds, k80_shape, "slowest")
    assert total[0b1111] == pytest.approx(14.0 * k80_shape[4] / 4)
    assert slowest[0b1111] == pytest.approx(2.0 * k80_shape[4])
    # Losing a slow server: async loses its share, sync gets faster (the slowest left is fast).
    assert total[0b1110] == pytest.approx(12.0 * k80_shape[3] / 3)
    assert slowest[0b1100] == pytest.approx(5.0 * k80_shape[2]) and slowest[0b1100] > slowest[0b1111]
    assert total[0] == slowest[0] == 0.0


def test_bounded_staleness_cannot_beat_a_steadily_slower_server():
    # Rank 0 takes 1 s per step, rank 1 0.4 s: whatever the staleness, 1 step/s in the long run.
    steady = np.array([[1.0] * 2000, [0.4] * 2000])
    for s in (0, 1, 2, 8):
        assert staleness_rate(steady, s) == pytest.approx(1.0, rel=0.01)


def test_bounded_staleness_tracks_the_mean_when_speeds_fluctuate():
    # Two ranks whose step times jitter independently (0.5..1.5 s, mean 1 s): synchronous steps
    # wait for the worse of the two (mean 1.17 s); staleness lets each rank absorb its bad steps.
    rng = np.random.default_rng(0)
    jitter = rng.uniform(0.5, 1.5, (2, 20000))
    rates = [staleness_rate(jitter, s) for s in (0, 1, 2, 4, 16)]
    assert rates[0] == pytest.approx(1 / np.maximum(jitter[0], jitter[1]).mean(), rel=1e-9)
    assert rates == sorted(rates)  # more staleness, more speed
    assert rates[0] < 0.9 and rates[-1] > 0.95  # from the worst-case mean toward 1 step/s (the mean)
    assert rates[-1] <= 1 / jitter.mean(axis=1).max() + 1e-9  # never faster than the slower rank's mean


def test_a_mixed_on_demand_cluster(simulator, k80_shape):
    k80, p100 = simulator.speed("k80").throughput(1), simulator.speed("p100").throughput(1)
    study = simulator.run(Cluster(mix=MIX, market="on-demand", system="study"), 10, "lifetimes")
    elastic = simulator.run(Cluster(mix=MIX, market="on-demand", system="elastic"), 10, "lifetimes")
    assert study.training_h[0] * 3600 == pytest.approx(64000 / ((2 * k80 + 2 * p100) * k80_shape[4] / 4))
    assert elastic.training_h[0] * 3600 == pytest.approx(64000 / (k80 * k80_shape[4]))
    # Billed per type: 2 K80s and 2 P100s at their on-demand prices, and the study's PS.
    hours = study.training_h[0]
    assert study.study_cost_usd[0] == pytest.approx(hours * (2 * 0.723 + 2 * 1.43 + 0.143))
    assert study.cluster.label == "2 x k80+2 x p100 on-demand (study, 1 PS)"


def test_a_mixed_spot_cluster_draws_each_types_lifetimes(simulator):
    outcome = simulator.run(Cluster(mix=(("k80", 1), ("v100", 3)), market="spot", system="study"), 4000, "lifetimes")
    assert 0 < outcome.revocations.mean() < 1
    with pytest.raises(PlanError, match="--revocations lifetimes"):
        simulator.run(Cluster(mix=MIX, market="spot", system="study"), 10, "trace")
    with pytest.raises(PlanError, match="single-type cluster"):
        Cluster(mix=MIX, schedule=((100, 1),))


def transientvod(*args):
    return subprocess.run(TRANSIENTVOD + list(args), capture_output=True, text=True, timeout=300, cwd=REPO)


def test_mixed_cluster_from_the_command_line():
    done = transientvod("simulate", "--workers", "k80:2,p100:2", "--system", "study", "--market", "on-demand",
                        "--runs", "10")
    assert done.returncode == 0, done.stderr
    assert "2 x k80+2 x p100 on-demand (study, 1 PS)" in done.stdout


def test_one_type_written_as_a_mix_is_the_plain_cluster():
    """k80:4 is 4 K80s: replayed from the study's 4-K80 traces, and a schedule may grow it."""
    as_mix = transientvod("simulate", "--workers", "k80:4", "--runs", "50", "--schedule", "32000:+1")
    plain = transientvod("simulate", "--workers", "4", "--runs", "50", "--schedule", "32000:+1")
    assert as_mix.returncode == 0, as_mix.stderr
    assert as_mix.stdout == plain.stdout


@pytest.mark.parametrize("workers, fragment", [
    ("k80:2,a100:2", "GPU or instance type 'a100' is unknown; the planner knows AWS families"),
    ("k80:2,p100:-1", "has -1 servers"),
    ("k80:2,p100", "must look like p100:2"),
])
def test_bad_mixed_cluster_is_one_sentence(workers, fragment):
    done = transientvod("simulate", "--workers", workers, "--revocations", "lifetimes")
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0] and "Traceback" not in done.stderr, done.stderr


def test_plan_considers_mixed_clusters():
    from transientvod.planner.commands import cluster_shapes

    shapes = cluster_shapes(["k80", "p100", "v100"], 6, mixed=True)
    assert len(shapes) == 3 * 6 + 3 * (1 + 2 + 3 + 4 + 5)  # every size of each type, every split of each pair
    assert {"mix": (("k80", 1), ("v100", 5))} in shapes and len(cluster_shapes(["k80"], 6, mixed=True)) == 6
    done = transientvod("plan", "--figure", "", "--deadline", "0.6", "--gpus", "k80,p100,v100", "--system", "study",
                        "--max-workers", "6", "--mixed", "--runs", "500", "--top", "20")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("126 configurations"), done.stdout
    assert any("+" in line.split("spot")[0] for line in done.stdout.splitlines()[3:] if "spot" in line), done.stdout
