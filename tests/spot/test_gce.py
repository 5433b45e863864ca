"""GceProvider against real HTTP: a hand-written Compute Engine server on 127.0.0.1.

Hand-written because no emulator of Compute Engine exists (Google ships emulators for
Pub/Sub, Datastore, Firestore, Bigtable and Spanner, not for Compute Engine, and moto is AWS
only). The server below answers the two calls the provider makes, in the JSON shapes of the
API reference: `instances.list` (`items`, a list) and `instances.aggregatedList` (`items`
keyed by "zones/<zone>", each with `instances` or a NO_RESULTS_ON_PAGE `warning`), both two
instances a page with `nextPageToken`, both honouring the `labels.KEY = "VALUE"` filter
unless told to ignore it. It also plays Google's OAuth token endpoint, so the real
Application Default Credentials path runs: a service-account key file (named by
GOOGLE_APPLICATION_CREDENTIALS, with a key pair made for the test) whose `token_uri` points
here, a token refresh by google-auth (a JWT assertion signed with the key, which the server
verifies), and `Authorization: Bearer` on every API call, which the server checks.
A service-account key rather than an `authorized_user` file: google-auth (2.63) replaces an
authorized_user file's `token_uri` with Google's own endpoint, so that path cannot be pointed
at a loopback server.
"""
from __future__ import annotations

import json
import re
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import google.auth.jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from conftest import free_port, heavy_modules_imported

from transientvod.config import ConfigError, load_config
from transientvod.spot.hosts import GONE, NOTICED, USABLE
from transientvod.spot.providers.from_config import provider_from_config
from transientvod.spot.providers.gce import GCE_PREEMPTION_NOTICE_SECONDS, UNLISTED_SECONDS, GceProvider
from transientvod.spot.providers.provider import ProviderError

PROJECT = "tvd-study"
ZONES = ("us-east1-c", "us-west1-b", "europe-west4-a")
JOB = "resnet32-run7"
LABEL = {"transientvod-job": JOB}
SERVICE_ACCOUNT = f"watcher@{PROJECT}.iam.gserviceaccount.com"
JWT_GRANT = "urn:ietf:params:oauth:grant-type:jwt-bearer"
GOOGLE_TOKEN_AUDIENCE = "https://oauth2.googleapis.com/token"
ACCESS_TOKEN = "ya29.access-token-of-the-test"
PAGE_SIZE = 2
NOW = 1_796_009_000.0
FILTER = re.compile(r'^labels\.([a-z0-9_-]+) = "([^"]*)"$')


class ComputeState:
    """What the fake cloud holds, and what it saw."""

    def __init__(self):
        self.instances: dict[str, list[dict]] = {zone: [] for zone in ZONES}
        self.honour_filter = True
        self.forced: tuple[int, str, str] | None = None  # (status, content type, body) for API calls
        self.token_answer: tuple[int, dict] = (200, {"access_token": ACCESS_TOKEN, "expires_in": 3600,
                                                     "token_type": "Bearer"})
        self.unreachables: list[str] = []
        self.api_calls: list[tuple[str, dict]] = []
        self.refreshes = 0

    def add(self, name: str, zone: str = ZONES[0], status: str = "RUNNING", gpus: int = 1,
            labels: dict | None = None, ip: str | None = None) -> dict:
        """An instance resource as instances.get shows a K80 spot VM."""
        number = sum(len(v) for v in self.instances.values()) + 1
        instance = {
            "kind": "compute#instance", "id": str(7_000_000_000 + number), "name": name,
            "creationTimestamp": f"2026-11-30T03:{number:02d}:00.000-08:00",
            "zone": f"https://www.googleapis.com/compute/v1/projects/{PROJECT}/zones/{zone}",
            "machineType": f"https://www.googleapis.com/compute/v1/projects/{PROJECT}/zones/{zone}/machineTypes/n1-standard-4",
            "status": status, "labels": dict(LABEL if labels is None else labels),
            "networkInterfaces": [{"name": "nic0", "networkIP": ip or f"10.128.0.{number}"}],
            "scheduling": {"provisioningModel": "SPOT", "preemptible": True, "instanceTerminationAction": "STOP",
                           "onHostMaintenance": "TERMINATE", "automaticRestart": False},
        }
        if gpus:
            instance["guestAccelerators"] = [{
                "acceleratorType": f"https://www.googleapis.com/compute/v1/projects/{PROJECT}/zones/{zone}/"
                                   "acceleratorTypes/nvidia-tesla-k80", "acceleratorCount": gpus}]
        self.instances[zone].append(instance)
        return instance

    def set_status(self, name: str, status: str) -> None:
        for instance in (i for zone in self.instances.values() for i in zone):
            if instance["name"] == name:
                instance["status"] = status

    def delete(self, name: str) -> None:
        for zone in self.instances:
            self.instances[zone] = [i for i in self.instances[zone] if i["name"] != name]


