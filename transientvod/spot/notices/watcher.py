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

The sources: notices/aws.py (EC2), notices/gce.py (GCE), and the host-state file below; what
they share is in notices/source.py. Standard library only (urllib, threading, json): this
package never imports torch or horovod, and a worker should not need `requests` to hear
that its server is going.
"""
from __future__ import annotations

import logging
import os
import socket
import threading
import time
from datetime import datetime, timezone

from transientvod.config import NOTICE_SOURCES
from transientvod.spot.hosts import GONE, NOTICED, HostStateError, read_host_state
from transientvod.spot.notices.aws import Imdsv2NoticeSource
from transientvod.spot.notices.gce import COMPUTE_ENDPOINT, GceNoticeSource
from transientvod.spot.notices.source import Notice, NoticeSource, NoticeSourceError, seconds_from_env

log = logging.getLogger(__name__)

# AWS gives two minutes' warning and GCE thirty seconds, so a few seconds between polls
# leaves most of the warning for the commit and checkpoint.
NOTICE_POLL_SECONDS = seconds_from_env("TRANSIENTVOD_NOTICE_POLL_SECONDS", "5")
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
    (aws, gce), `long_poll_seconds` and `compute_url` (gce: the Compute API that has the
    instance's notice length), `state_file` and `host_name` (hoststate).
    """
    if kind == "none":
        return None
    if kind == "aws":
        return Imdsv2NoticeSource(base_url=options.get("url") or "http://169.254.169.254",
                                  timeout=options.get("timeout", 1.0))
    if kind == "gce":
        return GceNoticeSource(base_url=options.get("url") or "http://metadata.google.internal",
                               timeout=options.get("timeout", 1.0), long_poll_seconds=options.get("long_poll_seconds"),
                               compute_url=options.get("compute_url") or COMPUTE_ENDPOINT)
    if kind == "hoststate":
        if not options.get("state_file"):
            raise ValueError("notice source hoststate needs state_file, the host-state file the watcher writes.")
        return HostStateNoticeSource(options["state_file"], options.get("host_name"))
    raise ValueError(f"notice source {kind!r} is not one of {', '.join(NOTICE_SOURCES)}.")
