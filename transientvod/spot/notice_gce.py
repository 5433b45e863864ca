"""GCE preemption and host-maintenance notices from the metadata server, heard with its long
poll."""
from __future__ import annotations

import http.client
import logging
import time

from transientvod.spot.notice_source import Notice, NoticeSource, NoticeSourceError, fetch, seconds_from_env

log = logging.getLogger(__name__)

# GCE does not say when a preempted server goes; it documents 30 seconds from the notice.
# An instance metadata attribute of this name overrides it (the user knows their VMs' notice).
GCE_PREEMPTION_NOTICE_SECONDS = 30.0
GCE_NOTICE_SECONDS_ATTRIBUTE = "transientvod-notice-seconds"
# maintenance-event changes 60 seconds before host maintenance; a GPU VM cannot live-migrate,
# so TERMINATE_ON_HOST_MAINTENANCE means it stops then.
GCE_MAINTENANCE_NOTICE_SECONDS = 60.0
# The metadata server holds a wait_for_change request until the value changes or this many
# seconds pass: a preemption is heard the moment it is set, not at the next poll.
GCE_LONG_POLL_SECONDS = seconds_from_env("TRANSIENTVOD_GCE_LONG_POLL_SECONDS", "20")

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
        status, body, headers = fetch("GET", url, {"Metadata-Flavor": "Google"}, timeout or self.timeout,
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


