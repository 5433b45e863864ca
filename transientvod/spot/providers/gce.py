"""The hosts of a job on Compute Engine spot (or preemptible) VMs, read from the REST API.

A job's hosts are the instances that carry the label ``transientvod-job=<job>`` (or the
``key=value`` that ``spot.job_label`` names). Each poll lists them in one zone
(``instances.list``, when ``spot.zone`` is set) or in every zone of the project
(``aggregatedList``), following ``nextPageToken``, and says, per instance:

- ``usable``: status RUNNING;
- ``noticed``: status STOPPING, SUSPENDING or PENDING_STOP (the guest is being shut down
  or suspended);
- ``gone``: TERMINATED, STOPPED, SUSPENDED, REPAIRING, DEPROVISIONING (or a status this
  module does not know), or an instance it listed before that is no longer listed (a spot VM
  whose termination action is DELETE, or one deleted by hand).

PROVISIONING, STAGING and PENDING instances are left out, as the AWS provider leaves out
pending ones: they are not part of the job until they run.

Why a preemption is ``noticed`` on STOPPING: the instance resource has no "preempted" field.
Compute Engine preempts a spot VM by sending its guest an ACPI soft-off, waiting up to 30
seconds, then stopping it (status TERMINATED) or deleting it, as
``scheduling.instanceTerminationAction`` says. The instance lifecycle page
(https://cloud.google.com/compute/docs/instances/instance-lifecycle) defines STOPPING as
Compute Engine shutting the guest down before a stop or a delete, whoever asked for it, and
PENDING_STOP as a graceful shutdown before one: either way the host is leaving, and its guest
still runs for a few seconds in which the job can commit. The notice is dated
when the watcher first saw it and its end the instance's ``scheduling.preemptionNoticeDuration``
later (a Duration the instance may ask for, up to 120 s; it is in the listed resource, so no
further call), or 30 seconds when unset (GCE's documented preemption notice; a requested stop
may allow more). The one API record that says "preemption" is a
``compute.instances.preempted`` zone operation, a third call this provider does not make:
each worker hears its own preemption sooner from the metadata server (notices/gce.py).

Why the REST API through google-auth, not the google-cloud-compute client: listing instances
is two GET calls. google-auth is one small library, already installed with mlflow, that finds
Application Default Credentials and refreshes their token; google-cloud-compute is a large
generated client for the whole API (proto-plus types over protobuf and google-api-core), a
new dependency for those two calls. Plain JSON over HTTP also lets the tests answer from a
loopback server with the documented response shapes.

Credentials are Application Default Credentials (``gcloud auth application-default login``,
GOOGLE_APPLICATION_CREDENTIALS, or the VM's service account); they need the permission
``compute.instances.list`` (roles/compute.viewer has it). The project is ``spot.project``,
else the credentials'. Each call has short timeouts and no retry: the watcher polls every few
seconds, and a failed poll keeps the last host state until the next one answers.
"""
from __future__ import annotations

import logging
import os

import google.auth
import google.auth.exceptions
import requests
from google.auth.transport.requests import AuthorizedSession

from transientvod.config import SPOT_HOST_NAMES
from transientvod.spot.hosts import GONE, NOTICED, USABLE, HostStatus
from transientvod.spot.notices.gce import GCE_PREEMPTION_NOTICE_SECONDS, preemption_notice_seconds
from transientvod.spot.providers.provider import ProviderError, SpotProvider

log = logging.getLogger(__name__)

DEFAULT_ENDPOINT = "https://compute.googleapis.com"
API_PATH = "/compute/v1"
SCOPES = ("https://www.googleapis.com/auth/compute.readonly",)
# The label key when spot.job_label is only the job's name. GCE label keys allow lowercase
# letters, digits, "-" and "_" (no ":" as in the AWS tag transientvod:job).
DEFAULT_LABEL_KEY = "transientvod-job"
# The poll runs in a loop every few seconds: connect fast, and let the next poll retry.
CONNECT_TIMEOUT_SECONDS = 3
READ_TIMEOUT_SECONDS = 10
PAGE_SIZE = 500  # the API's largest maxResults

