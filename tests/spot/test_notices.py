"""Interruption notices against real HTTP servers on loopback that play the cloud's
metadata endpoints (the one thing that cannot exist on this machine), and a real host-state
file."""
from __future__ import annotations

import json
import logging
import socket
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from transientvod.spot import notices
from transientvod.spot.hosts import GONE, NOTICED, HostState, HostStatus, write_host_state
from transientvod.spot.notices import (
    GceNoticeSource,
    HostStateNoticeSource,
    Imdsv2NoticeSource,
    Notice,
    NoticeSourceError,
    NoticeWatcher,
    notice_source,
)

REPO = Path(__file__).resolve().parents[2]
TERMINATE_ISO = "2017-09-18T08:22:00Z"
TERMINATE_UNIX = datetime(2017, 9, 18, 8, 22, tzinfo=timezone.utc).timestamp()


class Imds:
    """What the EC2 instance-metadata service knows; tests flip its flags."""

    def __init__(self):
        self.lock = threading.Lock()
        self.token = "token-1"
        self.tokens_issued = 0
        self.token_ttls: list[str] = []
        self.gets = 0
        self.unauthorized = 0
        self.instance_action: dict | None = None  # None: 404
        self.instance_action_body: bytes | None = None  # overrides the JSON when set
        self.rebalance = False

    def rotate_token(self):
        with self.lock:
            self.token = f"token-{self.tokens_issued + 1}"


class ImdsHandler(BaseHTTPRequestHandler):
    def log_message(self, *args):  # keep pytest output clean
        pass

    def _answer(self, status: int, body: bytes = b""):
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_PUT(self):
        imds: Imds = self.server.imds
        if self.path != "/latest/api/token" or "X-aws-ec2-metadata-token-ttl-seconds" not in self.headers:
            return self._answer(400)
        with imds.lock:
            imds.tokens_issued += 1
            imds.token_ttls.append(self.headers["X-aws-ec2-metadata-token-ttl-seconds"])
            token = imds.token
        self._answer(200, token.encode())

    def do_GET(self):
        imds: Imds = self.server.imds
        with imds.lock:
            imds.gets += 1
            if self.headers.get("X-aws-ec2-metadata-token") != imds.token:
                imds.unauthorized += 1
                return self._answer(401)
            if self.path == "/latest/meta-data/spot/instance-action":
                if imds.instance_action_body is not None:
                    return self._answer(200, imds.instance_action_body)
                if imds.instance_action is None:
                    return self._answer(404)
                return self._answer(200, json.dumps(imds.instance_action).encode())
            if self.path == "/latest/meta-data/events/recommendations/rebalance":
                if not imds.rebalance:
                    return self._answer(404)
                return self._answer(200, json.dumps({"noticeTime": TERMINATE_ISO}).encode())
        self._answer(404)


class GceHandler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_GET(self):
        if self.headers.get("Metadata-Flavor") != "Google":
            status, body = 403, b"Missing Metadata-Flavor:Google header."
        elif self.path == "/computeMetadata/v1/instance/preempted":
            status, body = 200, (b"TRUE" if self.server.preempted else b"FALSE")
        else:
            status, body = 404, b""
        self.send_response(status)
        self.send_header("Metadata-Flavor", "Google")
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
    server.shutdown()
    server.server_close()


@pytest.fixture
def gce():
    server, url = _serve(GceHandler, preempted=False)
    server.url = url
    yield server
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
    monkeypatch.setattr(notices, "IMDS_TOKEN_REFRESH_MARGIN_SECONDS", notices.IMDS_TOKEN_TTL_SECONDS + 1)
    source = Imdsv2NoticeSource(imds.url)
    source.check()
    source.check()
    assert imds.tokens_issued == 4  # each check makes two GETs, and each asked for a fresh token
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


def test_imds_instance_action_without_a_readable_time_is_still_a_notice(imds):
    imds.instance_action = {"action": "terminate", "time": "soon"}
    notice = Imdsv2NoticeSource(imds.url).check()
    assert (notice.action, notice.terminate_at) == ("terminate", None)


@pytest.mark.parametrize("body", [b"<html>not json</html>", b'{"time": "2017-09-18T08:22:00Z"}',
                                  b'{"action": "explode", "time": "2017-09-18T08:22:00Z"}'])
def test_imds_instance_action_not_understood(imds, body):
    imds.instance_action_body = body
    with pytest.raises(NoticeSourceError, match="instance-action"):
        Imdsv2NoticeSource(imds.url).check()


def test_imds_unreachable(closed_port_url):
    with pytest.raises(NoticeSourceError, match="cannot be reached"):
        Imdsv2NoticeSource(closed_port_url, timeout=0.5).check()


# --- GCE --------------------------------------------------------------------------------


def test_gce_not_preempted_then_preempted(gce):
    source = GceNoticeSource(gce.url)
    assert source.check() is None
    gce.preempted = True
    notice = source.check()
    assert (notice.source, notice.action) == ("gce", "preempted")
    assert notice.terminate_at == pytest.approx(notice.seen_at + 30)


def test_gce_refusal_is_a_source_error(gce):
    # Someone else's server on that address (here: a path the stand-in does not know).
    source = GceNoticeSource(gce.url + "/elsewhere")
    with pytest.raises(NoticeSourceError, match="HTTP 404"):
        source.check()


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
    caplog.set_level(logging.INFO, logger="transientvod.spot.notices")
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
    assert warnings[0].startswith("interruption notice from aws: terminate, server goes at 2017-09-18 08:22:00 UTC")


def test_watcher_unreachable_endpoint_warns_once(closed_port_url, caplog):
    caplog.set_level(logging.INFO, logger="transientvod.spot.notices")
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
    caplog.set_level(logging.INFO, logger="transientvod.spot.notices")
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
    class Flaky(notices.NoticeSource):
        name = "flaky"
        calls = 0

        def check(self):
            self.calls += 1
            if self.calls < 3:
                raise KeyError("surprise")
            return Notice(source="flaky", action="revoked", seen_at=time.time(), terminate_at=None)

    caplog.set_level(logging.INFO, logger="transientvod.spot.notices")
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
    probe = ("import sys, transientvod.spot.notices; "
             "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'horovod')))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
