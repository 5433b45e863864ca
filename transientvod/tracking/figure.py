"""The cost-versus-accuracy figure of one run: `log_figure` reads the run's metric history
from MLflow, draws it (`cost_accuracy_figure`) and logs the PNG as an artifact of the run.

Left: test accuracy against dollars spent, for what the run paid and for what the same
server-seconds would have cost on-demand (the gap is the saving). Right: accuracy against
hours since the run started.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import transientvod.tracking.names as names


def cost_accuracy_figure(points: list[tuple[float, float, float, float]], path: str | Path) -> Path:
    """`points`: (accuracy 0..1, cost $, on-demand cost $, hours) at the steps where accuracy
    was measured, in step order. Writes a PNG and returns its path."""
    import matplotlib

    matplotlib.use("Agg")  # no display on training hosts
    import matplotlib.pyplot as plt

    accuracy = [100 * p[0] for p in points]
    cost = [p[1] for p in points]
    on_demand = [p[2] for p in points]
    hours = [p[3] for p in points]
    fig, (by_cost, by_time) = plt.subplots(1, 2, figsize=(10, 4), constrained_layout=True)
    by_cost.plot(cost, accuracy, "o-", label="this run (transient prices)")
    by_cost.plot(on_demand, accuracy, "s--", label="same server-seconds on-demand")
    by_cost.set_xlabel("cost ($)")
    by_cost.set_ylabel("test accuracy (%)")
    by_cost.legend(loc="lower right")
    by_cost.grid(alpha=0.3)
    by_time.plot(hours, accuracy, "o-")
    by_time.set_xlabel("time since start (h)")
    by_time.set_ylabel("test accuracy (%)")
    by_time.grid(alpha=0.3)
    fig.suptitle(f"cost versus accuracy: \\${cost[-1]:.4f} paid, \\${on_demand[-1]:.4f} on-demand, "
                 f"{accuracy[-1]:.2f}% top-1")
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def log_figure(mlflow_client, run_id: str) -> None:
    """Draw the run's accuracy, cost and on-demand cost at the steps that have all three, and
    log the PNG to the run; a run without such a step gets no figure."""
    def history(key):
        return {m.step: m for m in mlflow_client.get_metric_history(run_id, key)}

    accuracy, cost, on_demand = (history(k) for k in (names.METRIC_ACCURACY, names.METRIC_COST,
                                                      names.METRIC_ON_DEMAND_COST))
    started_ms = mlflow_client.get_run(run_id).info.start_time
    points = [(accuracy[s].value, cost[s].value, on_demand[s].value, (accuracy[s].timestamp - started_ms) / 3.6e6)
              for s in sorted(accuracy) if s in cost and s in on_demand]
    if not points:
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / names.ARTIFACT_FIGURE
        cost_accuracy_figure(points, path)
        mlflow_client.log_artifact(run_id, str(path))
