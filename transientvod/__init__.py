"""transientvod: elastic deep-learning training on transient (spot / preemptible) servers."""

from transientvod.version import __version__  # noqa: F401  (pyproject.toml reads it there)
