"""The plan's picture: every configuration's mean cost against its mean time, coloured by its
risk (the chance of failing, or of going over the budget or past the deadline).

    cost_time_figure(candidates, "runs/plan.png", budget=2.0)

Each point is one configuration `plan` simulated (spot circles, on-demand squares); the colour
runs from 0 % risk (dark) to 100 % (yellow) on a fixed scale, so pictures of two plans compare;
the configurations within the accepted risk are ringed and the best few named. The budget or
deadline is a dashed line. Never imports torch or horovod.
"""
from __future__ import annotations

from pathlib import Path

from transientvod.planner.study_data import PlanError

COLOURMAP = "viridis"  # 0 % risk: dark violet, 100 %: yellow
LABELLED = 3  # the best configurations named on the picture


def cost_time_figure(candidates: list[dict], path, fits: list[dict] = (), budget: float | None = None,
                     deadline_h: float | None = None) -> Path:
    """`candidates`: stats() rows with `risk_pct`; `fits`: those within the accepted risk, best
    first. Writes a PNG and returns its path."""
    import matplotlib

    matplotlib.use("Agg")  # no display where plans are made
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5.5), constrained_layout=True)
    for market, marker in (("spot", "o"), ("on-demand", "s")):
        rows = [r for r in candidates if f" {market} (" in r["configuration"]]
        if not rows:
            continue
        points = ax.scatter([r["time_h_mean"] for r in rows], [r["cost_usd_mean"] for r in rows],
                            c=[r["risk_pct"] for r in rows], cmap=COLOURMAP, vmin=0, vmax=100, marker=marker, s=70,
                            edgecolors="none", label=market)
    fig.colorbar(points, ax=ax, label="risk: failing or over the limit (%)")
    if fits:
        ax.scatter([r["time_h_mean"] for r in fits], [r["cost_usd_mean"] for r in fits], s=170, facecolors="none",
                   edgecolors="black", linewidths=1.2, label="within the accepted risk")
        for rank, row in enumerate(fits[:LABELLED], 1):
            ax.annotate(f"{rank}. {row['configuration'].split(' (')[0]}", (row["time_h_mean"], row["cost_usd_mean"]),
                        textcoords="offset points", xytext=(8, 6), fontsize=8)
    if budget is not None:
        ax.axhline(budget, linestyle="--", color="grey", label=f"budget ${budget:g}")
    if deadline_h is not None:
        ax.axvline(deadline_h, linestyle="--", color="grey", label=f"deadline {deadline_h:g} h")
    ax.set_xlabel("mean time (h), provisioning included")
    ax.set_ylabel("mean cost ($), the cloud's bill")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper right", fontsize=8)
    ax.set_title("plan: cost against time, coloured by risk")
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=100, metadata={"Software": None})  # no version: same plan, same bytes
    except OSError as e:
        raise PlanError(f"cannot write the picture {path} ({e.strerror}); choose another --figure path.") from None
    finally:
        plt.close(fig)
    return path