NOT_YET = frozenset({"PROVISIONING", "STAGING", "PENDING"})
NOTICED_STATUSES = frozenset({"STOPPING", "SUSPENDING", "PENDING_STOP"})
GONE_STATUSES = frozenset({"TERMINATED", "STOPPED", "SUSPENDED", "REPAIRING", "DEPROVISIONING"})
# An instance the job listed before and no longer lists stays "gone" this long, so the watcher
# and the bill see its end; then it is forgotten, so memory does not grow.
UNLISTED_SECONDS = 600.0
PERMISSION = "compute.instances.list"
NO_CREDENTIALS = ("no Google credentials found; run gcloud auth application-default login, set "
                  "GOOGLE_APPLICATION_CREDENTIALS to a key file, or run on a VM with a service account.")


def parse_job_label(job_label: str) -> tuple[str, str]:
    """(key, value) of `spot.job_label`: "key=value", or the job's name under transientvod-job."""
    key, sep, value = job_label.partition("=")
    if not sep:
        key, value = DEFAULT_LABEL_KEY, job_label
    if not key or not value:
        raise ValueError(f"job_label is {job_label!r}; set it to the job's name or to key=value, "
                         "the label your job's instances carry.")
    return key, value


def host_status(instance: dict) -> str | None:
    """The HostStatus state of a listed instance's `status`; None while it is not yet running."""
    status = instance.get("status", "")
    if status in NOT_YET:
        return None
    if status == "RUNNING":
        return USABLE
    if status in NOTICED_STATUSES:
        return NOTICED
    return GONE  # GONE_STATUSES, and a status this module does not know: not usable either way


