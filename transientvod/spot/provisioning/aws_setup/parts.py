"""What every part of `aws setup` shares: the Part record, the words each lookup reports, the
error codes that mean "not there", and the lookup that turns those into None."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import botocore.exceptions

from transientvod.aws_clients import client_error_codes
from transientvod.spot.providers.aws import MISSING_QUEUE_CODES

# What each service answers when the thing asked about is not there.
NOT_FOUND_CODES = MISSING_QUEUE_CODES | {"ResourceNotFoundException", "NoSuchEntity"}
# Interruption notices are worth reading for minutes, not days (the warning gives 2): a queue
# that no watcher drained keeps them this long (AWS's termination handler uses 300 s too).
MESSAGE_RETENTION_SECONDS = 300
CREATED, EXISTS, UPDATED, REMOVED, ABSENT = "created", "already exists", "updated", "removed", "was not there"


@dataclass(frozen=True)
class Part:
    """One thing setup makes. `state` looks it up: None (absent), EXISTS (as setup makes it)
    or UPDATED (there, but with another document); `create` makes or rewrites it; `delete`
    removes it and says whether it was there."""
    what: str
    state: Callable[[], str | None]
    create: Callable[[], None]
    delete: Callable[[], bool]


def or_none(call: Callable[[], dict]) -> dict | None:
    """The answer of a lookup, or None when AWS says the thing is not there."""
    try:
        return call()
    except botocore.exceptions.ClientError as e:
        if client_error_codes(e) & NOT_FOUND_CODES:
            return None
        raise
