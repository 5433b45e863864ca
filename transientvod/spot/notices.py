"""Interruption notices as one worker sees them: its own server is about to be taken.

Each training worker starts a `NoticeWatcher` on a daemon thread. The thread asks a
`NoticeSource` (the EC2 instance-metadata service, the GCE metadata server, or the
host-state file the trace replayer writes) every `poll_seconds`, or, for GCE, holds a long
poll that the metadata server answers the moment the VM is preempted. The training loop only
reads `watcher.event.is_set()` and `watcher.notice` once a step, so it never waits on the
network. `start()` first checks that the source can be read at all, so a worker that will
hear nothing says why before it trains.
When a notice arrives the loop commits, writes a durable checkpoint, and the host drops out
of discovery before the cloud takes it: no steps are lost.

    watcher = NoticeWatcher(notice_source("aws")).start()
    ...
    if watcher.event.is_set():
        ...  # commit now; watcher.notice says who said what, and when the server goes

Standard library only (urllib, threading, json): this package never imports torch or
horovod, and a worker should not need `requests` to hear that its server is going.
"""
from __future__ import annotations

import abc
import http.client
import json
import logging
import os
import socket
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from datetime import datetime, timezone

from transientvod.config import NOTICE_SOURCES
from transientvod.spot.hosts import GONE, NOTICED, HostStateError, read_host_state

log = logging.getLogger(__name__)


def _seconds_from_env(name: str, default: str) -> float:
    raw = os.environ.get(name, default)
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number of seconds.") from None


# AWS gives two minutes' warning and GCE thirty seconds, so a few seconds between polls
# leaves most of the warning for the commit and checkpoint.
NOTICE_POLL_SECONDS = _seconds_from_env("TRANSIENTVOD_NOTICE_POLL_SECONDS", "5")
# IMDSv2 tokens live at most six hours; ask for the longest so a worker rarely asks again.
IMDS_TOKEN_TTL_SECONDS = 21600
# Ask for a new token this long before the old one expires, so a poll never carries a
# token that dies in flight.
IMDS_TOKEN_REFRESH_MARGIN_SECONDS = 60.0
# GCE does not say when a preempted server goes; it documents 30 seconds from the notice.
# An instance metadata attribute of this name overrides it (the user knows their VMs' notice).
GCE_PREEMPTION_NOTICE_SECONDS = 30.0
GCE_NOTICE_SECONDS_ATTRIBUTE = "transientvod-notice-seconds"
# maintenance-event changes 60 seconds before host maintenance; a GPU VM cannot live-migrate,
# so TERMINATE_ON_HOST_MAINTENANCE means it stops then.
GCE_MAINTENANCE_NOTICE_SECONDS = 60.0
# The metadata server holds a wait_for_change request until the value changes or this many
# seconds pass: a preemption is heard the moment it is set, not at the next poll.
GCE_LONG_POLL_SECONDS = _seconds_from_env("TRANSIENTVOD_GCE_LONG_POLL_SECONDS", "20")

# Every action an AWS instance-action can carry; anything else is not an instance-action.
AWS_ACTIONS = ("terminate", "stop", "hibernate")


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


