"""transientvod: elastic deep-learning training on transient (spot / preemptible) servers."""

__version__ = "0.1.0"
