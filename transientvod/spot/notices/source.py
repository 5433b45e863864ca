"""What every notice source shares: the Notice a worker hears, the source's interface and its
one-sentence error, and the plain HTTP request the metadata services are read with.

The sources themselves: notices/aws.py (EC2 instance metadata), notices/gce.py (the GCE
metadata server), and notices/watcher.py (the host-state file, the watcher and the factory).
Standard library only: a worker should not need `requests` to hear that its server is going.
"""
from __future__ import annotations

import abc
import http.client
import os
import socket
import urllib.error
import urllib.request
from dataclasses import dataclass
from datetime import datetime, timezone


def seconds_from_env(name: str, default: str) -> float:
    raw = os.environ.get(name, default)
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number of seconds.") from None


@dataclass(frozen=True)
class Notice:
    source: str  # "aws" | "gce" | "hoststate"
    action: str  # "terminate" | "stop" | "hibernate" | "rebalance" | "preempted" | "maintenance" | "revoked"
    seen_at: float  # unix time this worker saw it
    terminate_at: float | None  # unix time the cloud will take the server, if it said


class NoticeSourceError(RuntimeError):
    """The notice endpoint cannot be reached or its answer not understood; one sentence
    naming what to fix. The watcher logs it once and keeps polling: an endpoint that is down
    for a moment must not stop a worker from hearing a notice later."""


class NoticeSource(abc.ABC):
    """One place a worker can hear that its own server is about to go."""

    name: str = "source"
    # True when check() itself waits for a change (a long poll): the watcher then asks again
    # at once instead of sleeping between polls.
    waits: bool = False

    def prepare(self) -> None:
        """Find out at start-up how this endpoint is to be read, so that a worker that can
        never hear a notice says so before it trains, not at its first poll. Raises
        NoticeSourceError naming what to fix; check() prepares again while it has not worked."""

    @abc.abstractmethod
    def check(self) -> Notice | None:
        """Poll once: a Notice if the server is about to go, None if nothing is scheduled.
        Raises NoticeSourceError when the endpoint cannot be reached or understood."""


# Metadata endpoints are link-local or resolved by the cloud's own DNS: a proxy from the
# environment (http_proxy) can only break them, so every request goes direct.
_direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class NoAnswerError(NoticeSourceError):
    """The endpoint took the request and never answered: on EC2 inside a container, the sign
    of an IMDSv2 token reply dropped by the hop limit."""


def fetch(method: str, url: str, headers: dict[str, str], timeout: float,
           endpoint: str) -> tuple[int, bytes, http.client.HTTPMessage]:
    """One request; every HTTP answer comes back as (status, body, headers), since 404 and 401
    are answers here, not failures. No answer at all becomes a NoticeSourceError."""
    request = urllib.request.Request(url, method=method, headers=headers)
    try:
        with _direct.open(request, timeout=timeout) as response:
            return response.status, response.read(), response.headers
    except urllib.error.HTTPError as e:
        try:
            return e.code, e.read(), e.headers
        except (OSError, http.client.HTTPException):
            return e.code, b"", e.headers  # the status is the answer; a body cut short changes nothing
        finally:
            e.close()
    except urllib.error.URLError as e:
        if isinstance(e.reason, (TimeoutError, socket.timeout)):
            raise NoAnswerError(f"{endpoint} at {url} did not answer within {timeout:g} s.") from None
        reason = e.reason.strerror if isinstance(e.reason, OSError) and e.reason.strerror else e.reason
        raise NoticeSourceError(f"{endpoint} at {url} cannot be reached ({reason}).") from None
    except (TimeoutError, socket.timeout):
        raise NoAnswerError(f"{endpoint} at {url} did not answer within {timeout:g} s.") from None
    except (OSError, http.client.HTTPException) as e:
        raise NoticeSourceError(f"{endpoint} at {url} broke off its answer ({e or type(e).__name__}).") from None


def unix_time(iso: object) -> float | None:
    """'2017-09-18T08:22:00Z' -> unix time; None when missing or unreadable, since a notice
    without a time is still a notice."""
    if not isinstance(iso, str):
        return None
    try:
        # Python 3.10's fromisoformat does not read the trailing 'Z'.
        moment = datetime.fromisoformat(iso.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)  # AWS times are UTC
    return moment.timestamp()


