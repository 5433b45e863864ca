"""The one interface every source of spot lifecycles implements (trace replay, AWS, ...)."""
from __future__ import annotations

import abc

from transientvod.spot.hosts import HostStatus


class ProviderError(RuntimeError):
    """The provider cannot answer (no credentials, unreachable endpoint, broken trace); one
    sentence naming what to fix."""


class SpotProvider(abc.ABC):
    """Answers "which hosts does this job have, and in what state?" at a moment."""

    name: str = "provider"

    @abc.abstractmethod
    def poll(self, now: float) -> list[HostStatus]:
        """Every host of the job as of unix time `now`: usable, noticed (an interruption
        notice arrived; remove it from the job now) or gone. Called by the watcher every few
        seconds, never by the discovery script."""
