"""The cost-versus-accuracy figure of one run (logged to MLflow as an artifact).

Left: test accuracy against dollars spent, for what the run paid and for what the same
server-seconds would have cost on-demand (the gap is the saving). Right: accuracy against
hours since the run started.
"""
from __future__ import annotations

from pathlib import Path


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
