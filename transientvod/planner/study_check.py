"""The planner beside every row of the study's published table, as docs/planner.md shows it.

    python -m transientvod.planner.study_check     # the table, computed now

Each row is simulated with what its published number counts (10,000 runs, seed 0, the
study's system): K80 clusters with their parameter server, single servers without (the
study's single-server costs are duration x the GPU's price); transient K80 clusters replay
the traces ("no revocation": the simulated runs with none), P100 and V100 draw from their
lifetimes. "Headline" is the study's 4 transient K80s over all 32 traced runs, GPUs only.
tests/planner/test_planner_tables.py checks every row within 10 % and that the page shows this table.
Never imports torch or horovod.
"""
from __future__ import annotations

from transientvod.planner.scenario import Cluster, Simulator, Workload
from transientvod.planner.study_data import trace_runs
from transientvod.planner.study_tables import published_rows

RUNS = 10000
SEED = 0
HEADLINE = "4 K80 transient, all 32 runs (GPU only; headline)"
# (published row, GPU, servers, market, parameter servers, what its cost includes)
ROWS = [
    ("2 K80 transient, no revocation", "k80", 2, "spot", 1, "GPUs + 1 PS"),
    ("4 K80 transient, no revocation", "k80", 4, "spot", 1, "GPUs + 1 PS"),
    ("8 K80 transient, no revocation", "k80", 8, "spot", 1, "GPUs + 1 PS"),
    ("2 K80 on-demand", "k80", 2, "on-demand", 1, "GPUs + 1 PS"),
    ("4 K80 on-demand", "k80", 4, "on-demand", 1, "GPUs + 1 PS"),
    ("8 K80 on-demand", "k80", 8, "on-demand", 1, "GPUs + 1 PS"),
    ("1 K80 on-demand (+PS)", "k80", 1, "on-demand", 0, "GPU only"),
    ("1 P100 transient", "p100", 1, "spot", 0, "GPU only"),
    ("1 V100 transient", "v100", 1, "spot", 0, "GPU only"),
]


def _means(outcome, chosen):
    return tuple(float(getattr(outcome, name)[chosen].mean())
                 for name in ("training_h", "study_cost_usd", "time_h", "cost_usd"))


def _off(predicted, published) -> str:
    return "—" if published is None else f"{100 * (predicted / published - 1):+.1f} %"


def _value(value, fmt=".2f") -> str:
    return "—" if value is None else format(value, fmt)


def rows_table(simulator: Simulator | None = None, readme=None) -> str:
    simulator = simulator or Simulator(Workload(), seed=SEED)
    published = published_rows(readme)
    lines = ["| configuration (includes) | study time h | study cost $ | predicted time h | predicted cost $ | time off "
             "| cost off | cloud's wall h | cloud's bill $ | study failed % | predicted failed % |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row, gpu, n, market, ps, includes in ROWS:
        cluster = Cluster(gpu, n, market, "study", parameter_servers=ps)
        traced = market == "spot" and gpu == "k80"
        outcome = simulator.run(cluster, RUNS, "trace" if traced else "lifetimes")
        chosen = ~outcome.failed & (outcome.revocations == 0) if traced else ~outcome.failed
        time_h, cost, wall, bill = _means(outcome, chosen)
        study = published[row]
        predicted_failed = "—" if traced else ("0" if market == "on-demand" else f"{100 * outcome.failed.mean():.2f}")
        name = row.replace(" (+PS)", "")
        lines.append(f"| {name} ({includes}) | {_value(study.time_h)} | {_value(study.cost_usd)} | {time_h:.2f} | "
                     f"{cost:.2f} | {_off(time_h, study.time_h)} | {_off(cost, study.cost_usd)} | {wall:.2f} | "
                     f"{bill:.2f} | {_value(study.failed_pct, 'g')} | {predicted_failed} |")
    # The headline: 4 transient K80s, GPUs only, every traced run (revoked or not).
    outcome = simulator.run(Cluster("k80", 4, "spot", "study", parameter_servers=0), RUNS, "trace")
    time_h, cost, wall, bill = _means(outcome, ~outcome.failed)
    study = published["4 K80 transient (+PS)"]
    runs = trace_runs(4)
    failed = sum(run.vms[0].revoked for run in runs)  # the master revoked: the study's run failed
    lines.append(f"| {HEADLINE} | {study.time_h:.2f} | {study.cost_usd:.2f} | {time_h:.2f} | {cost:.2f} | "
                 f"{_off(time_h, study.time_h)} | {_off(cost, study.cost_usd)} | {wall:.2f} | {bill:.2f} | "
                 f"{100 * failed / len(runs):.1f} ({failed} of {len(runs)}) | {100 * outcome.failed.mean():.2f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(rows_table(), end="")
