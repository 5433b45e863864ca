"""transientvod: elastic deep-learning training on transient (spot / preemptible) servers."""

from transientvod.version import __version__  # noqa: F401  (pyproject.toml reads it there)

# Library mode's public API (docs/library-mode.md), loaded on first use: `import transientvod`
# (the CLI, the watcher, discovery) must not import torch and Horovod.
_LIBRARY = {
    "DistributedOptimizer": "transientvod.library.optimizer",
    "ElasticState": "transientvod.library.state",
    "JOB_CONFIG_ENV": "transientvod.library.job",
    "job_config": "transientvod.library.job",
}
__all__ = ["__version__", *_LIBRARY]


def __getattr__(name: str):
    if name in _LIBRARY:
        import importlib

        return getattr(importlib.import_module(_LIBRARY[name]), name)
    raise AttributeError(f"module 'transientvod' has no attribute {name!r}")