def _fetch(method: str, url: str, headers: dict[str, str], timeout: float,
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


def _unix_time(iso: object) -> float | None:
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


HOP_LIMIT_FIX = "aws ec2 modify-instance-metadata-options --instance-id <id> --http-put-response-hop-limit 2"


class Imdsv2NoticeSource(NoticeSource):
    """AWS EC2 spot: the instance-action (terminate/stop two minutes ahead, hibernate at
    once) and the rebalance recommendation (an elevated risk of interruption, no time given),
    read from the instance-metadata service with an IMDSv2 session token, or without one
    (IMDSv1) when the token's reply cannot reach this process and the instance allows it."""

    name = "aws"
    ENDPOINT = "the EC2 instance-metadata service"

    def __init__(self, base_url: str = "http://169.254.169.254", timeout: float = 1.0):
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._token: str | None = None
        self._token_expires_at = 0.0
        self.protocol: str | None = None  # "v2" | "v1", once prepare() found out

    def prepare(self) -> None:
        """IMDSv2 if a token comes back. The metadata service sends the token's reply with the
        instance's hop limit as its IP TTL: with the default of 1, a container behind a bridge
        never receives it and the PUT times out. Then, as AWS's node termination handler
        does, read without a token (IMDSv1) if the instance still allows that."""
        self._token = None
        try:
            self._session_token()
            self.protocol = "v2"
            return
        except NoticeSourceError as e:
            token_failure = e
        status, _ = self._plain_get("/latest/meta-data/instance-id")  # unreachable: that sentence
        if status == 200:
            self.protocol = "v1"
            log.info("%s gave no IMDSv2 token (%s); reading notices with IMDSv1 instead.", self.ENDPOINT,
                     str(token_failure).rstrip("."))
            return
        if isinstance(token_failure, NoAnswerError):
            raise NoticeSourceError(
                f"{self.ENDPOINT} at {self.base_url} sent no IMDSv2 token within {self.timeout:g} s (the hop limit "
                f"drops it inside a container) and refuses IMDSv1 (HTTP {status}), so this worker will hear no "
                f"notice; run `{HOP_LIMIT_FIX}`.")
        raise NoticeSourceError(
            f"{self.ENDPOINT} at {self.base_url} gave no IMDSv2 token and refuses IMDSv1 (HTTP {status}), so this "
            "worker will hear no notice; enable the instance's metadata service with IMDSv2.")

    def check(self) -> Notice | None:
        if self.protocol is None:
            self.prepare()
        # A termination says when the server goes; a rebalance only warns. Ask for the one
        # that says more first.
        status, body = self._get("/latest/meta-data/spot/instance-action")
        if status == 200:
            return self._instance_action(body)
        if status != 404:
            raise self._unexpected(status, "/latest/meta-data/spot/instance-action")
        status, body = self._get("/latest/meta-data/events/recommendations/rebalance")
        if status == 200:
            return Notice(source=self.name, action="rebalance", seen_at=time.time(), terminate_at=None)
        if status != 404:
            raise self._unexpected(status, "/latest/meta-data/events/recommendations/rebalance")
        return None

    def _instance_action(self, body: bytes) -> Notice:
        try:
            answer = json.loads(body)
            action = answer["action"]
        except (ValueError, TypeError, KeyError):
            raise NoticeSourceError(f"{self.ENDPOINT} at {self.base_url} answered the spot instance-action "
                                    f"with {body[:80]!r}, not JSON with an action.") from None
        if action not in AWS_ACTIONS:
            raise NoticeSourceError(f"{self.ENDPOINT} at {self.base_url} answered the spot instance-action "
                                    f"with action {action!r}, not one of {', '.join(AWS_ACTIONS)}.")
        seen_at = time.time()
        terminate_at = _unix_time(answer.get("time"))
        if terminate_at is None:
            log.warning("%s gave the %s notice the time %r, which is not an ISO 8601 time; the server may go "
                        "at any moment.", self.ENDPOINT, action, str(answer.get("time"))[:40])
        if action == "hibernate":
            # Hibernation starts with the notice: there are no two minutes to spend.
            terminate_at = seen_at if terminate_at is None else min(terminate_at, seen_at)
        return Notice(source=self.name, action=action, seen_at=seen_at, terminate_at=terminate_at)

    def _get(self, path: str) -> tuple[int, bytes]:
        """GET as prepare() decided. With a token, a 401 means it expired or the service
        restarted: ask for a new one and try once more. Without one, a 401 means the instance
        now requires IMDSv2: find out again how to read it."""
        if self.protocol == "v1":
            status, body = self._plain_get(path)
            if status != 401:
                return status, body
            self.prepare()
            if self.protocol == "v1":
                return self._plain_get(path)
        status, body, _ = _fetch("GET", self.base_url + path, {"X-aws-ec2-metadata-token": self._session_token()},
                                 self.timeout, self.ENDPOINT)
        if status == 401:
            self._token = None
            status, body, _ = _fetch("GET", self.base_url + path,
                                     {"X-aws-ec2-metadata-token": self._session_token()}, self.timeout, self.ENDPOINT)
            if status == 401:
                raise NoticeSourceError(f"{self.ENDPOINT} at {self.base_url} refused a token it had just issued; "
                                        "check that nothing else answers on that address.")
        return status, body

    def _plain_get(self, path: str) -> tuple[int, bytes]:
        status, body, _ = _fetch("GET", self.base_url + path, {}, self.timeout, self.ENDPOINT)
        return status, body

    def _session_token(self) -> str:
        if self._token is not None and time.monotonic() < self._token_expires_at - IMDS_TOKEN_REFRESH_MARGIN_SECONDS:
            return self._token
        url = self.base_url + "/latest/api/token"
        status, body, _ = _fetch("PUT", url, {"X-aws-ec2-metadata-token-ttl-seconds": str(IMDS_TOKEN_TTL_SECONDS)},
                                 self.timeout, self.ENDPOINT)
        if status != 200 or not body.strip():
            raise NoticeSourceError(f"{self.ENDPOINT} at {url} gave no session token (HTTP {status}); "
                                    f"enable IMDSv2 on the instance, with `{HOP_LIMIT_FIX}` inside containers.")
        self._token = body.decode("ascii", "replace").strip()
        self._token_expires_at = time.monotonic() + IMDS_TOKEN_TTL_SECONDS
        return self._token

    def _unexpected(self, status: int, path: str) -> NoticeSourceError:
        return NoticeSourceError(f"{self.ENDPOINT} at {self.base_url}{path} answered HTTP {status}, "
                                 "neither a notice (200) nor none (404).")


class GceNoticeSource(NoticeSource):
    """GCE preemptible and spot VMs: `instance/preempted` turns TRUE when the VM is being
    preempted (30 seconds before it stops, or the instance attribute
    `transientvod-notice-seconds`), and `instance/maintenance-event` turns
    TERMINATE_ON_HOST_MAINTENANCE 60 seconds before host maintenance stops a VM that cannot
    live-migrate (every VM with a GPU).

    `preempted` is read with the metadata server's long poll (wait_for_change with the last
    ETag), so a preemption is heard as it is set; maintenance-event, with its longer warning,
    is read after each long poll returns. Only answers that carry the `Metadata-Flavor: Google`
    header count: anything else on that address (a proxy's HTML page) is not a notice.
    """

    name = "gce"
    ENDPOINT = "the GCE metadata server"
    waits = True

    def __init__(self, base_url: str = "http://metadata.google.internal", timeout: float = 1.0,
                 long_poll_seconds: float | None = None):
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.long_poll_seconds = GCE_LONG_POLL_SECONDS if long_poll_seconds is None else long_poll_seconds
        if not self.long_poll_seconds >= 1:
            raise ValueError(f"long_poll_seconds is {self.long_poll_seconds}; the metadata server "
                             "counts whole seconds, so it must be at least 1.")
        self.notice_seconds: float | None = None  # known once prepare() read it
        self._preempted_etag: str | None = None
        self._preempted_read = False  # the first read answers at once; the ones after wait

    def prepare(self) -> None:
        """Checks that this is the GCE metadata server, and reads the notice length."""
        status, body, _ = self._get(f"instance/attributes/{GCE_NOTICE_SECONDS_ATTRIBUTE}")
        if status == 404:
            self.notice_seconds = GCE_PREEMPTION_NOTICE_SECONDS
            return
        if status != 200:
            raise self._unexpected(status, f"instance/attributes/{GCE_NOTICE_SECONDS_ATTRIBUTE}")
        text = body.decode("ascii", "replace").strip()
        try:
            seconds = float(text)
        except ValueError:
            seconds = float("nan")
        if not 0 < seconds < 3600:
            raise NoticeSourceError(f"the instance attribute {GCE_NOTICE_SECONDS_ATTRIBUTE} is {text[:40]!r}; "
                                    "set it to the notice length in seconds (GCE gives 30), or remove it.")
        self.notice_seconds = seconds

    def check(self) -> Notice | None:
        if self.notice_seconds is None:
            self.prepare()
        if not self._preempted_read:
            path = "instance/preempted"  # the value now, and the ETag to wait on from then
            timeout = self.timeout
        else:
            # With the last ETag the server answers at once if the value changed since: no
            # change between two polls is missed.
            path = f"instance/preempted?wait_for_change=true&timeout_sec={self.long_poll_seconds:.0f}"
            if self._preempted_etag:
                path += f"&last_etag={self._preempted_etag}"
            timeout = self.long_poll_seconds + self.timeout
        asked_at = time.monotonic()
        status, body, headers = self._get(path, timeout)
        if status != 200:
            raise self._unexpected(status, "instance/preempted")
        etag = headers.get("ETag") or None
        if self._preempted_read and etag == self._preempted_etag and time.monotonic() - asked_at < 0.5 \
                and self.waits:
            # Answered at once with nothing changed: this server does not hold requests, and
            # asking again at once would spin. The watcher goes back to polling.
            self.waits = False
            log.info("%s at %s does not hold wait_for_change requests; polling it instead.",
                     self.ENDPOINT, self.base_url)
        self._preempted_read = True
        self._preempted_etag = etag
        answer = self._flag(body, "instance/preempted", ("TRUE", "FALSE"))
        if answer == "TRUE":
            seen_at = time.time()
            return Notice(source=self.name, action="preempted", seen_at=seen_at,
                          terminate_at=seen_at + self.notice_seconds)
        status, body, _ = self._get("instance/maintenance-event")
        if status == 404:
            return None  # older metadata servers have no maintenance-event
        if status != 200:
            raise self._unexpected(status, "instance/maintenance-event")
        # NONE, MIGRATE_ON_HOST_MAINTENANCE or TERMINATE_ON_HOST_MAINTENANCE; newer servers may
        # say more around the value, so look for the one that matters.
        if b"TERMINATE_ON_HOST_MAINTENANCE" in body.upper():
            seen_at = time.time()
            return Notice(source=self.name, action="maintenance", seen_at=seen_at,
                          terminate_at=seen_at + GCE_MAINTENANCE_NOTICE_SECONDS)
        return None  # a live migration pauses the VM for a moment; the job stays

    def _get(self, path: str, timeout: float | None = None) -> tuple[int, bytes, http.client.HTTPMessage]:
        url = f"{self.base_url}/computeMetadata/v1/{path}"
        status, body, headers = _fetch("GET", url, {"Metadata-Flavor": "Google"}, timeout or self.timeout,
                                       self.ENDPOINT)
        if headers is None or headers.get("Metadata-Flavor") != "Google":
            raise NoticeSourceError(f"{self.base_url} answered HTTP {status} without the header "
                                    "Metadata-Flavor: Google, so it is not the GCE metadata server; "
                                    "run on a GCE VM or choose another notice source.")
        return status, body, headers

    def _flag(self, body: bytes, path: str, values: tuple[str, ...]) -> str:
        answer = body.decode("ascii", "replace").strip().upper()
        if answer not in values:
            raise NoticeSourceError(f"{self.ENDPOINT} at {self.base_url} answered {path} with {body[:80]!r}, "
                                    f"not one of {', '.join(values)}.")
        return answer

    def _unexpected(self, status: int, path: str) -> NoticeSourceError:
        if status >= 500:
            return NoticeSourceError(f"{self.ENDPOINT} at {self.base_url}/computeMetadata/v1/{path} answered "
                                     f"HTTP {status}, a failure on its side; the watcher keeps asking.")
        return NoticeSourceError(f"{self.ENDPOINT} at {self.base_url}/computeMetadata/v1/{path} answered "
                                 f"HTTP {status}; run on a GCE VM or choose another notice source.")


class HostStateNoticeSource(NoticeSource):
    """The host-state file the watcher writes (from a replayed trace or a cloud API): this
    worker's host marked noticed or gone counts as a notice. This is how rehearsals on one
    machine give workers the same warning a cloud would."""

    name = "hoststate"

    def __init__(self, state_file: str | os.PathLike, host_name: str | None = None):
        self.state_file = state_file
        # horovodrun sets HOROVOD_HOSTNAME to the name it used for this host, which is the
        # name the host-state file (and discovery) knows it by.
        self.host_name = host_name or os.environ.get("HOROVOD_HOSTNAME") or socket.gethostname()

    def check(self) -> Notice | None:
        try:
            state = read_host_state(self.state_file)
        except HostStateError as e:
            raise NoticeSourceError(str(e)) from None
        for host in state.hosts:
            if host.name == self.host_name:
                if host.state in (NOTICED, GONE):
                    return Notice(source=self.name, action="revoked", seen_at=time.time(),
                                  terminate_at=host.terminate_at)
                return None
        return None


class NoticeWatcher:
    """Polls one NoticeSource on a daemon thread until the first notice, then stops.

    `event` is set once a notice is seen and stays set; `notice` is that first notice.
    Neither ever waits on the network, so the training loop may read them every step.
    """

    def __init__(self, source: NoticeSource, poll_seconds: float = NOTICE_POLL_SECONDS):
        if not poll_seconds > 0:
            raise ValueError(f"poll_seconds is {poll_seconds}; it must be a positive number of seconds.")
        self.source = source
        self.poll_seconds = float(poll_seconds)
        self.event = threading.Event()
        self._notice: Notice | None = None
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing = False  # so an endpoint that is down logs one warning, not one per poll

    @property
    def notice(self) -> Notice | None:
        return self._notice

    def start(self) -> NoticeWatcher:
        if self._thread is not None and self._thread.is_alive():
            return self
        self._stopping.clear()
        # Here, not at the first poll: a worker that can never hear its notice says so (and
        # what to change) before it trains. It keeps trying on the thread all the same.
        self._prepare()
        # A daemon thread: a worker that exits must not wait for a poll to finish.
        self._thread = threading.Thread(target=self._run, name=f"notice-watcher-{self.source.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            # A poll in flight ends within its own timeout; don't hold the caller longer than
            # one poll interval for it, nor more than a second for a long poll (which the
            # server may hold for GCE_LONG_POLL_SECONDS): the thread is a daemon.
            thread.join(timeout=1.0 if self.source.waits else self.poll_seconds + 1.0)

    def _prepare(self) -> None:
        try:
            self.source.prepare()
        except NoticeSourceError as e:
            self._failed(str(e))
        except Exception as e:  # a source's bug: the thread still polls
            self._failed(f"{type(e).__name__}: {e}")

    def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                if self._poll_once():
                    return
                if self.source.waits and not self._failing:
                    continue  # the check itself waited for a change: ask again at once
                self._stopping.wait(self.poll_seconds)
        except Exception:
            # Nothing above should raise; if it does, say so instead of dying silently, since
            # a worker whose watcher died would never hear its notice.
            log.exception("the interruption-notice watcher (%s) stopped on an unexpected error; "
                          "this worker will get no warning before its server goes", self.source.name)

    def _poll_once(self) -> bool:
        """One check; True once a notice has been seen (stop polling)."""
        try:
            notice = self.source.check()
        except NoticeSourceError as e:
            self._failed(str(e))
            return False
        except Exception as e:  # a source's bug or an error it did not wrap: keep listening
            self._failed(f"{type(e).__name__}: {e}")
            return False
        if self._failing:
            self._failing = False
            log.info("interruption notices from %s can be read again", self.source.name)
        if notice is None:
            return False
        self._notice = notice
        self.event.set()
        log.warning("interruption notice from %s: %s, server goes at %s", notice.source, notice.action,
                    _describe_time(notice.terminate_at, notice.seen_at))
        return True

    def _failed(self, reason: str) -> None:
        if not self._failing:
            self._failing = True
            log.warning("cannot read interruption notices from %s (will keep trying): %s", self.source.name, reason)


def _describe_time(terminate_at: float | None, seen_at: float) -> str:
    if terminate_at is None:
        return "unknown"
    moment = datetime.fromtimestamp(terminate_at, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    if terminate_at < seen_at - 1:
        # An old notice still served, or a clock that is off: the time is no guide, so say so.
        return f"{moment} (already {seen_at - terminate_at:.0f} s past)"
    return f"{moment} (in {terminate_at - seen_at:.0f} s)"


def notice_source(kind: str, **options) -> NoticeSource | None:
    """The notice source a config names: "none", "aws", "gce" or "hoststate".

    Options: `url` (aws, gce: the metadata endpoint, for tests and proxies), `timeout`
    (aws, gce), `long_poll_seconds` (gce), `state_file` and `host_name` (hoststate).
    """
    if kind == "none":
        return None
    if kind == "aws":
        return Imdsv2NoticeSource(base_url=options.get("url") or "http://169.254.169.254",
                                  timeout=options.get("timeout", 1.0))
    if kind == "gce":
        return GceNoticeSource(base_url=options.get("url") or "http://metadata.google.internal",
                               timeout=options.get("timeout", 1.0), long_poll_seconds=options.get("long_poll_seconds"))
    if kind == "hoststate":
        if not options.get("state_file"):
            raise ValueError("notice source hoststate needs state_file, the host-state file the watcher writes.")
        return HostStateNoticeSource(options["state_file"], options.get("host_name"))
    raise ValueError(f"notice source {kind!r} is not one of {', '.join(NOTICE_SOURCES)}.")
