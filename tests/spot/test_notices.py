"""Interruption notices against real HTTP servers on loopback that play the cloud's
metadata endpoints (the one thing that cannot exist on this machine), and a real host-state
file."""
from __future__ import annotations

import hashlib
import json
import logging
import socket
import threading
import time
import urllib.parse
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from conftest import heavy_modules_imported
from transientvod.spot.hosts import GONE, NOTICED, HostState, HostStatus, write_host_state
from transientvod.spot.notices import aws as notice_aws
from transientvod.spot.notices.aws import Imdsv2NoticeSource
from transientvod.spot.notices.gce import GceNoticeSource
from transientvod.spot.notices.source import Notice, NoticeSource, NoticeSourceError
from transientvod.spot.notices.watcher import HostStateNoticeSource, NoticeWatcher, notice_source

TERMINATE_ISO = "2017-09-18T08:22:00Z"
TERMINATE_UNIX = datetime(2017, 9, 18, 8, 22, tzinfo=timezone.utc).timestamp()


# The bodies and headers the metadata services answer with, as AWS documents them and the EC2
# metadata mock (aws/amazon-ec2-metadata-mock) reproduces them: text/plain JSON for a notice,
# an XHTML page for 401 and 404, the token's TTL echoed in a header.
IMDS_PAGE = ('<?xml version="1.0" encoding="iso-8859-1"?>\n<!DOCTYPE html PUBLIC "-//W3C//DTD XHTML 1.0 '
             'Transitional//EN"\n\t"http://www.w3.org/TR/xhtml1/DTD/xhtml1-transitional.dtd">\n'
             '<html xmlns="http://www.w3.org/1999/xhtml" xml:lang="en" lang="en">\n <head>\n  <title>{0}</title>\n'
             ' </head>\n <body>\n  <h1>{0}</h1>\n </body>\n</html>')
INSTANCE_ID = "i-1234567890abcdef0"


class Imds:
    """What the EC2 instance-metadata service knows; tests flip its flags."""

    def __init__(self):
        self.lock = threading.Lock()
        self.token = "token-1"
        self.tokens_issued = 0
        self.token_puts = 0
        self.token_ttls: list[str] = []
        self.gets = 0
        self.unauthorized = 0
        self.instance_action: dict | None = None  # None: 404
        self.instance_action_body: bytes | None = None  # overrides the JSON when set
        self.instance_action_status = 200
        self.rebalance = False
        # http-tokens optional: a GET without a token is answered (IMDSv1)
        self.imdsv1_allowed = False
        # hop limit 1 behind a container bridge: the token's reply never arrives
        self.token_reply_dropped = False
        self.released = threading.Event()  # set at teardown, so a held PUT ends

    def rotate_token(self):
        with self.lock:
            self.token = f"token-{self.tokens_issued + 1}"


class ImdsHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):  # keep pytest output clean
        pass

    def _answer(self, status: int, body: bytes = b"", **headers):
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8" if status >= 400 else "text/plain")
        self.send_header("Server", "EC2ws")
        for name, value in headers.items():
            self.send_header(name.replace("_", "-"), value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _page(self, status: int, title: str):
        self._answer(status, IMDS_PAGE.format(f"{status} - {title}").encode())

    def do_PUT(self):
        imds: Imds = self.server.imds
        with imds.lock:
            imds.token_puts += 1
        if imds.token_reply_dropped:
            # The reply is sent with IP TTL 1 and dies at the bridge: to this process, silence.
            imds.released.wait(10)
            self.close_connection = True
            return
        ttl = self.headers.get("X-aws-ec2-metadata-token-ttl-seconds")
        if self.path != "/latest/api/token" or ttl is None:
            return self._page(400, "Bad Request")
        with imds.lock:
            imds.tokens_issued += 1
            imds.token_ttls.append(ttl)
            token = imds.token
        self._answer(200, token.encode(), X_Aws_Ec2_Metadata_Token_Ttl_Seconds=ttl)

    def do_GET(self):
        imds: Imds = self.server.imds
        with imds.lock:
            imds.gets += 1
            sent = self.headers.get("X-aws-ec2-metadata-token")
            if sent != imds.token and not (sent is None and imds.imdsv1_allowed):
                imds.unauthorized += 1
                return self._page(401, "Unauthorized")
            if self.path == "/latest/meta-data/instance-id":
                return self._answer(200, INSTANCE_ID.encode())
            if self.path == "/latest/meta-data/spot/instance-action":
                if imds.instance_action_body is not None:
                    return self._answer(imds.instance_action_status, imds.instance_action_body)
                if imds.instance_action is not None:
                    return self._answer(200, json.dumps(imds.instance_action).encode())
            if self.path == "/latest/meta-data/events/recommendations/rebalance" and imds.rebalance:
                return self._answer(200, json.dumps({"noticeTime": TERMINATE_ISO}).encode())
        self._page(404, "Not Found")


# The GCE metadata server's answers as captured on VMs: Metadata-Flavor: Google on every
# answer (a refusal too), application/text values, an ETag per value, and wait_for_change
# held until the value's ETag differs from last_etag or timeout_sec passes.
GCE_404 = (b'<!DOCTYPE html>\n<html lang=en>\n  <meta charset=utf-8>\n  <title>Error 404 (Not Found)!!1</title>\n'
           b'  <p><b>404.</b> <ins>That\xe2\x80\x99s an error.</ins>\n  <p>The requested URL was not found on this '
           b'server.  <ins>That\xe2\x80\x99s all we know.</ins>\n')


class Gce:
    """What the GCE metadata server knows; tests change values with set()."""

    def __init__(self):
        self.changed = threading.Condition()
        # No instance/service-accounts/default/token: a VM without a service account, which
        # keeps GCE's 30 s notice without asking the Compute API.
        self.values = {"instance/preempted": "FALSE", "instance/maintenance-event": "NONE",
                       "instance/id": "4520031799277581759", "project/project-id": "tvd-study",
                       "instance/zone": "projects/861012345678/zones/us-east1-c", "instance/name": "worker-3"}
        self.requests: list[str] = []
        self.status_override: int | None = None
        self.holds_requests = True  # False: a server that ignores wait_for_change

    def set(self, key: str, value: str):
        with self.changed:
            self.values[key] = value
            self.changed.notify_all()

    @staticmethod
    def etag(value: str) -> str:
        return hashlib.sha256(value.encode()).hexdigest()[:16]


class GceHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _answer(self, status: int, body: bytes, content_type: str = "application/text", etag: str | None = None):
        self.send_response(status)
        self.send_header("Metadata-Flavor", "Google")
        self.send_header("Content-Type", content_type)
        self.send_header("Server", "Metadata Server for VM")
        if etag is not None:
            self.send_header("ETag", etag)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        gce: Gce = self.server.gce
        url = urllib.parse.urlsplit(self.path)
        query = dict(urllib.parse.parse_qsl(url.query))
        gce.requests.append(self.path)
        if self.headers.get("Metadata-Flavor") != "Google":
            return self._answer(403, b"Missing Metadata-Flavor:Google header.\n", "text/html; charset=UTF-8")
        if gce.status_override is not None:
            return self._answer(gce.status_override, b"", "text/html; charset=UTF-8")
        key = url.path.removeprefix("/computeMetadata/v1/")
        with gce.changed:
            if key not in gce.values:
                return self._answer(404, GCE_404, "text/html; charset=UTF-8")
            if query.get("wait_for_change") == "true" and gce.holds_requests:
                last = query.get("last_etag") or Gce.etag(gce.values[key])
                gce.changed.wait_for(lambda: Gce.etag(gce.values[key]) != last, float(query.get("timeout_sec", 60)))
            value = gce.values[key]
        self._answer(200, value.encode(), etag=Gce.etag(value))


class NotGoogleHandler(BaseHTTPRequestHandler):
    """Something else on the metadata address (a proxy's page): it answers everything, without
    the Metadata-Flavor header."""

    def log_message(self, *args):
        pass

    def do_GET(self):
        body = self.server.body
        self.send_response(self.server.status)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def _serve(handler, **attributes):
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    for name, value in attributes.items():
        setattr(server, name, value)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


@pytest.fixture
def imds():
    server, url = _serve(ImdsHandler, imds=Imds())
    server.imds.url = url
    yield server.imds
    server.imds.released.set()
    server.shutdown()
    server.server_close()


@pytest.fixture
def gce():
    server, url = _serve(GceHandler, gce=Gce())
    server.gce.url = url
    yield server.gce
    with server.gce.changed:  # end held long polls
        server.gce.values["instance/preempted"] += " "
        server.gce.changed.notify_all()
    server.shutdown()
    server.server_close()


@pytest.fixture
def closed_port_url():
    # A port the OS gave us and we let go of: nothing listens there, so connections are refused.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def _wait_until(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


# --- AWS IMDSv2 -------------------------------------------------------------------------


def test_imds_nothing_scheduled(imds):
    assert Imdsv2NoticeSource(imds.url).check() is None
    assert imds.token_ttls == ["21600"]


def test_imds_instance_action_is_parsed(imds):
    source = Imdsv2NoticeSource(imds.url)
    imds.instance_action = {"action": "terminate", "time": TERMINATE_ISO}
    before = time.time()
    notice = source.check()
    assert notice == Notice(source="aws", action="terminate", seen_at=notice.seen_at, terminate_at=TERMINATE_UNIX)
    assert before <= notice.seen_at <= time.time()


def test_imds_stop_and_hibernate_actions(imds):
    source = Imdsv2NoticeSource(imds.url)
    for action in ("stop", "hibernate"):
        imds.instance_action = {"action": action, "time": TERMINATE_ISO}
        assert source.check().action == action


def test_imds_token_is_reused_then_refreshed_after_401(imds):
    source = Imdsv2NoticeSource(imds.url)
    for _ in range(4):
        assert source.check() is None
    assert imds.tokens_issued == 1

    imds.rotate_token()  # the service restarted: the cached token is refused from now on
    imds.instance_action = {"action": "terminate", "time": TERMINATE_ISO}
    assert source.check().action == "terminate"
    assert imds.unauthorized == 1
    assert imds.tokens_issued == 2
    assert source.check().action == "terminate"
    assert imds.tokens_issued == 2


def test_imds_token_is_refreshed_before_it_expires(imds, monkeypatch):
    # A margin longer than the token's life makes every cached token count as nearly expired.
    monkeypatch.setattr(notice_aws, "IMDS_TOKEN_REFRESH_MARGIN_SECONDS", notice_aws.IMDS_TOKEN_TTL_SECONDS + 1)
    source = Imdsv2NoticeSource(imds.url)
    source.check()
    source.check()
    # prepare()'s token, then one per GET (each check makes two), each asked for afresh
    assert imds.tokens_issued == 1 + 4
    assert imds.unauthorized == 0


def test_imds_rebalance_only(imds):
    imds.rebalance = True
    notice = Imdsv2NoticeSource(imds.url).check()
    assert (notice.source, notice.action, notice.terminate_at) == ("aws", "rebalance", None)


def test_imds_instance_action_wins_over_rebalance(imds):
    imds.rebalance = True
    imds.instance_action = {"action": "stop", "time": TERMINATE_ISO}
    notice = Imdsv2NoticeSource(imds.url).check()
    assert (notice.action, notice.terminate_at) == ("stop", TERMINATE_UNIX)


def test_imds_instance_action_without_a_readable_time_is_still_a_notice(imds, caplog):
    caplog.set_level(logging.INFO, logger="transientvod.spot")
    imds.instance_action = {"action": "terminate", "time": "soon"}
    notice = Imdsv2NoticeSource(imds.url).check()
    assert (notice.action, notice.terminate_at) == ("terminate", None)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "'soon', which is not an ISO 8601 time" in warnings[0]
    assert warnings[0].count(". ") == 0


@pytest.mark.parametrize("body", [b"<html>not json</html>", b'{"time": "2017-09-18T08:22:00Z"}',
                                  b'{"action": "explode", "time": "2017-09-18T08:22:00Z"}'])
def test_imds_instance_action_not_understood(imds, body):
    imds.instance_action_body = body
    with pytest.raises(NoticeSourceError, match="instance-action"):
        Imdsv2NoticeSource(imds.url).check()


def test_imds_unreachable(closed_port_url):
    with pytest.raises(NoticeSourceError, match="cannot be reached"):
        Imdsv2NoticeSource(closed_port_url, timeout=0.5).check()


# --- AWS: hibernation, the hop limit, bad answers ----------------------------------------


def test_imds_hibernate_gives_no_time_to_spend(imds):
    # The instance-action's time is two minutes on, but hibernation begins with the notice.
    soon = datetime.fromtimestamp(time.time() + 120, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    imds.instance_action = {"action": "hibernate", "time": soon}
    notice = Imdsv2NoticeSource(imds.url).check()
    assert (notice.action, notice.terminate_at) == ("hibernate", notice.seen_at)
    imds.instance_action = {"action": "stop", "time": soon}
    assert Imdsv2NoticeSource(imds.url).check().terminate_at > time.time() + 100


def test_imds_token_reply_lost_to_the_hop_limit_falls_back_to_imdsv1(imds, caplog):
    caplog.set_level(logging.INFO, logger="transientvod.spot")
    imds.token_reply_dropped = True
    imds.imdsv1_allowed = True
    source = Imdsv2NoticeSource(imds.url, timeout=0.3)
    assert source.check() is None
    assert source.protocol == "v1"
    imds.instance_action = {"action": "terminate", "time": TERMINATE_ISO}
    assert source.check().terminate_at == TERMINATE_UNIX
    assert imds.token_puts == 1, "each poll waited for a token that cannot arrive"
    assert imds.unauthorized == 0
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert len(infos) == 1 and "reading notices with IMDSv1 instead" in infos[0]


def test_imds_that_requires_tokens_again_is_read_with_one(imds):
    imds.token_reply_dropped = True
    imds.imdsv1_allowed = True
    source = Imdsv2NoticeSource(imds.url, timeout=0.3)
    assert source.check() is None and source.protocol == "v1"
    # The container moved (or the hop limit was raised) and IMDSv1 was switched off.
    imds.token_reply_dropped, imds.imdsv1_allowed = False, False
    imds.instance_action = {"action": "stop", "time": TERMINATE_ISO}
    assert source.check().action == "stop"
    assert source.protocol == "v2"


def test_imds_neither_token_nor_imdsv1_is_said_at_start_up(imds, caplog):
    caplog.set_level(logging.INFO, logger="transientvod.spot")
    imds.token_reply_dropped = True
    source = Imdsv2NoticeSource(imds.url, timeout=0.3)
    watcher = NoticeWatcher(source, poll_seconds=30)
    watcher.start()
    try:
        # Said by the time start() returns; the thread's first poll cannot have failed yet
        # (its token PUT waits out the same 0.3 s).
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1, warnings
        assert "--http-put-response-hop-limit 2" in warnings[0]
        assert "refuses IMDSv1 (HTTP 401)" in warnings[0]
        sentence = warnings[0].split(": ", 1)[1]
        assert sentence.count(". ") == 0 and sentence.endswith(".")
    finally:
        watcher.stop()
    assert not watcher.event.is_set()


@pytest.mark.parametrize("status", [500, 503])
def test_imds_server_error_is_one_sentence(imds, status):
    imds.instance_action_status = status
    imds.instance_action_body = b"<html><body>Internal Server Error</body></html>"
    with pytest.raises(NoticeSourceError) as raised:
        Imdsv2NoticeSource(imds.url).check()
    assert f"answered HTTP {status}, neither a notice (200) nor none (404)." in str(raised.value)


# --- GCE --------------------------------------------------------------------------------


def test_gce_not_preempted_then_preempted(gce):
    source = GceNoticeSource(gce.url, long_poll_seconds=1)
    assert source.check() is None
    gce.set("instance/preempted", "TRUE")
    notice = source.check()
    assert (notice.source, notice.action) == ("gce", "preempted")
    assert notice.terminate_at == pytest.approx(notice.seen_at + 30)


def test_gce_long_poll_hears_a_preemption_as_it_is_set(gce):
    source = GceNoticeSource(gce.url, long_poll_seconds=5)
    assert source.check() is None  # the value now, and its ETag
    timer = threading.Timer(0.4, gce.set, ("instance/preempted", "TRUE"))
    started = time.monotonic()
    timer.start()
    notice = source.check()
    waited = time.monotonic() - started
    assert notice is not None and notice.action == "preempted"
    assert 0.3 < waited < 1.5, waited  # held by the server until the change, answered at it
    held = [r for r in gce.requests if "wait_for_change=true" in r]
    assert held and "timeout_sec=5" in held[0] and f"last_etag={Gce.etag('FALSE')}" in held[0]


def test_gce_long_poll_without_a_change_returns_nothing_after_its_timeout(gce):
    source = GceNoticeSource(gce.url, long_poll_seconds=1)
    source.check()
    started = time.monotonic()
    assert source.check() is None
    assert 0.8 < time.monotonic() - started < 2.0


def test_gce_change_between_two_polls_is_not_missed(gce):
    source = GceNoticeSource(gce.url, long_poll_seconds=5)
    assert source.check() is None
    gce.set("instance/preempted", "TRUE")  # while no request is held
    started = time.monotonic()
    assert source.check().action == "preempted"
    assert time.monotonic() - started < 1.0  # the old ETag made the server answer at once


def test_gce_watcher_does_not_sleep_between_long_polls(gce):
    watcher = NoticeWatcher(GceNoticeSource(gce.url, long_poll_seconds=5), poll_seconds=30).start()
    try:
        assert _wait_until(lambda: any("wait_for_change" in r for r in gce.requests), 2)
        gce.set("instance/preempted", "TRUE")
        assert watcher.event.wait(1.0), "the preemption was not heard within a second"
        assert watcher.notice.action == "preempted"
    finally:
        watcher.stop()


def test_gce_watcher_stop_does_not_wait_out_a_long_poll(gce):
    watcher = NoticeWatcher(GceNoticeSource(gce.url, long_poll_seconds=10), poll_seconds=5).start()
    assert _wait_until(lambda: any("wait_for_change" in r for r in gce.requests), 2)
    started = time.monotonic()
    watcher.stop()
    assert time.monotonic() - started < 1.5


def test_gce_server_that_does_not_hold_requests_is_polled_not_spun_on(gce):
    gce.holds_requests = False
    source = GceNoticeSource(gce.url, long_poll_seconds=5)
    watcher = NoticeWatcher(source, poll_seconds=0.2).start()
    try:
        assert _wait_until(lambda: not source.waits, 2), "the watcher never noticed"
        count = len(gce.requests)
        time.sleep(0.5)
        # polling every 0.2 s: a few requests (two each), not hundreds
        assert len(gce.requests) - count <= 10, len(gce.requests) - count
        gce.set("instance/preempted", "TRUE")
        assert watcher.event.wait(1.0)
    finally:
        watcher.stop()


def test_gce_terminate_on_host_maintenance_is_a_notice_and_migration_is_not(gce):
    source = GceNoticeSource(gce.url, long_poll_seconds=1)
    gce.set("instance/maintenance-event", "MIGRATE_ON_HOST_MAINTENANCE")
    assert source.check() is None
    gce.set("instance/maintenance-event", "TERMINATE_ON_HOST_MAINTENANCE")
    notice = source.check()
    assert (notice.source, notice.action) == ("gce", "maintenance")
    assert notice.terminate_at == pytest.approx(notice.seen_at + 60)


class ComputeInstanceHandler(BaseHTTPRequestHandler):
    """Compute Engine's instances.get for one instance, as the API reference shapes it; it
    answers only the bearer token the metadata server handed out."""

    def log_message(self, *args):
        pass

    def do_GET(self):
        compute = self.server.compute
        compute["requests"].append((self.path, self.headers.get("Authorization")))
        if self.path != "/compute/v1/projects/tvd-study/zones/us-east1-c/instances/worker-3":
            status, answer = 404, {"error": {"code": 404, "message": "The resource was not found"}}
        elif self.headers.get("Authorization") != f"Bearer {compute['token']}":
            status, answer = 401, {"error": {"code": 401, "message": "Request had invalid authentication credentials."}}
        elif compute["status"] != 200:
            status = compute["status"]
            answer = {"error": {"code": status, "message": "Insufficient Permission"}}
        else:
            status, answer = 200, {"kind": "compute#instance", "name": "worker-3", "status": "RUNNING",
                                   "scheduling": compute["scheduling"]}
        body = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=UTF-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def compute():
    token = "ya29.token-of-the-vms-service-account"
    server, url = _serve(ComputeInstanceHandler, compute={
        "token": token, "status": 200, "requests": [],
        "scheduling": {"provisioningModel": "SPOT", "preemptionNoticeDuration": {"seconds": "120", "nanos": 0}}})
    server.compute["url"] = url
    yield server.compute
    server.shutdown()
    server.server_close()


def _with_service_account(gce, token):
    gce.set("instance/service-accounts/default/token",
            json.dumps({"access_token": token, "expires_in": 3599, "token_type": "Bearer"}))


def test_gce_notice_length_is_the_instances_preemption_notice_duration(gce, compute):
    _with_service_account(gce, compute["token"])
    gce.set("instance/preempted", "TRUE")
    notice = GceNoticeSource(gce.url, compute_url=compute["url"]).check()
    assert notice.terminate_at == pytest.approx(notice.seen_at + 120)
    # The instance named by the metadata server, read with the token it handed out.
    assert compute["requests"] == [("/compute/v1/projects/tvd-study/zones/us-east1-c/instances/worker-3",
                                    f"Bearer {compute['token']}")]

    compute["scheduling"] = {"provisioningModel": "SPOT"}  # unset: GCE's 30 s
    notice = GceNoticeSource(gce.url, compute_url=compute["url"]).check()
    assert notice.terminate_at == pytest.approx(notice.seen_at + 30)


def test_gce_notice_length_unreadable_is_gces_default_said_once(gce, compute, caplog):
    caplog.set_level(logging.WARNING, logger="transientvod.spot.notices.gce")
    _with_service_account(gce, compute["token"])
    compute["status"] = 403  # a service account without the compute scope
    gce.set("instance/preempted", "TRUE")
    source = GceNoticeSource(gce.url, long_poll_seconds=1, compute_url=compute["url"])
    notice = source.check()
    assert notice.terminate_at == pytest.approx(notice.seen_at + 30)
    source.check()  # prepared already: no second read, no second warning
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["The preemption notice length is taken as GCE's default 30 s: the Compute API answered "
                        "instances.get for worker-3 with HTTP 403; give the VM's service account the "
                        "compute.readonly scope and the permission compute.instances.get."]

    caplog.clear()
    gce.values.pop("instance/service-accounts/default/token")  # no service account at all
    GceNoticeSource(gce.url, compute_url=compute["url"]).prepare()
    assert len(compute["requests"]) == 1  # only the first source's call
    assert [r.getMessage() for r in caplog.records] == [
        "The preemption notice length is taken as GCE's default 30 s: this VM has no service account to read its "
        "own instance from the Compute API; give it one with the compute.readonly scope to read "
        "scheduling.preemptionNoticeDuration."]


def test_gce_answer_without_metadata_flavor_is_not_a_notice():
    # A server that says TRUE to everything, but is not Google's: no notice, one sentence.
    server, url = _serve(NotGoogleHandler, status=200, body=b"TRUE")
    try:
        with pytest.raises(NoticeSourceError) as raised:
            GceNoticeSource(url).check()
        message = str(raised.value)
        assert "without the header Metadata-Flavor: Google" in message
        assert message.count(". ") == 0 and message.endswith(".")
        server.body = b"<html><body>Welcome to the proxy</body></html>"
        with pytest.raises(NoticeSourceError, match="Metadata-Flavor: Google"):
            GceNoticeSource(url).check()
    finally:
        server.shutdown()
        server.server_close()


def test_gce_server_error_is_one_sentence(gce):
    gce.status_override = 500
    with pytest.raises(NoticeSourceError) as raised:
        GceNoticeSource(gce.url).check()
    assert "answered HTTP 500, a failure on its side" in str(raised.value)
    assert str(raised.value).count(". ") == 0


def test_gce_refusal_is_a_source_error(gce):
    # Someone else's path on that address: the server's own 404 page.
    source = GceNoticeSource(gce.url + "/elsewhere")
    with pytest.raises(NoticeSourceError, match="HTTP 404"):
        source.check()


def test_gce_long_poll_must_be_whole_seconds():
    with pytest.raises(ValueError, match="at least 1"):
        GceNoticeSource("http://127.0.0.1:9", long_poll_seconds=0.5)


# --- host-state file ---------------------------------------------------------------------


def _hosts(path, *hosts):
    write_host_state(path, HostState(provider="trace", written_at=time.time(), hosts=list(hosts)))


def test_hoststate_usable_noticed_gone(tmp_path):
    path = tmp_path / "hosts.json"
    _hosts(path, HostStatus("worker-a", 2), HostStatus("worker-b", 1))
    source = HostStateNoticeSource(path, host_name="worker-a")
    assert source.check() is None

    _hosts(path, HostStatus("worker-a", 2, state=NOTICED, notice_at=100.0, terminate_at=220.0),
           HostStatus("worker-b", 1))
    notice = source.check()
    assert (notice.source, notice.action, notice.terminate_at) == ("hoststate", "revoked", 220.0)

    _hosts(path, HostStatus("worker-a", 2, state=GONE), HostStatus("worker-b", 1))
    assert source.check().action == "revoked"
    assert HostStateNoticeSource(path, host_name="worker-b").check() is None
    assert HostStateNoticeSource(path, host_name="not-in-the-file").check() is None


def test_hoststate_host_name_from_horovod(tmp_path, monkeypatch):
    path = tmp_path / "hosts.json"
    _hosts(path, HostStatus("127.0.0.1", 1, state=NOTICED))
    monkeypatch.setenv("HOROVOD_HOSTNAME", "127.0.0.1")
    assert HostStateNoticeSource(path).host_name == "127.0.0.1"
    assert HostStateNoticeSource(path).check().action == "revoked"


def test_hoststate_missing_or_broken_file(tmp_path):
    with pytest.raises(NoticeSourceError, match="does not exist"):
        HostStateNoticeSource(tmp_path / "absent.json", host_name="a").check()
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(NoticeSourceError, match="not valid JSON"):
        HostStateNoticeSource(broken, host_name="a").check()


# --- the watcher -------------------------------------------------------------------------


def test_watcher_sees_notice_and_stops_polling(imds, caplog):
    caplog.set_level(logging.INFO, logger="transientvod.spot")
    watcher = NoticeWatcher(Imdsv2NoticeSource(imds.url), poll_seconds=0.1).start()
    try:
        assert _wait_until(lambda: imds.gets >= 4, 2), "the watcher is not polling"
        assert not watcher.event.is_set() and watcher.notice is None

        imds.instance_action = {"action": "terminate", "time": TERMINATE_ISO}
        assert watcher.event.wait(2), "no notice within 2 s"
        notice = watcher.notice
        assert (notice.source, notice.action, notice.terminate_at) == ("aws", "terminate", TERMINATE_UNIX)

        gets = imds.gets
        time.sleep(0.5)
        assert imds.gets == gets, "the watcher kept polling after the notice"
        assert watcher.event.is_set() and watcher.notice is notice
    finally:
        watcher.stop()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    # 2017 is long past: the time is shown, and that it has passed
    assert warnings[0].startswith("interruption notice from aws: terminate, server goes at 2017-09-18 08:22:00 UTC "
                                  "(already ")
    assert warnings[0].endswith(" s past)")


def test_watcher_unreachable_endpoint_warns_once(closed_port_url, caplog):
    caplog.set_level(logging.INFO, logger="transientvod.spot")
    source = Imdsv2NoticeSource(closed_port_url, timeout=0.5)
    checks = []
    original = source.check
    source.check = lambda: checks.append(1) or original()
    watcher = NoticeWatcher(source, poll_seconds=0.1).start()
    try:
        assert _wait_until(lambda: len(checks) >= 5, 3)
        assert watcher._thread.is_alive()
        assert not watcher.event.is_set() and watcher.notice is None
    finally:
        watcher.stop()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert "cannot read interruption notices from aws" in warnings[0].getMessage()


def test_watcher_says_when_the_endpoint_recovers(imds, caplog):
    caplog.set_level(logging.INFO, logger="transientvod.spot")
    source = Imdsv2NoticeSource(imds.url)
    real_url = source.base_url
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        source.base_url = f"http://127.0.0.1:{s.getsockname()[1]}"
    watcher = NoticeWatcher(source, poll_seconds=0.1).start()
    try:
        assert _wait_until(lambda: any(r.levelno == logging.WARNING for r in caplog.records), 2)
        source.base_url = real_url
        assert _wait_until(lambda: any(r.levelno == logging.INFO for r in caplog.records), 2)
        assert not watcher.event.is_set()
    finally:
        watcher.stop()
    assert [r.levelno for r in caplog.records] == [logging.WARNING, logging.INFO]


def test_watcher_survives_a_source_that_raises_anything(caplog):
    class Flaky(NoticeSource):
        name = "flaky"
        calls = 0

        def check(self):
            self.calls += 1
            if self.calls < 3:
                raise KeyError("surprise")
            return Notice(source="flaky", action="revoked", seen_at=time.time(), terminate_at=None)

    caplog.set_level(logging.INFO, logger="transientvod.spot")
    watcher = NoticeWatcher(Flaky(), poll_seconds=0.05).start()
    try:
        assert watcher.event.wait(2)
    finally:
        watcher.stop()
    messages = [r.getMessage() for r in caplog.records]
    assert messages[-1] == "interruption notice from flaky: revoked, server goes at unknown"
    assert sum("cannot read interruption notices from flaky" in m for m in messages) == 1


def test_watcher_stop_returns_quickly(imds):
    watcher = NoticeWatcher(Imdsv2NoticeSource(imds.url), poll_seconds=30).start()
    assert _wait_until(lambda: imds.gets >= 1, 2)
    started = time.monotonic()
    watcher.stop()
    assert time.monotonic() - started < 1.0
    assert not watcher._thread.is_alive()


def test_watcher_rejects_a_bad_interval():
    with pytest.raises(ValueError, match="positive"):
        NoticeWatcher(HostStateNoticeSource("unused", host_name="a"), poll_seconds=0)


# --- choosing a source ---------------------------------------------------------------------


def test_notice_source_kinds(tmp_path):
    assert notice_source("none") is None
    aws = notice_source("aws")
    assert isinstance(aws, Imdsv2NoticeSource) and aws.base_url == "http://169.254.169.254"
    assert notice_source("aws", url="http://127.0.0.1:9/").base_url == "http://127.0.0.1:9"
    gce = notice_source("gce")
    assert isinstance(gce, GceNoticeSource) and gce.base_url == "http://metadata.google.internal"
    hoststate = notice_source("hoststate", state_file=tmp_path / "hosts.json", host_name="a")
    assert isinstance(hoststate, HostStateNoticeSource) and hoststate.host_name == "a"
    with pytest.raises(ValueError, match="needs state_file"):
        notice_source("hoststate")


def test_notice_source_unknown_kind():
    with pytest.raises(ValueError, match="not one of none, aws, gce, hoststate") as info:
        notice_source("azure")
    assert str(info.value).count(".") == 1  # one sentence


def test_import_pulls_in_neither_torch_nor_horovod():
    assert heavy_modules_imported("transientvod.spot.notices.watcher") == []
