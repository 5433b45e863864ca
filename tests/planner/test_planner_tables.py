"""The planner against every row of the study's published tables (issue 13).

The expected numbers are read from the workplace's reference copy of the study's data,
../shared/data/gce-2019/README.md, not from the copy the package ships (and the planner
reads); one test checks that the two say the same. Predictions use the study's measure
(training time; training server-seconds x prices), which is what its tables report.
Simulation: 10,000 runs, seed 0, `--system study --revocations trace` (K80 clusters) or
`lifetimes` (single P100 and V100 servers, which the traces do not cover).
"""
from __future__ import annotations

import csv
from datetime import datetime

import numpy as np
import pytest

from conftest import REPO
from transientvod.planner.overheads import WITHIN_POINTS, markdown_table, overhead_rows
from transientvod.planner.provisioning import fit_provisioning
from transientvod.planner.scenario import Cluster, Simulator, Workload
from transientvod.planner.study_tables import published_overheads, published_rows

REFERENCE = REPO.parent / "shared" / "data" / "gce-2019"
RUNS = 10000


@pytest.fixture(scope="module")
def reference_readme():
    path = REFERENCE / "README.md"
    if not path.exists():
        pytest.skip(f"the workplace's reference copy of the study's data is not at {path}")
    return path


@pytest.fixture(scope="module")
def simulator():
    return Simulator(Workload(), seed=0)


@pytest.fixture(scope="module")
def transient(simulator):
    """The study's system on 2, 4 and 8 transient K80s replaying the traces, 1 PS."""
    return {n: simulator.run(Cluster("k80", n, "spot", "study"), RUNS, "trace") for n in (2, 4, 8)}


def by_revocations(outcome, r):
    """Mean training hours and study cost of the finished runs with exactly r revocations."""
    chosen = ~outcome.failed & (outcome.revocations == r)
    assert chosen.sum() >= RUNS // 40, f"only {chosen.sum()} runs with {r} revocations"
    return outcome.training_h[chosen].mean(), outcome.study_cost_usd[chosen].mean()


def test_the_shipped_readme_has_the_reference_tables(reference_readme):
    shipped, reference = published_rows(), published_rows(reference_readme)
    assert shipped == reference
    assert published_overheads() == published_overheads(reference_readme)
    assert reference["1 V100 transient"].failed_pct == 43.8 and reference["8 K80 on-demand"].cost_usd == 3.01


def uptimes(n):
    """Longest VM uptime of each revocation-free run of the n-K80 trace, read without the planner."""
    runs = {}
    with open(REFERENCE / f"k80_spot_{n}workers_vm_trace.csv", newline="", encoding="utf-8-sig") as f:
        for row in csv.DictReader(f):
            run = runs.setdefault(row["VM_name"].rsplit("-", 2 if "worker" in row["VM_name"] else 1)[0], [])
            run.append((float(row["Uptime"]), row["Revoked"].strip().lower() == "job completed"))
    return [max(u for u, _ in vms) for vms in runs.values() if all(done for _, done in vms)]


def ondemand_mean(n):
    name = "k80_ondemand_1worker_runs.csv" if n == 1 else f"k80_ondemand_{n}workers_runs.csv"
    with open(REFERENCE / name, newline="", encoding="utf-8-sig") as f:
        return float(np.mean([float(row["Duration"]) for row in csv.DictReader(f)]))


def test_provisioning_is_the_traced_uptime_beyond_the_on_demand_training(reference_readme):
    fit = fit_provisioning()
    for n in (2, 4, 8):
        clean = uptimes(n)
        assert len(clean) >= 20  # 26, 21 and 25 of the 32 runs
        assert fit.measured_s[n] == pytest.approx(np.mean(clean) - ondemand_mean(n), rel=1e-9)
        assert abs(fit.seconds(n) - fit.measured_s[n]) < 10  # a line fits it within seconds
    # It grows with the cluster, not with the job: as a fraction of training it would be
    # 2.6 %, 7.2 % and 23.3 % (the old multiplicative slowdown); in seconds it is a line.
    assert fit.measured_s[2] < fit.measured_s[4] < fit.measured_s[8]
    assert 30 < fit.per_server_s < 50 and 50 < fit.base_s < 150


def test_revocation_free_transient_clusters_train_at_the_on_demand_speed(reference_readme, transient, simulator):
    for n, outcome in transient.items():
        training, _ = by_revocations(outcome, 0)
        assert training == pytest.approx(ondemand_mean(n) / 3600, rel=1e-9)
        # The cloud's wall time adds the provisioning.
        chosen = ~outcome.failed & (outcome.revocations == 0)
        assert outcome.time_h[chosen].mean() == pytest.approx(training + simulator.provisioning.seconds(n) / 3600)