class GceProvider(SpotProvider):
    """The Compute Engine instances labelled `job_label` in `zone` (every zone if empty)."""

    name = "gce"

    def __init__(self, job_label: str, project: str = "", zone: str = "", endpoint_url: str = "",
                 host_name: str = "private-dns", slots: int = 0):
        self.label_key, self.label_value = parse_job_label(job_label)
        if host_name not in SPOT_HOST_NAMES:
            raise ValueError(f"host_name is {host_name!r}; it must be one of {', '.join(SPOT_HOST_NAMES)}.")
        if slots < 0:
            raise ValueError(f"slots is {slots}; it must be at least 1, or 0 to count each instance's GPUs.")
        self.zone = zone
        self.host_name = host_name
        self.slots = slots
        self.base_url = (endpoint_url or DEFAULT_ENDPOINT).rstrip("/") + API_PATH
        credentials, default_project = _default_credentials()
        self.project = project or default_project
        if not self.project:
            raise ProviderError("no GCE project set; set spot.project, or GOOGLE_CLOUD_PROJECT for the "
                                "Application Default Credentials.")
        self._session = AuthorizedSession(credentials)
        # (zone, name) -> (the host it was, the moment it was last listed): a deleted instance
        # is reported gone under the name it ran with.
        self._seen: dict[tuple[str, str], tuple[HostStatus, float]] = {}
        self._noticed_at: dict[tuple[str, str], float] = {}
        self._unknown_statuses: set[str] = set()

    def poll(self, now: float) -> list[HostStatus]:
        instances = [i for i in self._job_instances() if self._carries_label(i)]
        instances.sort(key=lambda i: (i.get("creationTimestamp", ""), i.get("name", "")))
        hosts, listed = [], set()
        for instance in instances:
            key = (_zone_of(instance), instance.get("name", ""))
            listed.add(key)
            host = self._host(instance, key, now)
            if host is not None:
                self._seen[key] = (host, now)
                hosts.append(host)
        return hosts + self._unlisted(listed, now)

    # --- the two list calls ----------------------------------------------------------------------

    def _job_instances(self) -> list[dict]:
        if self.zone:
            return [i for page in self._pages(f"zones/{self.zone}/instances", "instances.list")
                    for i in page.get("items", [])]
        instances = []
        for page in self._pages("aggregated/instances", "instances.aggregatedList"):
            unreachable = page.get("unreachables") or []
            if unreachable:
                # A partial answer would make the missing zones' hosts look deleted.
                raise ProviderError(f"Compute Engine could not list {', '.join(unreachable)} for project "
                                    f"{self.project}; the next poll tries again.")
            for scope in (page.get("items") or {}).values():
                instances.extend(scope.get("instances", []))  # a zone without any has a "warning"
        return instances

    def _pages(self, path: str, call: str):
        """Each page of a list call, following nextPageToken."""
        params = {"filter": f'labels.{self.label_key} = "{self.label_value}"', "maxResults": PAGE_SIZE}
        while True:
            page = self._get(f"{self.base_url}/projects/{self.project}/{path}", params, call)
            yield page
            token = page.get("nextPageToken")
            if not token:
                return
            params = {**params, "pageToken": token}

    def _carries_label(self, instance: dict) -> bool:
        # Checked here too: a server (or proxy) that ignores the filter must not add hosts.
        return (instance.get("labels") or {}).get(self.label_key) == self.label_value

    # --- one host --------------------------------------------------------------------------------

    def _host(self, instance: dict, key: tuple[str, str], now: float) -> HostStatus | None:
        state = host_status(instance)
        if state is None:
            return None
        status = instance.get("status", "")
        if state == GONE and status not in GONE_STATUSES and status not in self._unknown_statuses:
            self._unknown_statuses.add(status)  # said once, not at every poll
            log.warning("instance %s has status %r, which this provider does not know; it counts as gone.",
                        key[1], status)
        name = self._host_name(instance) or (self._seen[key][0].name if key in self._seen else "")
        if not name:
            if state == USABLE:
                log.warning("instance %s runs but has no internal IP yet; it joins the job once it has one.", key[1])
                return None
            name = key[1]
        if state == NOTICED:
            self._noticed_at.setdefault(key, now)
        elif state == USABLE:
            self._noticed_at.pop(key, None)  # a VM started again is a new life
        # A gone host keeps the notice it had: the bill ends a revoked host at terminate_at.
        notice_at = self._noticed_at.get(key)
        notice_seconds = preemption_notice_seconds(instance) or GCE_PREEMPTION_NOTICE_SECONDS
        terminate_at = notice_at + notice_seconds if notice_at is not None else None
        return HostStatus(name=name, slots=self._slots(instance), state=state, instance_id=key[1],
                          notice_at=notice_at, terminate_at=terminate_at)

    def _host_name(self, instance: dict) -> str:
        if self.host_name == "private-dns":
            # The VPC's internal DNS resolves an instance's name from the other VMs.
            return instance.get("name", "")
        interfaces = instance.get("networkInterfaces") or [{}]
        return interfaces[0].get("networkIP", "")

    def _slots(self, instance: dict) -> int:
        if self.slots > 0:
            return self.slots
        gpus = sum(int(a.get("acceleratorCount", 0)) for a in instance.get("guestAccelerators") or [])
        if gpus < 1:
            raise ProviderError(f"instance {instance.get('name')} has no guestAccelerators, so its number of "
                                "slots is unknown; set spot.slots to the workers each instance runs.")
        return gpus

    def _unlisted(self, listed: set, now: float) -> list[HostStatus]:
        """Gone hosts for instances listed before and missing now (deleted, or preempted with
        the DELETE termination action)."""
        gone = []
        for key, (host, last_listed) in list(self._seen.items()):
            if key in listed:
                continue
            if now - last_listed > UNLISTED_SECONDS:
                del self._seen[key]
                self._noticed_at.pop(key, None)
                continue
            gone.append(HostStatus(name=host.name, slots=host.slots, state=GONE, instance_id=host.instance_id,
                                   notice_at=host.notice_at, terminate_at=host.terminate_at))
        return gone

    # --- HTTP and its errors -----------------------------------------------------------------------

    def _get(self, url: str, params: dict, call: str) -> dict:
        try:
            response = self._session.get(url, params=params, timeout=(CONNECT_TIMEOUT_SECONDS, READ_TIMEOUT_SECONDS))
        except google.auth.exceptions.RefreshError as e:
            raise ProviderError(f"Google refused to refresh the credentials' access token ({_first_line(e)}); "
                                "run gcloud auth application-default login again or fix "
                                "GOOGLE_APPLICATION_CREDENTIALS.") from None
        except google.auth.exceptions.TransportError:
            raise ProviderError("cannot reach Google's token endpoint to refresh the credentials' access token; "
                                "check the network (the next poll tries again).") from None
        except requests.exceptions.Timeout:
            raise ProviderError(f"the Compute Engine endpoint {self.base_url} did not answer {call} in time; "
                                "check the network (the next poll tries again).") from None
        except requests.exceptions.RequestException:
            raise ProviderError(f"cannot reach the Compute Engine endpoint {self.base_url} for {call}; "
                                "check spot.endpoint_url and the network.") from None
        if response.status_code != 200:
            raise ProviderError(self._http_error(response, call))
        try:
            page = response.json()
        except ValueError:
            page = None
        if not isinstance(page, dict):
            kind = response.headers.get("Content-Type", "no content type")
            raise ProviderError(f"the Compute Engine endpoint {self.base_url} answered {call} with something that "
                                f"is not a JSON object ({kind}); check spot.endpoint_url and any proxy between.")
        return page

    def _http_error(self, response: requests.Response, call: str) -> str:
        status = response.status_code
        message, reasons = _google_error(response)
        where = f"project {self.project}" + (f", zone {self.zone}" if self.zone else "")
        if status == 401:
            return (f"Compute Engine rejected the credentials for {call} ({message}); run gcloud auth "
                    "application-default login again or fix GOOGLE_APPLICATION_CREDENTIALS.")
        if status == 403 and reasons & {"accessNotConfigured", "SERVICE_DISABLED"}:
            return f"the Compute Engine API is not enabled in {where}; enable compute.googleapis.com there."
        if status == 403:
            return (f"Compute Engine denied {call} in {where} to these credentials; grant them the permission "
                    f"{PERMISSION} (roles/compute.viewer has it).")
        if status == 404:
            return f"Compute Engine knows no {where} (404 for {call}); fix spot.project or spot.zone."
        if status >= 500:
            return (f"Compute Engine answered {call} with HTTP {status} ({message}), a fault on the server's "
                    "side; the next poll tries again.")
        return f"Compute Engine answered {call} in {where} with HTTP {status}: {message}."


