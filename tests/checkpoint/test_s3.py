"""S3 checkpoints through boto3 against a real HTTP server: moto's S3 on 127.0.0.1, and for
the failures a real server cannot be asked to produce (throttling, denied access), a small
proxy on 127.0.0.1 in front of it that answers some requests itself. The rules both stores
keep (pruning, the corrupt-skip loop, the `latest` pointer) are in test_store_contract.py."""
from __future__ import annotations

import hashlib
import http.client
import http.server
import json
import logging
import subprocess
import sys
import threading
import time
import urllib.parse
from pathlib import Path

import boto3
import pytest
import torch

from conftest import free_port
from store_backends import (  # noqa: F401 (moto_endpoint is a fixture)
    BUCKET,
    CONFIG_YAML,
    assert_one_sentence,
    assert_state_equal,
    make_state,
    moto_endpoint,
)
from transientvod.checkpoint import CheckpointError, LocalCheckpointStore, open_store
from transientvod.checkpoint import s3 as s3_store
from transientvod.checkpoint.s3 import S3CheckpointStore

MIB = 2**20


class ErrorInjectingProxy:
    """Forwards requests to the moto server, except that it answers the next few (of one HTTP
    method, or any) itself with an S3 error, the way S3 answers when it throttles or denies."""

    def __init__(self, upstream_port: int):
        self.upstream_port = upstream_port
        self.seen: list[tuple[str, str, int]] = []  # (method, path, status) of every request
        self._injected: list[tuple[int, str, str | None]] = []
        self._lock = threading.Lock()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as botocore expects

            def handle_one(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with proxy._lock:
                    injected = next((e for e in proxy._injected if e[2] in (None, self.command)), None)
                    if injected is not None:
                        proxy._injected.remove(injected)
                if injected is not None:
                    status, code, _ = injected
                    payload = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
                               f"<Message>injected by the test proxy</Message></Error>").encode()
                    headers = {"Content-Type": "application/xml"}
                else:
                    upstream = http.client.HTTPConnection("127.0.0.1", proxy.upstream_port, timeout=30)
                    forwarded = {k: v for k, v in self.headers.items() if k.lower() not in ("expect", "connection")}
                    upstream.request(self.command, self.path, body=body, headers=forwarded)
                    answer = upstream.getresponse()
                    status, payload = answer.status, answer.read()
                    headers = {k: v for k, v in answer.getheaders()
                               if k.lower() not in ("content-length", "transfer-encoding", "connection")}
                    if self.command == "HEAD":  # the size of the object, not of this (empty) body
                        headers["Content-Length"] = answer.getheader("Content-Length", "0")
                    upstream.close()
                proxy.seen.append((self.command, urllib.parse.urlsplit(self.path).path, status))
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                if "Content-Length" not in headers:
                    self.send_header("Content-Length", str(len(payload) if self.command != "HEAD" else 0))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(payload)

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = handle_one

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def answer_next(self, times: int, status: int, code: str, method: str | None = None) -> None:
        with self._lock:
            self._injected.extend([(status, code, method)] * times)

    def reset(self) -> None:
        with self._lock:
            self._injected.clear()
            self.seen.clear()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def s3(moto_endpoint):
    """A plain boto3 client on the moto server, for looking at (and damaging) the objects."""
    return boto3.session.Session().client("s3", endpoint_url=moto_endpoint)


@pytest.fixture
def uri(request):
    """An s3:// prefix of this test's own in the shared bucket."""
    return f"s3://{BUCKET}/{request.node.name.replace('[', '-').rstrip(']')}"


@pytest.fixture(scope="module")
def module_proxy(moto_endpoint):
    proxy = ErrorInjectingProxy(int(moto_endpoint.rsplit(":", 1)[1]))
    yield proxy
    proxy.close()


@pytest.fixture
def proxy(module_proxy):
    module_proxy.reset()
    yield module_proxy
    module_proxy.reset()


def keys_under(s3, uri: str) -> list[str]:
    prefix = uri.removeprefix(f"s3://{BUCKET}/") + "/"
    listed = s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])
    return sorted(item["Key"][len(prefix):] for item in listed)


def body(s3, key: str) -> bytes:
    return s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()


# -- the layout and large states ----------------------------------------------------------------

def test_objects_are_the_local_layout_byte_for_byte(moto_endpoint, s3, uri, tmp_path):
    store = S3CheckpointStore(uri, endpoint_url=moto_endpoint)
    state = make_state(200)
    location = store.save(200, state, CONFIG_YAML)

    assert store.location == uri
    assert location == f"{uri}/step-000000200"
    key = location.removeprefix(f"s3://{BUCKET}/")
    manifest = json.loads(body(s3, f"{key}/manifest.json"))
    assert manifest["files"]["state.pt"]["sha256"] == hashlib.sha256(body(s3, f"{key}/state.pt")).hexdigest()

    # The same bytes as the local store: copied into a directory, the local store reads them.
    for name in keys_under(s3, uri):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(body(s3, f"{key.rsplit('/', 1)[0]}/{name}"))
    assert_state_equal(LocalCheckpointStore(tmp_path).load_latest().state, state)