# The study's single-server costs are duration x the GPU's price, without the parameter
# server (1 K80 on-demand 3.91 h x $0.723 = $2.83; 1 P100 1.50 h x $0.551 = $0.83; 1 V100
# 1.23 h x $0.861 = $1.06); its K80 clusters' costs include one PS (2 K80s 1.96 h x (2 x
# $0.256 + $0.143) = $1.28). Each row is compared with the measure its number was computed as.
ROWS = [  # (published row, GPU, servers, market, parameter servers)
    ("2 K80 transient, no revocation", "k80", 2, "spot", 1),
    ("4 K80 transient, no revocation", "k80", 4, "spot", 1),
    ("8 K80 transient, no revocation", "k80", 8, "spot", 1),
    ("2 K80 on-demand", "k80", 2, "on-demand", 1),
    ("4 K80 on-demand", "k80", 4, "on-demand", 1),
    ("8 K80 on-demand", "k80", 8, "on-demand", 1),
    ("1 K80 on-demand (+PS)", "k80", 1, "on-demand", 0),
    ("1 P100 transient", "p100", 1, "spot", 0),
    ("1 V100 transient", "v100", 1, "spot", 0),
]


def predicted_row(simulator, gpu, n, market, ps, transient):
    if market == "spot" and gpu == "k80":
        return by_revocations(transient[n] if ps == 1 else simulator.run(Cluster(gpu, n, market, "study",
                                                                                 parameter_servers=ps), RUNS,
                                                                         "trace"), 0)
    outcome = simulator.run(Cluster(gpu, n, market, "study", parameter_servers=ps), RUNS, "lifetimes")
    ok = ~outcome.failed
    return outcome.training_h[ok].mean(), outcome.study_cost_usd[ok].mean()


@pytest.mark.parametrize("row, gpu, n, market, ps", ROWS)
def test_every_row_of_the_studys_table_within_10_percent(reference_readme, simulator, transient, row, gpu, n, market,
                                                         ps):
    published = published_rows(reference_readme)[row]
    time_h, cost = predicted_row(simulator, gpu, n, market, ps, transient)
    if published.time_h is not None:  # the on-demand 2/4/8 rows print only a cost
        assert time_h == pytest.approx(published.time_h, rel=0.10)
    assert cost == pytest.approx(published.cost_usd, rel=0.10)


def test_single_server_costs_with_the_parameter_server_would_miss(reference_readme, simulator, transient):
    """Why the single-server rows are compared without the PS: with it they are 20-26 % high."""
    rows = published_rows(reference_readme)
    for row, gpu in (("1 K80 on-demand (+PS)", "k80"), ("1 P100 transient", "p100"), ("1 V100 transient", "v100")):
        market = "on-demand" if "on-demand" in row else "spot"
        _, cost = predicted_row(simulator, gpu, 1, market, 1, transient)
        assert cost / rows[row].cost_usd - 1 > 0.15, row


def test_every_revocation_overhead_within_2_points_with_the_studys_billing_rule(reference_readme, simulator,
                                                                                  transient):
    """The billing rule (a revoked server billed from the cluster's start, its provisioning
    included, until its revocation) against every published overhead, untuned: the
    provisioning comes from the revocation-free runs. The planner's earlier rule (training
    seconds only) misses the 8-K80 costs by 3.7 and 6.3 points, so the data tells them apart."""
    rows = overhead_rows(simulator, transient, reference_readme)
    assert {(row.workers, row.revocations) for row in rows} == set(published_overheads(reference_readme))
    for row in rows:
        assert row.runs >= RUNS // 40, row
        assert abs(row.time_off) <= WITHIN_POINTS and abs(row.cost_off) <= WITHIN_POINTS, row
    training_only = {(row.workers, row.revocations): row.training_only_cost_pct - row.published_cost_pct
                     for row in rows}
    assert training_only[(8, 1)] < -WITHIN_POINTS and training_only[(8, 2)] < -WITHIN_POINTS


def test_the_rows_table_in_docs_is_the_one_the_script_writes(reference_readme, simulator):
    """docs/planner.md shows `python -m transientvod.planner.study_check`'s table of the rows."""
    from transientvod.planner.study_check import rows_table

    assert rows_table(simulator, reference_readme) in (REPO / "docs" / "planner.md").read_text(encoding="utf-8")