def _default_credentials():
    """Application Default Credentials and their project (maybe None); one sentence if none."""
    try:
        return google.auth.default(scopes=list(SCOPES))
    except google.auth.exceptions.DefaultCredentialsError as e:
        named = os.environ.get("GOOGLE_APPLICATION_CREDENTIALS")
        if named:
            raise ProviderError(f"GOOGLE_APPLICATION_CREDENTIALS is {named}, which is not a usable credentials "
                                f"file ({_first_line(e)}); fix it or unset it.") from None
        raise ProviderError(NO_CREDENTIALS) from None


def _google_error(response: requests.Response) -> tuple[str, set]:
    """The message and reasons of a Google API error body; the status text when it is not one."""
    try:
        error = response.json().get("error")
    except (ValueError, AttributeError):
        error = None
    if not isinstance(error, dict):
        return _first_line(response.reason or "no message"), set()
    reasons = {e.get("reason") for e in error.get("errors") or [] if isinstance(e, dict)}
    reasons |= {d.get("reason") for d in error.get("details") or [] if isinstance(d, dict)}
    return _first_line(error.get("message") or response.reason or "no message"), reasons


def _first_line(error) -> str:
    """An exception's or message's text, cut to one line without a final period, so that it
    fits inside one sentence (google-auth's errors carry the message as their first argument,
    the server's answer as the second)."""
    if isinstance(error, Exception) and error.args and isinstance(error.args[0], str):
        error = error.args[0]
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return text[:200].rstrip(".").replace(". ", "; ")


def _zone_of(instance: dict) -> str:
    return (instance.get("zone") or "").rsplit("/", 1)[-1]
