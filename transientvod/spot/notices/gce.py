"""GCE preemption and host-maintenance notices from the metadata server, heard with its long
poll; the notice length from the instance's own resource in the Compute API."""
from __future__ import annotations

import http.client
import json
import logging
import time
import urllib.error
import urllib.parse
import urllib.request

from transientvod.spot.notices.source import Notice, NoticeSource, NoticeSourceError, fetch, seconds_from_env

log = logging.getLogger(__name__)

# GCE does not say when a preempted server goes; it documents 30 seconds from the notice, unless
# the instance asked for more with scheduling.preemptionNoticeDuration (GCE allows up to 120 s).
GCE_PREEMPTION_NOTICE_SECONDS = 30.0
NOTICE_DURATION_FIELD = "scheduling.preemptionNoticeDuration"
COMPUTE_ENDPOINT = "https://compute.googleapis.com"
# maintenance-event changes 60 seconds before host maintenance; a GPU VM cannot live-migrate,
# so TERMINATE_ON_HOST_MAINTENANCE means it stops then.
GCE_MAINTENANCE_NOTICE_SECONDS = 60.0
# The metadata server holds a wait_for_change request until the value changes or this many
# seconds pass: a preemption is heard the moment it is set, not at the next poll.
GCE_LONG_POLL_SECONDS = seconds_from_env("TRANSIENTVOD_GCE_LONG_POLL_SECONDS", "20")



def preemption_notice_seconds(instance: dict) -> float | None:
    """`scheduling.preemptionNoticeDuration` of a Compute API instance resource in seconds; None
    when the instance does not set it (GCE's 30 s then) or sets something that is not a
    positive Duration. A Duration in JSON is {"seconds": "120", "nanos": 0}: int64 seconds are
    a string there, though some writers send a number."""
    duration = (instance.get("scheduling") or {}).get("preemptionNoticeDuration")
    if not isinstance(duration, dict):
        return None
    try:
        seconds = float(duration.get("seconds", 0) or 0) + float(duration.get("nanos", 0) or 0) / 1e9
    except (TypeError, ValueError):
        return None
    return seconds if 0 < seconds < float("inf") else None


class GceNoticeSource(NoticeSource):
    """GCE preemptible and spot VMs: `instance/preempted` turns TRUE when the VM is being
    preempted (30 seconds before it stops, or the instance's
    `scheduling.preemptionNoticeDuration`), and `instance/maintenance-event` turns
    TERMINATE_ON_HOST_MAINTENANCE 60 seconds before host maintenance stops a VM that cannot
    live-migrate (every VM with a GPU).

    `preempted` is read with the metadata server's long poll (wait_for_change with the last
    ETag), so a preemption is heard as it is set; maintenance-event, with its longer warning,
    is read after each long poll returns. Only answers that carry the `Metadata-Flavor: Google`
    header count: anything else on that address (a proxy's HTML page) is not a notice.

    The notice length is not on the metadata server (its `instance/scheduling/` directory has
    preemptible, on-host-maintenance and automatic-restart, no notice duration), so prepare()
    reads the instance's own resource from the Compute API (instances.get) with the token of the
    VM's service account, which the metadata server hands out. A VM whose service account cannot
    read it (no compute scope) keeps GCE's 30 s and says so once: the length only dates the
    notice in the worker's log, while the bill takes it from the watcher's instance list (gce.py).
    """

    name = "gce"
    ENDPOINT = "the GCE metadata server"
    waits = True

    def __init__(self, base_url: str = "http://metadata.google.internal", timeout: float = 1.0,
                 long_poll_seconds: float | None = None, compute_url: str = COMPUTE_ENDPOINT):
        self.base_url = base_url.rstrip("/")
        self.compute_url = compute_url.rstrip("/")
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
        where = {}
        for key, path in (("project", "project/project-id"), ("zone", "instance/zone"), ("name", "instance/name")):
            status, body, _ = self._get(path)
            if status != 200:
                raise self._unexpected(status, path)
            # instance/zone is "projects/<number>/zones/<zone>"
            where[key] = body.decode("ascii", "replace").strip().rsplit("/", 1)[-1]
        seconds, why_not = self._notice_seconds_from_compute(**where)
        if why_not:
            log.warning("The preemption notice length is taken as GCE's default %.0f s: %s",
                        GCE_PREEMPTION_NOTICE_SECONDS, why_not)
        self.notice_seconds = seconds or GCE_PREEMPTION_NOTICE_SECONDS

    def _notice_seconds_from_compute(self, project: str, zone: str, name: str) -> tuple[float | None, str]:
        """(the instance's preemptionNoticeDuration or None when unset, why it could not be read)."""
        path = "instance/service-accounts/default/token"
        status, body, _ = self._get(path)
        if status == 404:
            return None, ("this VM has no service account to read its own instance from the Compute API; "
                          f"give it one with the compute.readonly scope to read {NOTICE_DURATION_FIELD}.")
        if status != 200:
            raise self._unexpected(status, path)
        try:
            token = json.loads(body)["access_token"]
        except (ValueError, KeyError, TypeError):
            raise NoticeSourceError(f"{self.ENDPOINT} at {self.base_url} answered {path} with something that is "
                                    "not an access token; run on a GCE VM or choose another notice source.") from None
        url = (f"{self.compute_url}/compute/v1/projects/{urllib.parse.quote(project)}/zones/"
               f"{urllib.parse.quote(zone)}/instances/{urllib.parse.quote(name)}")
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
        try:
            with urllib.request.urlopen(request, timeout=max(self.timeout, 5.0)) as response:
                instance = json.loads(response.read())
        except urllib.error.HTTPError as e:
            e.close()
            return None, (f"the Compute API answered instances.get for {name} with HTTP {e.code}; give the VM's "
                          "service account the compute.readonly scope and the permission compute.instances.get.")
        except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError) as e:
            reason = getattr(e, "reason", None) or e
            return None, f"the Compute API at {self.compute_url} could not be read ({reason})."
        if not isinstance(instance, dict):
            return None, f"the Compute API at {self.compute_url} answered instances.get with no instance."
        return preemption_notice_seconds(instance), ""

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


