"""The study's revocation overheads against the planner's, and the billing rule that explains them.

    rows = overhead_rows()                 # one OverheadRow per published (cluster size, revocations)
    print(markdown_table(rows))            # the table docs/planner.md shows
    python -m transientvod.planner.overheads   # the same table, computed now

The study published, for 2, 4 and 8 transient K80s, how much longer and costlier runs with
one or two revocations were than runs with none (data README). The planner replays the
traces with the study's system (10,000 runs, seed 0) and compares the finished runs with
exactly r revocations against those with none, in the study's measure. Its billing rule
(scenario.py): a revoked server is billed for its whole life from the cluster's start,
provisioning included, until its revocation; the survivors and the parameter server for the
training time. Nothing in it is fitted to the overheads: the provisioning line comes from
the revocation-free runs (provisioning.py). The other rule the issue names, a revoked server
billed only for its training seconds until its revocation (the planner's earlier rule), is
computed beside it from the same runs, to show that the data tells the two apart (8 K80s:
-1.0 % and -0.9 % against the study's +2.7 % and +5.4 %). Never imports torch or horovod.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from transientvod.billing.prices import GCE_SPOT_USD_PER_HOUR
from transientvod.planner.scenario import Cluster, Outcome, Simulator, Workload
from transientvod.planner.study_tables import published_overheads

RUNS = 10000
SEED = 0
WITHIN_POINTS = 2.0  # the bar: one rule explains every overhead within 2 points


@dataclass(frozen=True)
class OverheadRow:
    workers: int
    revocations: int
    runs: int  # simulated finished runs with exactly that many revocations
    published_time_pct: float
    published_cost_pct: float
    time_pct: float  # the planner's, with its billing rule
    cost_pct: float
    training_only_cost_pct: float  # a revoked server billed for its training seconds only

    @property
    def time_off(self) -> float:
        return self.time_pct - self.published_time_pct

    @property
    def cost_off(self) -> float:
        return self.cost_pct - self.published_cost_pct


def _finished_with(outcome: Outcome, revocations: int) -> np.ndarray:
    return ~outcome.failed & (outcome.revocations == revocations)


def overhead_rows(simulator: Simulator | None = None, outcomes: dict | None = None,
                  readme=None) -> list[OverheadRow]:
    """Every published overhead beside the planner's. `outcomes` ({size: Outcome} of the
    study's system on transient K80s replaying the traces) saves simulating them again."""
    simulator = simulator or Simulator(Workload(), seed=SEED)
    outcomes = dict(outcomes or {})
    price = GCE_SPOT_USD_PER_HOUR["k80"]
    rows = []
    for (n, r), (time_pub, cost_pub) in sorted(published_overheads(readme).items(), key=lambda i: (i[0][1], i[0][0])):
        if n not in outcomes:
            outcomes[n] = simulator.run(Cluster("k80", n, "spot", "study"), RUNS, "trace")
        outcome = outcomes[n]
        none, some = _finished_with(outcome, 0), _finished_with(outcome, r)
        base_time, base_cost = outcome.training_h[none].mean(), outcome.study_cost_usd[none].mean()
        time_h, cost = outcome.training_h[some].mean(), outcome.study_cost_usd[some].mean()
        # The other rule, from the same runs: each revoked server's provisioning taken back off.
        provisioning_usd = r * simulator.provisioning.seconds(n) * price / 3600.0
        training_only = cost - provisioning_usd
        rows.append(OverheadRow(n, r, int(some.sum()), time_pub, cost_pub, 100 * (time_h / base_time - 1),
                                100 * (cost / base_cost - 1), 100 * (training_only / base_cost - 1)))
    return rows


def markdown_table(rows: list[OverheadRow]) -> str:
    lines = ["| cluster | r | study time / cost % | planner time / cost % | off (points) | runs "
             "| cost % if revoked servers billed training only |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for row in rows:
        lines.append(f"| {row.workers} K80 | {row.revocations} | {row.published_time_pct:.1f} / "
                     f"{row.published_cost_pct:.1f} | {row.time_pct:.1f} / {row.cost_pct:.1f} | "
                     f"{row.time_off:+.1f} / {row.cost_off:+.1f} | {row.runs} | "
                     f"{row.training_only_cost_pct:.1f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown_table(overhead_rows()), end="")