def test_large_state_goes_as_a_multipart_upload_and_loads_back_intact(moto_endpoint, s3, uri):
    # 5 MiB is the smallest part S3 accepts.
    store = S3CheckpointStore(uri, endpoint_url=moto_endpoint, multipart_threshold=5 * MIB,
                              multipart_chunksize=5 * MIB)
    calls = {"CreateMultipartUpload": 0, "UploadPart": 0}
    for operation in calls:
        store.client.meta.events.register(
            f"before-call.s3.{operation}", lambda operation=operation, **_: calls.__setitem__(operation, calls[operation] + 1))
    state = {"weights": torch.randn(3 * MIB, generator=torch.Generator().manual_seed(0)), "step": 100}  # 12 MiB

    location = store.save(100, state, CONFIG_YAML)

    assert calls == {"CreateMultipartUpload": 1, "UploadPart": 3}  # only state.pt is that large
    etag = s3.head_object(Bucket=BUCKET, Key=location.removeprefix(f"s3://{BUCKET}/") + "/state.pt")["ETag"]
    assert etag.strip('"').endswith("-3")  # S3's mark of an object assembled from 3 parts
    loaded = store.load_latest()
    assert torch.equal(loaded.state["weights"], state["weights"])


# -- what dead writers leave ------------------------------------------------------------------

def test_unfinished_upload_of_a_dead_writer_is_aborted_at_the_next_save(moto_endpoint, s3, uri, monkeypatch):
    # moto dates every upload in 2010, so the test sets the age limit on either side of that.
    store = S3CheckpointStore(uri, endpoint_url=moto_endpoint)
    prefix = uri.removeprefix(f"s3://{BUCKET}/")
    s3.create_multipart_upload(Bucket=BUCKET, Key=f"{prefix}/step-000000900/state.pt")
    monkeypatch.setattr(s3_store, "STALE_UPLOAD_SECONDS", 1e10)  # no upload is this old
    store.save(100, make_state(100), CONFIG_YAML)
    assert len(s3.list_multipart_uploads(Bucket=BUCKET, Prefix=prefix).get("Uploads", [])) == 1

    monkeypatch.setattr(s3_store, "STALE_UPLOAD_SECONDS", 60.0)
    store.save(200, make_state(200), CONFIG_YAML)
    assert s3.list_multipart_uploads(Bucket=BUCKET, Prefix=prefix).get("Uploads", []) == []


# -- retries and unusable stores ----------------------------------------------------------------

def test_throttled_upload_is_retried_with_backoff(proxy, uri):
    store = S3CheckpointStore(uri, endpoint_url=proxy.endpoint)
    proxy.answer_next(2, 503, "SlowDown", method="PUT")

    store.save(100, make_state(100), CONFIG_YAML)

    puts = [entry for entry in proxy.seen if entry[0] == "PUT"]
    assert [status for _, _, status in puts[:3]] == [503, 503, 200]
    assert puts[0][1] == puts[1][1] == puts[2][1] and puts[0][1].endswith("/step-000000100/state.pt")
    assert store.load_latest().step == 100


def test_throttling_past_the_attempts_is_a_checkpoint_error(proxy, uri, monkeypatch):
    monkeypatch.setenv(s3_store.MAX_ATTEMPTS_ENV, "2")
    store = S3CheckpointStore(uri, endpoint_url=proxy.endpoint)
    proxy.answer_next(2, 503, "SlowDown", method="PUT")
    with pytest.raises(CheckpointError) as raised:
        store.save(100, make_state(100), CONFIG_YAML)
    assert [status for method, _, status in proxy.seen if method == "PUT"] == [503, 503]
    message = str(raised.value)
    assert uri in message and "SlowDown" in message and "2 attempts" in message
    assert_one_sentence(message)


def test_failed_read_is_a_checkpoint_error_saying_what_failed(proxy, uri, monkeypatch):
    monkeypatch.setenv(s3_store.MAX_ATTEMPTS_ENV, "1")
    store = S3CheckpointStore(uri, endpoint_url=proxy.endpoint)
    store.save(100, make_state(100), CONFIG_YAML)
    for call, failed in ((store.load_latest, "cannot be read"), (store.steps, "cannot be listed")):
        proxy.answer_next(1, 500, "InternalError", method="GET")
        with pytest.raises(CheckpointError) as raised:
            call()
        message = str(raised.value)
        assert message.startswith(f"checkpoint store {uri} {failed}: S3 answered InternalError (HTTP 500) after 1 attempt;")
        assert_one_sentence(message)