class Handler(BaseHTTPRequestHandler):
    # set on the class the fixture makes
    state: ComputeState
    public_pem: str

    def log_message(self, *args):  # keep pytest's output clean
        pass

    def do_POST(self):
        if self.path != "/token":
            return self._json(404, {"error": "not found"})
        form = urllib.parse.parse_qs(self.rfile.read(int(self.headers["Content-Length"])).decode())
        self.state.refreshes += 1
        if form.get("grant_type") != [JWT_GRANT] or not self._signed_by_the_key(form.get("assertion", [""])[0]):
            return self._json(400, {"error": "invalid_grant", "error_description": "Invalid JWT Signature."})
        self._json(*self.state.token_answer)

    def _signed_by_the_key(self, assertion: str) -> bool:
        """The service account's JWT, signed with the test's private key, asking for Compute scope."""
        try:
            # google-auth addresses the assertion to Google's endpoint wherever it posts it.
            claims = google.auth.jwt.decode(assertion, certs=self.public_pem, audience=GOOGLE_TOKEN_AUDIENCE)
        except ValueError:
            return False
        return claims.get("iss") == SERVICE_ACCOUNT and "compute.readonly" in claims.get("scope", "")

    def do_GET(self):
        url = urllib.parse.urlsplit(self.path)
        params = {k: v[0] for k, v in urllib.parse.parse_qs(url.query).items()}
        self.state.api_calls.append((url.path, params))
        if self.headers.get("Authorization") != f"Bearer {ACCESS_TOKEN}":
            return self._error(401, "Request had invalid authentication credentials.", "UNAUTHENTICATED")
        if self.state.forced is not None:
            status, content_type, body = self.state.forced
            return self._send(status, content_type, body.encode())
        zonal = re.fullmatch(r"/compute/v1/projects/([^/]+)/zones/([^/]+)/instances", url.path)
        aggregated = re.fullmatch(r"/compute/v1/projects/([^/]+)/aggregated/instances", url.path)
        project = (zonal or aggregated).group(1) if (zonal or aggregated) else None
        if project != PROJECT or (zonal and zonal.group(2) not in ZONES):
            what = f"projects/{project}" + (f"/zones/{zonal.group(2)}" if zonal else "")
            return self._error(404, f"The resource '{what}' was not found", "NOT_FOUND")
        rows = [(zone, i) for zone in ([zonal.group(2)] if zonal else ZONES)
                for i in self.state.instances[zone] if self._matches(i, params.get("filter"))]
        start = int(params.get("pageToken", "0"))
        page = rows[start:start + PAGE_SIZE]
        body = self._zonal(page) if zonal else self._aggregated(page)
        if start + PAGE_SIZE < len(rows):
            body["nextPageToken"] = str(start + PAGE_SIZE)
        self._json(200, body)

    def _matches(self, instance: dict, expression: str | None) -> bool:
        if not expression or not self.state.honour_filter:
            return True
        key, value = FILTER.fullmatch(expression).groups()
        return instance["labels"].get(key) == value

    @staticmethod
    def _zonal(page: list) -> dict:
        body = {"kind": "compute#instanceList", "id": f"projects/{PROJECT}/zones/instances"}
        if page:
            body["items"] = [i for _, i in page]
        return body

    def _aggregated(self, page: list) -> dict:
        items = {}
        for zone in ZONES:
            instances = [i for z, i in page if z == zone]
            items[f"zones/{zone}"] = {"instances": instances} if instances else {"warning": {
                "code": "NO_RESULTS_ON_PAGE", "message": "There are no results for scope "
                f"'zones/{zone}' on this page.", "data": [{"key": "scope", "value": f"zones/{zone}"}]}}
        body = {"kind": "compute#instanceAggregatedList", "id": f"projects/{PROJECT}/aggregated/instances",
                "items": items}
        if self.state.unreachables:
            body["unreachables"] = list(self.state.unreachables)
        return body

    def _error(self, code: int, message: str, status: str, reason: str = "") -> None:
        self._json(code, {"error": {"code": code, "message": message, "status": status,
                                    "errors": [{"message": message, "domain": "global",
                                                "reason": reason or status.lower()}]}})

    def _json(self, code: int, body: dict) -> None:
        self._send(code, "application/json; charset=UTF-8", json.dumps(body).encode())

    def _send(self, code: int, content_type: str, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(scope="module")
def server():
    """One loopback server for the module; each test gets a fresh ComputeState."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public_pem = key.public_key().public_bytes(serialization.Encoding.PEM,
                                              serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    private_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption()).decode()
    handler = type("TestHandler", (Handler,), {"state": ComputeState(), "public_pem": public_pem})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield handler, url, private_pem
    httpd.shutdown()
    httpd.server_close()


def isolate_google_environment(env: pytest.MonkeyPatch, tmp_path) -> None:
    """Nothing of the developer's own Google setup leaks in, and nothing probes a real
    metadata server."""
    for name in ("GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_CLOUD_PROJECT", "GCLOUD_PROJECT",
                 "GOOGLE_CLOUD_QUOTA_PROJECT", "HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        env.delenv(name, raising=False)
    env.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))  # an empty gcloud configuration
    env.setenv("NO_GCE_CHECK", "True")
    env.setenv("NO_PROXY", "127.0.0.1")


@pytest.fixture
def cloud(server, tmp_path, monkeypatch):
    handler, url, private_pem = server
    handler.state = ComputeState()
    isolate_google_environment(monkeypatch, tmp_path)
    cloud = Cloud(handler.state, url, private_pem, tmp_path)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(cloud.key_file()))
    return cloud


class Cloud:
    def __init__(self, state: ComputeState, url: str, private_pem: str, directory):
        self.state = state
        self.url = url
        self.private_pem = private_pem
        self.directory = directory

    def key_file(self, name: str = "key.json", **fields):
        """A service-account key file as the console downloads one; `fields` replace its entries
        (None removes one)."""
        key = {"type": "service_account", "project_id": PROJECT, "private_key_id": "0123456789abcdef",
               "private_key": self.private_pem, "client_email": SERVICE_ACCOUNT, "client_id": "1234567890",
               "token_uri": f"{self.url}/token"}
        key.update(fields)
        path = self.directory / name
        path.write_text(json.dumps({k: v for k, v in key.items() if v is not None}))
        return path

    def provider(self, **options) -> GceProvider:
        options = {"project": PROJECT, "endpoint_url": self.url, **options}
        return GceProvider(options.pop("job_label", JOB), **options)


def by_id(hosts) -> dict:
    return {h.instance_id: h for h in hosts}


def assert_one_sentence(error: Exception, *names: str) -> None:
    """One sentence, raised without a chained traceback, naming each of `names`."""
    text = str(error)
    assert text.endswith(".") and ". " not in text and "\n" not in text, text
    assert error.__cause__ is None and (error.__context__ is None or error.__suppress_context__), \
        "a chained exception would print a traceback"
    for name in names:
        assert name in text, text


# --- states, names and slots ----------------------------------------------------------------------


def test_statuses_map_to_usable_noticed_gone_and_not_yet(cloud, caplog):
    for name, status in (("running", "RUNNING"), ("stopping", "STOPPING"), ("suspending", "SUSPENDING"),
                         ("pending-stop", "PENDING_STOP"), ("terminated", "TERMINATED"), ("suspended", "SUSPENDED"),
                         ("repairing", "REPAIRING"), ("provisioning", "PROVISIONING"), ("staging", "STAGING"),
                         ("future", "HIBERNATING")):
        cloud.state.add(name, status=status)
    provider = cloud.provider(zone=ZONES[0])

    hosts = by_id(provider.poll(NOW))

    assert {name: h.state for name, h in hosts.items()} == {
        "running": USABLE, "stopping": NOTICED, "suspending": NOTICED, "pending-stop": NOTICED,
        "terminated": GONE, "suspended": GONE, "repairing": GONE, "future": GONE}  # provisioning, staging: not yet
    provider.poll(NOW + 2)
    assert [r.getMessage() for r in caplog.records if "HIBERNATING" in r.getMessage()] == [
        "instance future has status 'HIBERNATING', which this provider does not know; it counts as gone."]
    assert hosts["running"].notice_at is None and hosts["running"].terminate_at is None
    assert hosts["stopping"].notice_at == NOW
    assert hosts["stopping"].terminate_at == NOW + GCE_PREEMPTION_NOTICE_SECONDS


def test_a_preemption_is_noticed_once_then_gone_under_the_name_it_ran_with(cloud):
    cloud.state.add("vm-1", ip="10.128.0.11")
    provider = cloud.provider(zone=ZONES[0], host_name="private-ip")
    assert [(h.name, h.state) for h in provider.poll(NOW)] == [("10.128.0.11", USABLE)]

    cloud.state.set_status("vm-1", "STOPPING")  # the 30 s after Compute Engine's soft-off
    first, later = provider.poll(NOW + 2)[0], provider.poll(NOW + 4)[0]
    assert first.state == later.state == NOTICED
    assert later.notice_at == NOW + 2  # dated when first seen, not moved by each poll

    cloud.state.set_status("vm-1", "TERMINATED")
    cloud.state.instances[ZONES[0]][0]["networkInterfaces"] = [{"name": "nic0"}]  # a stopped VM may lose it
    gone = provider.poll(NOW + 40)[0]
    assert (gone.name, gone.state, gone.instance_id) == ("10.128.0.11", GONE, "vm-1")
    # The bill ends a revoked host at terminate_at, so the gone host keeps its notice.
    assert (gone.notice_at, gone.terminate_at) == (NOW + 2, NOW + 2 + GCE_PREEMPTION_NOTICE_SECONDS)

    cloud.state.set_status("vm-1", "RUNNING")  # started again: a new life, no notice
    again = provider.poll(NOW + 100)[0]
    assert (again.state, again.notice_at, again.terminate_at) == (USABLE, None, None)


def test_the_notice_length_is_the_instances_preemption_notice_duration(cloud):
    # scheduling.preemptionNoticeDuration as the API writes a Duration: int64 seconds as a string.
    long_notice = cloud.state.add("long-notice")
    long_notice["scheduling"]["preemptionNoticeDuration"] = {"seconds": "120", "nanos": 0}
    cloud.state.add("default-notice")  # unset: GCE's 30 s
    odd = cloud.state.add("odd-notice")
    odd["scheduling"]["preemptionNoticeDuration"] = {"seconds": "soon"}  # not a Duration: the default
    provider = cloud.provider(zone=ZONES[0])
    provider.poll(NOW)
    for name in ("long-notice", "default-notice", "odd-notice"):
        cloud.state.set_status(name, "STOPPING")
    hosts = by_id(provider.poll(NOW + 3))
    assert {name: h.terminate_at - h.notice_at for name, h in hosts.items()} == {
        "long-notice": 120.0, "default-notice": GCE_PREEMPTION_NOTICE_SECONDS,
        "odd-notice": GCE_PREEMPTION_NOTICE_SECONDS}
    assert GCE_PREEMPTION_NOTICE_SECONDS == 30.0


def test_a_deleted_instance_is_gone_for_a_while_then_forgotten(cloud):
    cloud.state.add("kept")
    cloud.state.add("deleted")  # a spot VM whose termination action is DELETE
    provider = cloud.provider(zone=ZONES[0])
    assert {h.state for h in provider.poll(NOW)} == {USABLE}

    cloud.state.delete("deleted")
    assert {h.instance_id: h.state for h in provider.poll(NOW + 5)} == {"kept": USABLE, "deleted": GONE}
    assert [h.instance_id for h in provider.poll(NOW + 6 + UNLISTED_SECONDS)] == ["kept"]


def test_slots_are_the_attached_gpus_unless_spot_slots_says(cloud):
    cloud.state.add("four", gpus=4, ip="10.128.0.4")
    cloud.state.add("two", gpus=2, ip="10.128.0.2")

    hosts = cloud.provider(zone=ZONES[0]).poll(NOW)
    assert {(h.name, h.slots) for h in hosts} == {("four", 4), ("two", 2)}  # private-dns: the instance name

    hosts = cloud.provider(zone=ZONES[0], host_name="private-ip", slots=8).poll(NOW)
    assert {(h.name, h.slots) for h in hosts} == {("10.128.0.4", 8), ("10.128.0.2", 8)}


def test_an_instance_without_accelerators_needs_spot_slots(cloud):
    cloud.state.add("cpu-only", gpus=0)
    with pytest.raises(ProviderError) as raised:
        cloud.provider(zone=ZONES[0]).poll(NOW)
    assert_one_sentence(raised.value, "cpu-only", "spot.slots")

    assert [(h.instance_id, h.slots) for h in cloud.provider(zone=ZONES[0], slots=1).poll(NOW)] == [("cpu-only", 1)]


# --- listing: paging, zones, the label ----------------------------------------------------------


def test_one_zone_is_read_page_by_page(cloud):
    for n in range(5):
        cloud.state.add(f"vm-{n}")
    cloud.state.add("elsewhere", zone=ZONES[1])

    hosts = cloud.provider(zone=ZONES[0]).poll(NOW)

    assert [h.instance_id for h in hosts] == [f"vm-{n}" for n in range(5)]
    paths = {path for path, _ in cloud.state.api_calls}
    assert paths == {f"/compute/v1/projects/{PROJECT}/zones/{ZONES[0]}/instances"}
    assert [params.get("pageToken") for _, params in cloud.state.api_calls] == [None, "2", "4"]


def test_every_zone_is_read_through_aggregated_list_page_by_page(cloud):
    cloud.state.add("east-1", zone=ZONES[0])
    cloud.state.add("east-2", zone=ZONES[0], gpus=2)
    cloud.state.add("west-1", zone=ZONES[1], status="STOPPING")
    cloud.state.add("europe-1", zone=ZONES[2], gpus=4)
    cloud.state.add("europe-2", zone=ZONES[2], status="TERMINATED")

    hosts = by_id(cloud.provider().poll(NOW))

    assert {name: (h.state, h.slots) for name, h in hosts.items()} == {
        "east-1": (USABLE, 1), "east-2": (USABLE, 2), "west-1": (NOTICED, 1),
        "europe-1": (USABLE, 4), "europe-2": (GONE, 1)}
    assert [path for path, _ in cloud.state.api_calls] == [f"/compute/v1/projects/{PROJECT}/aggregated/instances"] * 3
    assert [params.get("pageToken") for _, params in cloud.state.api_calls] == [None, "2", "4"]


def test_only_instances_with_the_jobs_label_count_even_if_the_server_ignores_the_filter(cloud):
    cloud.state.add("mine")
    cloud.state.add("another-job", labels={"transientvod-job": "other"})
    cloud.state.add("unlabelled", labels={})
    cloud.state.add("custom", labels={"team": "vision"})

    assert [h.instance_id for h in cloud.provider().poll(NOW)] == ["mine"]
    assert {params["filter"] for _, params in cloud.state.api_calls} == {f'labels.transientvod-job = "{JOB}"'}

    cloud.state.honour_filter = False
    assert [h.instance_id for h in cloud.provider(zone=ZONES[0]).poll(NOW)] == ["mine"]
    assert [h.instance_id for h in cloud.provider(job_label="team=vision").poll(NOW)] == ["custom"]


def test_the_token_comes_from_the_credentials_token_uri_and_is_reused(cloud):
    cloud.state.add("vm")
    provider = cloud.provider(zone=ZONES[0])
    for n in range(3):
        assert [h.state for h in provider.poll(NOW + n)] == [USABLE]
    # The server answered only calls carrying its Bearer token; one refresh served all three.
    assert len(cloud.state.api_calls) == 3 and cloud.state.refreshes == 1


# --- what the user can get wrong: one sentence each ------------------------------------------------


def test_no_credentials_is_one_sentence(cloud, monkeypatch):
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS")
    with pytest.raises(ProviderError) as raised:
        cloud.provider()
    assert_one_sentence(raised.value, "gcloud auth application-default login", "GOOGLE_APPLICATION_CREDENTIALS")


def test_a_credentials_file_that_is_not_there_is_named(cloud, monkeypatch, tmp_path):
    missing = tmp_path / "no-such-key.json"
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(missing))
    with pytest.raises(ProviderError) as raised:
        cloud.provider()
    assert_one_sentence(raised.value, str(missing), "fix it or unset it")


def test_no_project_is_one_sentence(cloud, monkeypatch):
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(cloud.key_file("no-project.json", project_id=None)))
    with pytest.raises(ProviderError) as raised:
        cloud.provider(project="")
    assert_one_sentence(raised.value, "spot.project", "GOOGLE_CLOUD_PROJECT")


def test_the_credentials_project_is_used_when_spot_project_is_empty(cloud, monkeypatch):
    cloud.state.add("vm")
    assert [h.instance_id for h in cloud.provider(project="").poll(NOW)] == ["vm"]
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(cloud.key_file("no-project.json", project_id=None)))
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", PROJECT)
    assert [h.instance_id for h in cloud.provider(project="").poll(NOW)] == ["vm"]


GOOGLE_403 = json.dumps({"error": {"code": 403, "status": "PERMISSION_DENIED", "message":
                        "Required 'compute.instances.list' permission for 'projects/tvd-study'",
                        "errors": [{"reason": "forbidden", "domain": "global"}]}})
DISABLED_403 = json.dumps({"error": {"code": 403, "status": "PERMISSION_DENIED", "message":
                          "Compute Engine API has not been used in project 1 before or it is disabled.",
                          "errors": [{"reason": "accessNotConfigured", "domain": "usageLimits"}]}})


@pytest.mark.parametrize("answer, names", [
    ((403, "application/json", GOOGLE_403), ("compute.instances.list", "grant", PROJECT)),
    ((403, "application/json", DISABLED_403), ("enable compute.googleapis.com", PROJECT)),
    ((503, "application/json", json.dumps({"error": {"code": 503, "message": "Backend Error"}})),
     ("HTTP 503", "Backend Error", "next poll")),
    ((502, "text/html", "<html><body>Bad Gateway</body></html>"), ("HTTP 502", "next poll")),
    ((200, "text/html", "<html><body>Sign in to the proxy</body></html>"), ("not a JSON object", "text/html",
                                                                           "spot.endpoint_url")),
    ((200, "application/json", "[1, 2]"), ("not a JSON object", "spot.endpoint_url")),
], ids=["403-permission", "403-api-disabled", "503", "502-html", "200-html", "200-not-an-object"])
def test_bad_answers_are_one_sentence_naming_the_fix(cloud, answer, names):
    cloud.state.forced = answer
    with pytest.raises(ProviderError) as raised:
        cloud.provider(zone=ZONES[0]).poll(NOW)
    assert_one_sentence(raised.value, *names)


@pytest.mark.parametrize("options, names", [
    ({"project": "no-such-project"}, ("project no-such-project", "spot.project")),
    ({"zone": "mars-north1-a"}, ("zone mars-north1-a", "spot.zone")),
])
def test_a_project_or_zone_that_does_not_exist_is_named(cloud, options, names):
    with pytest.raises(ProviderError) as raised:
        cloud.provider(**{"zone": ZONES[0], **options}).poll(NOW)
    assert_one_sentence(raised.value, "404", *names)


def test_unreachable_zones_fail_the_poll_rather_than_look_deleted(cloud):
    cloud.state.add("vm", zone=ZONES[1])
    provider = cloud.provider()
    assert [h.state for h in provider.poll(NOW)] == [USABLE]
    cloud.state.unreachables = [f"zones/{ZONES[1]}"]
    with pytest.raises(ProviderError) as raised:
        provider.poll(NOW + 2)
    assert_one_sentence(raised.value, f"zones/{ZONES[1]}", "next poll")


def test_an_unreachable_endpoint_is_named(cloud):
    closed = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(ProviderError) as raised:
        cloud.provider(endpoint_url=closed).poll(NOW)
    assert_one_sentence(raised.value, f"{closed}/compute/v1", "spot.endpoint_url")


def test_a_refused_or_unreachable_token_endpoint_is_named(cloud, monkeypatch):
    cloud.state.token_answer = (400, {"error": "invalid_grant", "error_description": "Invalid JWT Signature."})
    with pytest.raises(ProviderError) as raised:
        cloud.provider().poll(NOW)
    assert_one_sentence(raised.value, "refresh", "gcloud auth application-default login")

    key = cloud.key_file("unreachable-token.json", token_uri=f"http://127.0.0.1:{free_port()}/token")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(key))
    with pytest.raises(ProviderError) as raised:
        cloud.provider().poll(NOW)
    assert_one_sentence(raised.value, "token endpoint", "network")


def test_a_token_the_api_rejects_is_named(cloud):
    cloud.state.token_answer = (200, {"access_token": "ya29.a-token-the-api-does-not-know", "expires_in": 3600})
    with pytest.raises(ProviderError) as raised:
        cloud.provider().poll(NOW)
    assert_one_sentence(raised.value, "rejected the credentials", "invalid authentication credentials",
                        "gcloud auth application-default login")
    assert cloud.state.refreshes > 1  # google-auth refreshed again on the 401 before giving up


def test_options_are_checked(cloud):
    with pytest.raises(ValueError, match="host_name is 'public-ip'"):
        cloud.provider(host_name="public-ip")
    with pytest.raises(ValueError, match="slots is -1"):
        cloud.provider(slots=-1)
    with pytest.raises(ValueError, match="job_label is 'team='"):
        cloud.provider(job_label="team=")


# --- the config --------------------------------------------------------------------------------------


def test_the_config_needs_a_gce_label_and_builds_the_provider(cloud, tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text("spot: {provider: gce}\n")
    with pytest.raises(ConfigError, match=r"spot.job_label is ''; set it to the job's name"):
        load_config(job, [])
    with pytest.raises(ConfigError, match=r"spot.job_label is 'Team:Vision'"):
        load_config(job, ["spot.job_label=Team:Vision"])
    with pytest.raises(ConfigError, match=r"spot.host_name is 'public-dns'; it must be one of private-dns, private-ip"):
        load_config(job, [f"spot.job_label={JOB}", "spot.host_name=public-dns"])

    cloud.state.add("vm", zone=ZONES[2], gpus=2)
    config = load_config(job, [f"spot.job_label={JOB}", f"spot.project={PROJECT}", f"spot.zone={ZONES[2]}",
                               f"spot.endpoint_url={cloud.url}"])
    provider = provider_from_config(config.spot, start_time=NOW)
    assert isinstance(provider, GceProvider)
    assert [(h.instance_id, h.slots, h.state) for h in provider.poll(NOW)] == [("vm", 2, USABLE)]


def test_importing_it_pulls_in_neither_torch_nor_horovod():
    assert heavy_modules_imported("transientvod.spot.providers.gce") == []
