"""gs:// checkpoints through google-cloud-storage against a real HTTP server: gcp-storage-emulator
(PyPI) on 127.0.0.1, and for the failures an emulator cannot be asked to produce (throttling,
denied access, bytes damaged on the wire), a small proxy on 127.0.0.1 in front of it that
answers some requests itself or damages an answer. The rules every store keeps (pruning, the
corrupt-skip loop, the `latest` pointer) are in test_store_contract.py."""
from __future__ import annotations

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

import pytest
from google.cloud import storage

from conftest import free_port
from store_backends import (  # noqa: F401 (gcs_endpoint is a fixture)
    BUCKET,
    CONFIG_YAML,
    assert_one_sentence,
    assert_state_equal,
    gcs_endpoint,
    make_state,
)
from transientvod.checkpoint import CheckpointError, LocalCheckpointStore, open_store
from transientvod.checkpoint import gs as gs_store
from transientvod.checkpoint.gs import GcsCheckpointStore

MIB = 2**20
PROJECT = "tvd-test"


class GcsProxy:
    """Forwards requests to the emulator, except that it answers the next few (of one HTTP
    method, or any) itself with a Google JSON error, as GCS answers when it throttles or denies,
    or flips a byte in the next media download while keeping GCS's x-goog-hash header."""

    def __init__(self, upstream_port: int):
        self.upstream_port = upstream_port
        self.seen: list[tuple[str, str, int]] = []  # (method, path?query, status) of every request
        self._injected: list[tuple[int, str, str | None]] = []
        self.damage_download_of = ""  # the next media download whose path ends so is damaged
        self.damage_upload_of = ""  # the next one-request upload of an object so named is damaged
        self._lock = threading.Lock()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def handle_one(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                # google-cloud-storage fetches the bucket's metadata from a thread of its own,
                # for trace attributes, at a moment of its choosing: always forwarded, so that
                # an injected answer goes to the store's own request.
                background = urllib.parse.urlsplit(self.path).path == f"/storage/v1/b/{BUCKET}"
                with proxy._lock:
                    injected = None if background else next(
                        (e for e in proxy._injected if e[2] in (None, self.command)), None)
                    if injected is not None:
                        proxy._injected.remove(injected)
                if injected is not None:
                    status, reason, _ = injected
                    payload = json.dumps({"error": {"code": status, "message": f"injected by the test proxy: {reason}",
                                                    "errors": [{"reason": reason}]}}).encode()
                    headers = {"Content-Type": "application/json; charset=UTF-8"}
                else:
                    if self.command == "POST" and "uploadType=multipart" in self.path:
                        with proxy._lock:
                            # The object's name is in the metadata part, before the bytes.
                            damage = bool(proxy.damage_upload_of) and \
                                f'"{proxy.damage_upload_of}"'.encode() in body[:4096]
                            if damage:
                                proxy.damage_upload_of = ""
                        if damage:  # a byte in the middle: the file's bytes, not the metadata
                            middle = len(body) // 2
                            body = body[:middle] + bytes([body[middle] ^ 0xFF]) + body[middle + 1:]
                    upstream = http.client.HTTPConnection("127.0.0.1", proxy.upstream_port, timeout=30)
                    forwarded = {k: v for k, v in self.headers.items() if k.lower() not in ("connection",)}
                    upstream.request(self.command, self.path, body=body, headers=forwarded)
                    answer = upstream.getresponse()
                    status, payload = answer.status, answer.read()
                    headers = {k: v for k, v in answer.getheaders()
                               if k.lower() not in ("content-length", "transfer-encoding", "connection")}
                    upstream.close()
                    path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
                    if "alt=media" in self.path and status == 200 and payload:
                        with proxy._lock:
                            damage = bool(proxy.damage_download_of) and path.endswith(proxy.damage_download_of)
                            if damage:
                                proxy.damage_download_of = ""
                        if damage:
                            payload = bytes([payload[0] ^ 0xFF]) + payload[1:]
                proxy.seen.append((self.command, self.path, status))
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_PUT = do_POST = do_DELETE = handle_one

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def answer_next(self, times: int, status: int, reason: str, method: str | None = None) -> None:
        with self._lock:
            self._injected.extend([(status, reason, method)] * times)

    def reset(self) -> None:
        with self._lock:
            self._injected.clear()
            self.seen.clear()
            self.damage_download_of = ""
            self.damage_upload_of = ""

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def bucket(gcs_endpoint):
    """A plain client's bucket on the emulator, for looking at the objects."""
    return storage.Client(project=PROJECT).bucket(BUCKET)


@pytest.fixture
def uri(request):
    """A gs:// prefix of this test's own in the shared bucket."""
    return f"gs://{BUCKET}/{request.node.name.replace('[', '-').rstrip(']')}"


@pytest.fixture(scope="module")
def module_proxy(gcs_endpoint):
    proxy = GcsProxy(int(gcs_endpoint.rsplit(":", 1)[1]))
    yield proxy
    proxy.close()


@pytest.fixture
def proxy(module_proxy, monkeypatch):
    """The proxy, as the emulator the store's client talks to."""
    module_proxy.reset()
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", module_proxy.endpoint)
    yield module_proxy
    module_proxy.reset()


def names_under(bucket, uri: str) -> list[str]:
    prefix = uri.removeprefix(f"gs://{BUCKET}/") + "/"
    return sorted(blob.name[len(prefix):] for blob in bucket.client.list_blobs(BUCKET, prefix=prefix))


# -- the layout and large states ----------------------------------------------------------------

def test_objects_are_the_local_layout_byte_for_byte_with_their_crc32c(bucket, uri, tmp_path):
    store = GcsCheckpointStore(uri, project=PROJECT)
    local = LocalCheckpointStore(tmp_path / "local")
    state = make_state(100)
    store.save(100, state, CONFIG_YAML)
    local.save(100, state, CONFIG_YAML)

    names = names_under(bucket, uri)
    assert names == ["latest", "step-000000100/config.yaml", "step-000000100/manifest.json", "step-000000100/state.pt"]
    prefix = uri.removeprefix(f"gs://{BUCKET}/")
    for name in names[1:]:
        if name.endswith("manifest.json"):  # its "created" differs; the file list must not
            gs_files = json.loads(bucket.blob(f"{prefix}/{name}").download_as_bytes())["files"]
            assert gs_files == json.loads((tmp_path / "local" / name).read_bytes())["files"]
        else:
            assert bucket.blob(f"{prefix}/{name}").download_as_bytes() == (tmp_path / "local" / name).read_bytes()
        blob = bucket.get_blob(f"{prefix}/{name}")
        assert blob.crc32c  # stored with the object, and checked by every download
    assert bucket.blob(f"{prefix}/latest").download_as_bytes() == b"step-000000100\n"


def test_large_state_goes_as_a_resumable_upload_in_chunks_and_loads_back_intact(proxy, bucket, uri, monkeypatch):
    monkeypatch.setattr(gs_store, "CHUNK_BYTES", 1 * MIB)
    store = GcsCheckpointStore(uri, project=PROJECT)
    state = make_state(100)
    state["big"] = bytes(range(256)) * (10 * MIB // 256 + 7)  # above the client's 8 MiB: resumable
    store.save(100, state, CONFIG_YAML)

    started = [path for method, path, _ in proxy.seen if method == "POST" and "uploadType=resumable" in path]
    assert len(started) == 1, proxy.seen  # state.pt only: the small files go in one request each
    chunks = [status for method, path, status in proxy.seen if method == "PUT" and "upload_id=" in path]
    size = bucket.get_blob(uri.removeprefix(f"gs://{BUCKET}/") + "/step-000000100/state.pt").size
    assert size > 10 * MIB
    assert len(chunks) == -(-size // MIB) and chunks[-1] == 200, chunks  # in 1 MiB chunks, the last one whole
    loaded = store.load_latest()
    assert loaded.state["big"] == state["big"]
    assert_state_equal(loaded.state, state)


def test_bytes_damaged_on_the_way_down_fail_the_crc32c_check_and_the_older_checkpoint_loads(proxy, uri, caplog):
    store = GcsCheckpointStore(uri, project=PROJECT)
    store.save(100, make_state(100), CONFIG_YAML)
    newest = store.save(200, make_state(200), CONFIG_YAML)
    proxy.damage_download_of = "step-000000200/state.pt"
    with caplog.at_level(logging.WARNING, logger="transientvod.checkpoint"):
        loaded = store.load_latest()
    assert proxy.damage_download_of == ""  # the damage was done
    assert loaded.step == 100
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [f"checkpoint {newest} is corrupted (state.pt does not match the checksum Cloud Storage "
                        "stored with it); skipping it"]


def test_bytes_damaged_on_the_way_up_are_refused_and_the_step_stays_without_a_manifest(proxy, bucket, uri):
    # The CRC32C goes with each upload, so the server refuses bytes that do not match it.
    store = GcsCheckpointStore(uri, project=PROJECT)
    store.save(100, make_state(100), CONFIG_YAML)
    prefix = uri.removeprefix(f"gs://{BUCKET}/")
    proxy.damage_upload_of = f"{prefix}/step-000000200/state.pt"
    with pytest.raises(CheckpointError) as raised:
        store.save(200, make_state(200), CONFIG_YAML)
    assert proxy.damage_upload_of == ""  # the damage was done
    message = str(raised.value)
    assert message.startswith(f"checkpoint store {uri} cannot be written: Cloud Storage answered HTTP 4"), message
    assert_one_sentence(message)
    assert not [name for name in names_under(bucket, uri) if name.startswith("step-000000200/")]
    assert store.steps() == [100] and store.load_latest().step == 100


def test_a_damaged_latest_pointer_is_ignored_and_the_newest_checkpoint_loads(proxy, uri, caplog):
    store = GcsCheckpointStore(uri, project=PROJECT)
    store.save(100, make_state(100), CONFIG_YAML)
    proxy.damage_download_of = "/latest"
    with caplog.at_level(logging.WARNING, logger="transientvod.checkpoint"):
        assert store.load_latest().step == 100
    assert proxy.damage_download_of == ""
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [f"{uri}/latest does not match the checksum Cloud Storage stored with it; ignoring it"]


# -- retries and unusable stores ----------------------------------------------------------------

def test_throttled_upload_is_retried_with_backoff(proxy, uri):
    store = GcsCheckpointStore(uri, project=PROJECT)
    proxy.answer_next(2, 503, "backendError", method="POST")

    store.save(100, make_state(100), CONFIG_YAML)

    posts = [(path, status) for method, path, status in proxy.seen if method == "POST"]
    assert [status for _, status in posts[:3]] == [503, 503, 200]
    assert posts[0][0] == posts[1][0] == posts[2][0] and "/upload/storage/v1/b/" in posts[0][0]
    assert store.load_latest().step == 100


def test_throttling_past_the_retry_time_is_a_checkpoint_error_and_no_manifest_is_written(proxy, bucket, uri,
                                                                                         monkeypatch):
    monkeypatch.setenv(gs_store.RETRY_SECONDS_ENV, "1.5")
    store = GcsCheckpointStore(uri, project=PROJECT)
    proxy.answer_next(100, 429, "rateLimitExceeded", method="POST")
    with pytest.raises(CheckpointError) as raised:
        store.save(100, make_state(100), CONFIG_YAML)
    message = str(raised.value)
    assert message.startswith(f"checkpoint store {uri} cannot be written after 1.5 s of retries: Cloud Storage "
                              "answered HTTP 429"), message
    assert_one_sentence(message)
    proxy.reset()
    assert names_under(bucket, uri) == [] and store.load_latest() is None


def test_failed_read_is_a_checkpoint_error_saying_what_failed(proxy, uri, monkeypatch):
    monkeypatch.setenv(gs_store.RETRY_SECONDS_ENV, "1")
    store = GcsCheckpointStore(uri, project=PROJECT)
    store.save(100, make_state(100), CONFIG_YAML)
    for call, failed in ((store.load_latest, "cannot be read"), (store.steps, "cannot be listed")):
        proxy.answer_next(100, 500, "backendError", method="GET")
        with pytest.raises(CheckpointError) as raised:
            call()
        proxy.reset()
        message = str(raised.value)
        assert message.startswith(f"checkpoint store {uri} {failed} after 1 s of retries: Cloud Storage answered "
                                  "HTTP 500"), message
        assert_one_sentence(message)


def test_failed_pruning_is_only_logged_and_the_next_save_prunes(proxy, bucket, uri, monkeypatch, caplog):
    monkeypatch.setenv(gs_store.RETRY_SECONDS_ENV, "1")
    store = GcsCheckpointStore(uri, keep_last=1, project=PROJECT)
    store.save(100, make_state(100), CONFIG_YAML)
    # Pruning deletes step 100's manifest first (answered), then its files (refused from then).
    refusing = [True]
    delete = store._delete_if_present

    def refuse_files_after_the_manifest(name):
        delete(name)
        if refusing[0] and name.endswith("step-000000100/manifest.json"):
            proxy.answer_next(100, 500, "backendError", method="DELETE")

    monkeypatch.setattr(store, "_delete_if_present", refuse_files_after_the_manifest)
    with caplog.at_level(logging.WARNING, logger="transientvod.checkpoint"):
        assert store.save(200, make_state(200), CONFIG_YAML) == f"{uri}/step-000000200"
    refusing[0] = False
    proxy.reset()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert warnings[0].startswith(f"old checkpoints under {uri} could not be removed (")
    assert warnings[0].endswith("; the next save tries again")
    # Its manifest went first, so step 100 is incomplete, not offered, and pruned next time.
    assert "step-000000100/state.pt" in names_under(bucket, uri)
    assert "step-000000100/manifest.json" not in names_under(bucket, uri)
    assert store.steps() == [200] and store.load_latest().step == 200

    store.save(300, make_state(300), CONFIG_YAML)
    assert {name.split("/")[0] for name in names_under(bucket, uri)} == {"latest", "step-000000300"}


def test_missing_bucket_is_a_checkpoint_error_naming_it(gcs_endpoint):
    with pytest.raises(CheckpointError) as raised:
        GcsCheckpointStore("gs://no-such-bucket/run", project=PROJECT)
    assert str(raised.value) == "Cloud Storage bucket 'no-such-bucket' does not exist; create it or fix checkpoint.dir."


def test_denied_access_is_a_checkpoint_error_naming_the_bucket(proxy, uri):
    proxy.answer_next(1, 403, "forbidden")
    with pytest.raises(CheckpointError) as raised:
        GcsCheckpointStore(uri, project=PROJECT)
    message = str(raised.value)
    assert f"'{BUCKET}'" in message and "denied" in message and "roles/storage.objectUser" in message
    assert_one_sentence(message)


def test_no_credentials_is_a_checkpoint_error(uri, monkeypatch, tmp_path):
    # Not the emulator: the real endpoint's path, with no credentials anywhere google-auth looks
    # (no key file, no gcloud configuration, and no GCE metadata server to ask).
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))
    monkeypatch.setenv("NO_GCE_CHECK", "True")
    with pytest.raises(CheckpointError) as raised:
        GcsCheckpointStore(uri, project=PROJECT)
    message = str(raised.value)
    assert message.startswith(f"no Google credentials were found for checkpoint store {uri};"), message
    assert_one_sentence(message)


def test_unreachable_endpoint_is_a_checkpoint_error(uri, monkeypatch):
    monkeypatch.setenv(gs_store.RETRY_SECONDS_ENV, "1")
    closed = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", closed)
    started = time.monotonic()
    with pytest.raises(CheckpointError) as raised:
        GcsCheckpointStore(uri, project=PROJECT)
    assert time.monotonic() - started < 10
    message = str(raised.value)
    assert closed in message and uri in message and "cannot be reached" in message
    assert_one_sentence(message)


@pytest.mark.parametrize("url", ["gs://", "gs:///no-bucket", "GS:///ckpt"])
def test_a_url_with_no_bucket_is_one_sentence(url):
    for make in (GcsCheckpointStore, open_store):
        with pytest.raises(CheckpointError) as raised:
            make(url)
        assert str(raised.value) == (f"checkpoint location {url} names no Cloud Storage bucket; "
                                     "write it as gs://bucket/prefix.")


def test_bad_retry_setting_and_keep_last_are_errors(gcs_endpoint, monkeypatch):
    monkeypatch.setenv(gs_store.RETRY_SECONDS_ENV, "forever")
    with pytest.raises(CheckpointError, match=gs_store.RETRY_SECONDS_ENV) as raised:
        GcsCheckpointStore(f"gs://{BUCKET}/x", project=PROJECT)
    assert_one_sentence(str(raised.value))
    monkeypatch.delenv(gs_store.RETRY_SECONDS_ENV)
    with pytest.raises(ValueError, match="keep_last"):
        GcsCheckpointStore(f"gs://{BUCKET}/x", keep_last=0, project=PROJECT)


# -- open_store --------------------------------------------------------------------------------

def test_open_store_gives_a_gcs_store_with_the_project_from_the_environment(gcs_endpoint, uri, monkeypatch):
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", PROJECT)
    store = open_store(uri, keep_last=2)
    assert isinstance(store, GcsCheckpointStore)
    assert (store.location, store.keep_last, store.client.project) == (uri, 2, PROJECT)
    store.save(100, make_state(100), CONFIG_YAML)
    assert open_store(uri + "/").load_latest().step == 100


def test_checkpoint_module_loads_google_cloud_storage_only_when_gs_is_used():
    # Every worker imports transientvod.checkpoint; the storage client costs start-up time.
    probe = "import sys, transientvod.checkpoint; print('google.cloud.storage' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.stdout.strip() == "False", done.stderr


def test_an_unsupported_scheme_names_the_ones_that_are():
    with pytest.raises(CheckpointError) as raised:
        open_store("ftp://files.example/ckpt")
    assert str(raised.value) == ("checkpoint location ftp://files.example/ckpt has scheme 'ftp://', which is not "
                                 "supported; use a local directory, a file:// URI, an s3:// URI or a gs:// URI.")
