"""How long a cluster's servers are rented before the job trains: provisioning, fitted to the study.

    fit = fit_provisioning()      # from the K80 traces and the on-demand runs
    fit.seconds(4)                # 262.6: a 4-server cluster trains from t = 262.6 s on
    print(fit.source)             # the measurements and the fit

A VM's `Uptime` in the study's traces runs from the cluster's start until the VM ended, so it
includes booting the VMs and starting TensorFlow, which the cloud bills and which trains
nothing. The study's own times and costs count training only: its revocation-free transient
clusters trained as fast as its on-demand ones (2 K80s 1.96 h against 1.99 h on-demand, 4 K80s
0.98 against 0.99, 8 K80s 0.51 against 0.51; data README). So a revocation-free traced run's
longest uptime minus the on-demand training time of the same size is the provisioning:

    n = 2: 185 s (26 runs), n = 4: 257 s (21 runs), n = 8: 427 s (25 runs)

It grows with the cluster, about 40 s per server on top of 100 s, not with the job's length: as
a fraction of the run it is 2.6 %, 7.2 % and 23.3 %, which is why the multiplicative
"transient slowdown" the planner used to fit to the same numbers mispredicted 8 K80s by 23 %.
The planner uses the least-squares line through the three sizes for every size (residuals
under 6 s) and every GPU type (the study traced only K80 clusters).
Never imports torch or horovod.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from transientvod.planner.study_data import TRACE_SIZES, PlanError, ondemand_runs, trace_runs


@dataclass(frozen=True)
class Provisioning:
    """Provisioning seconds of an n-server cluster: `base_s + per_server_s * n`."""

    base_s: float
    per_server_s: float
    measured_s: dict  # cluster size -> measured provisioning (seconds)
    source: str

    def seconds(self, servers: int) -> float:
        return self.base_s + self.per_server_s * servers


def measured_provisioning(workers: int) -> tuple[float, int]:
    """Mean longest uptime of the revocation-free runs of the study's n-K80 trace, minus the mean
    duration of its on-demand n-K80 runs; and how many runs were revocation-free."""
    clean = [max(vm.uptime_s for vm in run.vms) for run in trace_runs(workers)
             if all(vm.outcome == "completed" for vm in run.vms)]
    if not clean:
        raise PlanError(f"the {workers}-worker trace has no run without a revocation; cannot measure its provisioning.")
    return float(np.mean(clean)) - ondemand_runs(workers).mean_duration_s, len(clean)


def fit_provisioning(sizes=TRACE_SIZES) -> Provisioning:
    measured, lines = {}, []
    for n in sizes:
        measured[n], runs = measured_provisioning(n)
        lines.append(f"  n={n}: {measured[n]:.1f} s = mean longest uptime of {runs} revocation-free traced runs "
                     f"- mean on-demand duration {ondemand_runs(n).mean_duration_s:.1f} s")
    per_server, base = np.polyfit(list(measured), list(measured.values()), 1)
    worst = max(abs(base + per_server * n - measured[n]) for n in measured)
    lines.append(f"  fit: {base:.1f} s + {per_server:.1f} s per server (least squares; largest residual "
                 f"{worst:.1f} s); used for every size and GPU type")
    if per_server < 0 or base + per_server < 0:
        raise PlanError("the provisioning fitted to the traces is negative; check the trace and on-demand files.")
    return Provisioning(float(base), float(per_server), measured,
                        "provisioning (billed, no training) by cluster size:\n" + "\n".join(lines))