def test_the_overhead_table_in_docs_is_the_one_the_script_writes(reference_readme, simulator, transient):
    """docs/planner.md shows `python -m transientvod.planner.overheads`'s table, not figures by hand."""
    table = markdown_table(overhead_rows(simulator, transient, reference_readme))
    assert table in (REPO / "docs" / "planner.md").read_text(encoding="utf-8")


def lifetimes_shorter_than(gpu, seconds):
    """Fraction of the study's VMs of a GPU type (vm_lifetimes.csv, read without the planner)
    revoked within `seconds` of their start."""
    lives, section = [], None
    with open(REFERENCE / "vm_lifetimes.csv", newline="", encoding="utf-8-sig") as f:
        for fields in csv.reader(f):
            fields = [x.strip() for x in fields]
            if not any(fields) or fields[0] == "VM name":
                continue
            if fields[0] == "Previous experiments":
                break
            if not any(fields[1:]):
                section = fields[0].lower()
                continue
            if section == gpu:
                start, end = (datetime.strptime(x, "%m/%d/%y %H:%M") for x in fields[1:3])
                lives.append((end - start).total_seconds())
    return np.mean(np.array(lives) <= seconds), len(lives)


@pytest.mark.parametrize("gpu", ["p100", "v100"])
def test_single_server_failures_from_lifetimes_beside_the_studys(reference_readme, simulator, gpu):
    outcome = simulator.run(Cluster(gpu, 1, "spot", "study", parameter_servers=0), RUNS, "lifetimes")
    job_s = float(outcome.time_h.max()) * 3600  # provisioning + training: the VM must live this long
    expected, vms = lifetimes_shorter_than(gpu, job_s)
    assert vms in (40, 48)
    assert outcome.failed.mean() == pytest.approx(expected, abs=0.01)
    # No measured P100 or V100 VM was revoked within the 1.5 h or 1.3 h job (the shortest
    # revoked lifetimes: 4.8 h and 1.38 h), so the lifetimes cannot explain the study's 6.66 %
    # and 43.8 %: those training runs ran in other zones on other days.
    study = published_rows(reference_readme)[f"1 {gpu.upper()} transient"].failed_pct
    assert 100 * outcome.failed.mean() < study / 2


# ---- growing clusters: the study's dynamic cluster ------------------------------------------

DYNAMIC = ((16000, 1), (32000, 1), (48000, 1))  # one K80 added every 16K steps, 1 to 4


def test_a_growing_on_demand_cluster_trains_segment_by_segment(simulator):
    """Each added server trains after its provisioning; until then the cluster keeps its size."""
    speed, provisioning = simulator.speed("k80"), simulator.provisioning
    expected, done, k = 0.0, 0.0, 1
    for step, count in DYNAMIC + ((64000, 0),):
        expected += (step - done) / speed.throughput(k)
        done = step
        if count:
            booting = provisioning.seconds(count)
            expected += booting
            done += booting * speed.throughput(k)
            k += count
    outcome = simulator.run(Cluster("k80", 1, "on-demand", "study", schedule=DYNAMIC), 10)
    assert outcome.training_h[0] * 3600 == pytest.approx(expected, rel=1e-9)
    assert outcome.time_h[0] * 3600 == pytest.approx(expected + provisioning.seconds(1), rel=1e-9)


def test_the_studys_dynamic_cluster(reference_readme, simulator):
    """Transient K80s with the study's PS, revocations from the K80 lifetimes (no trace covers a
    growing cluster): 45 % faster (study 40.8 %) but 15 % cheaper (study 21.5 %), the cost not
    reproduced within 5 points (README: the added servers' hours cost more than the PS hours
    saved, unless the study's baseline or billing differed in a way its data does not show)."""
    from transientvod.planner.study_tables import published_dynamic_cluster

    faster_pct, cheaper_pct = published_dynamic_cluster(reference_readme)
    one = simulator.run(Cluster("k80", 1, "spot", "study"), RUNS, "lifetimes")
    grown = simulator.run(Cluster("k80", 1, "spot", "study", schedule=DYNAMIC), RUNS, "lifetimes")

    def mean(outcome, name):
        return getattr(outcome, name)[~outcome.failed].mean()

    faster = 100 * (1 - mean(grown, "training_h") / mean(one, "training_h"))
    cheaper = 100 * (1 - mean(grown, "study_cost_usd") / mean(one, "study_cost_usd"))
    assert abs(faster - faster_pct) < 5, faster
    assert 0 < cheaper < cheaper_pct - 5, cheaper  # cheaper, but not by as much: the named miss