def test_failed_pruning_is_only_logged_and_the_next_save_prunes(proxy, s3, uri, monkeypatch, caplog):
    monkeypatch.setenv(s3_store.MAX_ATTEMPTS_ENV, "1")
    store = S3CheckpointStore(uri, keep_last=1, endpoint_url=proxy.endpoint)
    store.save(100, make_state(100), CONFIG_YAML)
    proxy.answer_next(1, 500, "InternalError", method="POST")  # the DeleteObjects of step 100
    with caplog.at_level(logging.WARNING, logger="transientvod.checkpoint"):
        assert store.save(200, make_state(200), CONFIG_YAML) == f"{uri}/step-000000200"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert warnings[0].startswith(f"old checkpoints under {uri} could not be removed (ClientError: ")
    assert "InternalError" in warnings[0] and warnings[0].endswith("; the next save tries again")
    # Its manifest went first, so step 100 is incomplete, not offered, and pruned next time.
    assert "step-000000100/state.pt" in keys_under(s3, uri)
    assert store.steps() == [200] and store.load_latest().step == 200

    store.save(300, make_state(300), CONFIG_YAML)
    assert {key.split("/")[0] for key in keys_under(s3, uri)} == {"latest", "step-000000300"}


def test_missing_bucket_is_a_checkpoint_error_naming_it(moto_endpoint):
    with pytest.raises(CheckpointError) as raised:
        S3CheckpointStore("s3://no-such-bucket/run", endpoint_url=moto_endpoint)
    assert str(raised.value) == "S3 bucket 'no-such-bucket' does not exist; create it or fix checkpoint.dir."


def test_denied_access_is_a_checkpoint_error_naming_the_bucket(proxy, uri):
    proxy.answer_next(1, 403, "AccessDenied")
    with pytest.raises(CheckpointError) as raised:
        S3CheckpointStore(uri, endpoint_url=proxy.endpoint)
    message = str(raised.value)
    assert f"'{BUCKET}'" in message and "denied" in message and uri in message
    assert_one_sentence(message)


def test_no_credentials_is_a_checkpoint_error(moto_endpoint, uri, monkeypatch, tmp_path):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                 "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "no-credentials").write_text("")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    with pytest.raises(CheckpointError) as raised:
        S3CheckpointStore(uri, endpoint_url=moto_endpoint)
    message = str(raised.value)
    assert "credentials" in message and uri in message
    assert_one_sentence(message)


def test_unreachable_endpoint_is_a_checkpoint_error(moto_endpoint, uri, monkeypatch):
    monkeypatch.setenv(s3_store.MAX_ATTEMPTS_ENV, "1")
    closed = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()
    with pytest.raises(CheckpointError) as raised:
        S3CheckpointStore(uri, endpoint_url=closed)
    assert time.monotonic() - started < 10
    message = str(raised.value)
    assert closed in message and uri in message and "cannot be reached" in message
    assert_one_sentence(message)


def test_bad_uri_and_bad_attempts_setting_are_checkpoint_errors(moto_endpoint, monkeypatch):
    with pytest.raises(CheckpointError, match="s3://bucket/prefix"):
        S3CheckpointStore("s3:///no-bucket", endpoint_url=moto_endpoint)
    monkeypatch.setenv(s3_store.MAX_ATTEMPTS_ENV, "many")
    with pytest.raises(CheckpointError, match=s3_store.MAX_ATTEMPTS_ENV):
        S3CheckpointStore(f"s3://{BUCKET}/x", endpoint_url=moto_endpoint)
    with pytest.raises(ValueError, match="keep_last"):
        S3CheckpointStore(f"s3://{BUCKET}/x", keep_last=0, endpoint_url=moto_endpoint)


# -- open_store --------------------------------------------------------------------------------

def test_open_store_gives_an_s3_store_with_the_endpoint_from_the_environment(moto_endpoint, uri, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    store = open_store(uri, keep_last=2)
    assert isinstance(store, S3CheckpointStore)
    assert (store.location, store.keep_last, store.client.meta.endpoint_url) == (uri, 2, moto_endpoint)
    store.save(100, make_state(100), CONFIG_YAML)
    assert open_store(uri + "/").load_latest().step == 100

    # The S3-only variable wins over the general one.
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", moto_endpoint)
    assert open_store(uri).steps() == [100]


def test_checkpoint_module_loads_boto3_only_when_s3_is_used():
    # Every worker imports transientvod.checkpoint; boto3 costs start-up time for none of them.
    probe = "import sys, transientvod.checkpoint; print('boto3' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.stdout.strip() == "False", done.stderr
