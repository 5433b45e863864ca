"""What every picture on the docs site shares: a headless backend, a fixed size in pixels and
a PNG that is the same bytes each time it is drawn from the same data (no date or version in
its metadata), so a regenerated picture only shows up in `git diff` when its data changed.

The scripts beside it (revocation_timeline.py, exchange_chart.py) import it by its path: docs/
is not a package.
"""
from __future__ import annotations

from pathlib import Path

DPI = 100  # as planner/figure.py: inches x 100 = pixels


def new_figure(width_px: int, height_px: int, **subplots):
    """(figure, axes) of exactly `width_px` x `height_px` pixels once saved."""
    import matplotlib

    matplotlib.use("Agg")  # no display where the docs are built
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(width_px / DPI, height_px / DPI), constrained_layout=True, **subplots)


def save(fig, path) -> Path:
    """Write the figure as a PNG without a Software entry (matplotlib's version) and close it."""
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fig.savefig(path, dpi=DPI, format="png", metadata={"Software": None})
    finally:
        plt.close(fig)
    return path
