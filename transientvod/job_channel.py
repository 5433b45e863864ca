"""The launcher's line to its workers, for hosts that share no disk with it.

Separate VMs have no shared file system. A worker there cannot read the resolved config in the
launcher's run directory, and what rank 0 writes (`metrics.jsonl`, `events.jsonl`,
`summary.json`) would land on whichever host rank 0 was on, some of them revoked by the end.
So when a job has remote hosts, the launcher serves a small HTTP channel on the head, bound to
the head's cluster address (the one the hosts reach it by):

    GET  /config.yaml       the resolved config, as the workers are to see it
    POST /records/NAME      lines appended to NAME in the head's run directory (RECORD_NAMES)
    PUT  /summary.json      the job's summary, written whole

Every request carries the job's token (TOKEN_HEADER): anything else on the cluster network
that finds the port can neither read the config nor write into the run. The token reaches the
workers as a file of mode 0600 on each host (channel_token.py), never through horovodrun's
environment, which every worker's command line shows. The server binds a port of
cluster.head_ports (ports.py), so a firewall can be written for it.

Why a channel of our own rather than MLflow or the checkpoint store: the records must reach
the head with tracking off, and with a local checkpoint directory on a shared mount; the
channel needs neither. The worker's half is `ChannelRecord`: a thread posts the lines, so the
training loop never waits for the head.
"""
from __future__ import annotations

import errno
import http.server
import json
import logging
import os
import secrets
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

log = logging.getLogger(__name__)

# What a rank writes when the whole job must stop (the task is unusable or its code raised, the
# checkpoint to resume does not fit): the launcher prints it once and stops horovodrun.
JOB_ERRORS = "job-errors.jsonl"
LAUNCHER_ENV = "TRANSIENTVOD_LAUNCHER"  # set for the launcher's workers: it prints a task's traceback, once
RECORD_NAMES = frozenset({"metrics.jsonl", "events.jsonl", "mlflow-unsent.jsonl", JOB_ERRORS})
SUMMARY_NAME = "summary.json"
CONFIG_PATH = "/config.yaml"
TOKEN_HEADER = "X-Transientvod-Token"
REQUEST_TIMEOUT_SECONDS = 10
RETRY_SECONDS = 1.0
# How long a finishing worker waits for its last lines to reach the head.
FLUSH_SECONDS = float(os.environ.get("TRANSIENTVOD_CHANNEL_FLUSH_SECONDS", "20"))


class ChannelError(RuntimeError):
    """The head's channel cannot be used; one sentence."""


def is_channel_url(text: str) -> bool:
    return str(text).startswith(("http://", "https://"))


# -- the launcher's half ------------------------------------------------------------------------

class JobChannel:
    """The channel's server, on a thread of the launcher; a context manager."""

    def __init__(self, run_dir: Path, worker_config_yaml: str, address: str, ports: tuple[int, int] | None = None):
        """`ports`: (first, last), cluster.head_ports: the first free one is bound; None: any free port."""
        self.run_dir = Path(run_dir)
        self.token = secrets.token_urlsafe(24)
        self._config = worker_config_yaml.encode()
        self._lock = threading.Lock()  # one writer per file at a time: lines never interleave
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._server = self._bind(address, ports)
        self._server.daemon_threads = True
        host, port = self._server.server_address[:2]
        self.url = f"http://{host}:{port}"
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.1,), name="job-channel", daemon=True)
        self._thread.start()

    def _bind(self, address: str, ports: tuple[int, int] | None) -> http.server.ThreadingHTTPServer:
        first, last = ports or (0, 0)
        for port in range(first, last + 1):
            try:
                return http.server.ThreadingHTTPServer((address, port), self._handler_class())
            except OSError as e:
                if e.errno != errno.EADDRINUSE:
                    raise ChannelError(f"the launcher cannot serve its workers on {address} ({e.strerror}); set "
                                       "cluster.network_interface to the interface the hosts reach this machine "
                                       "by.") from None
        raise ChannelError(f"every port of cluster.head_ports [{first}, {last}] is taken on {address} (by other "
                           "jobs or programs), so the job channel has none; widen the range.")

    @property
    def config_url(self) -> str:
        return self.url + CONFIG_PATH

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> "JobChannel":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _append(self, name: str, body: bytes) -> None:
        with self._lock, open(self.run_dir / name, "ab") as f:
            f.write(body)

    def _write_summary(self, body: bytes) -> None:
        json.loads(body)  # a summary that is not JSON is refused, not written
        path = self.run_dir / SUMMARY_NAME
        temporary = path.with_suffix(".tmp")
        with self._lock:
            temporary.write_bytes(body)
            os.replace(temporary, path)

    def _handler_class(self):
        channel = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # the launcher's terminal is for the job
                pass

            def _allowed(self) -> bool:
                given = self.headers.get(TOKEN_HEADER, "")
                if secrets.compare_digest(given.encode(), channel.token.encode()):
                    return True
                self._answer(403, b"wrong or missing token\n")
                return False

            def _answer(self, code: int, body: bytes = b"") -> None:
                self.send_response(code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _body(self) -> bytes:
                return self.rfile.read(int(self.headers.get("Content-Length", "0")))

            def do_GET(self) -> None:
                if not self._allowed():
                    return
                if self.path != CONFIG_PATH:
                    return self._answer(404)
                self._answer(200, channel._config)

            def do_POST(self) -> None:
                if not self._allowed():
                    return
                name = self.path.removeprefix("/records/")
                body = self._body()
                if name not in RECORD_NAMES or not self.path.startswith("/records/"):
                    return self._answer(404)
                if body and not body.endswith(b"\n"):
                    return self._answer(400, b"records are whole lines\n")
                channel._append(name, body)
                self._answer(204)

            def do_PUT(self) -> None:
                if not self._allowed():
                    return
                if self.path != "/" + SUMMARY_NAME:
                    return self._answer(404)
                try:
                    channel._write_summary(self._body())
                except ValueError:
                    return self._answer(400, b"the summary is not JSON\n")
                self._answer(204)

        return Handler


# -- the worker's half --------------------------------------------------------------------------

def _request(url: str, token: str, method: str = "GET", body: bytes | None = None) -> bytes:
    request = urllib.request.Request(url, data=body, method=method, headers={TOKEN_HEADER: token})
    with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_SECONDS) as answer:
        return answer.read()


def fetch_config(url: str, token: str, attempts: int = 3) -> str:
    """The resolved config the launcher serves; ChannelError in one sentence if it cannot be had."""
    for attempt in range(attempts):
        try:
            return _request(url, token).decode()
        except urllib.error.HTTPError as e:
            if e.code == 403:
                raise ChannelError(f"the launcher's channel at {url} refused this worker's token; "
                                   "start workers through 'transientvod train'.") from None
            why = f"HTTP {e.code}"
        except (urllib.error.URLError, OSError) as e:
            why = str(getattr(e, "reason", e))
        if attempt + 1 < attempts:
            time.sleep(RETRY_SECONDS)
    raise ChannelError(f"this worker cannot fetch its config from the launcher at {url} ({why}); the head must be "
                       "reachable from every host (check cluster.network_interface and the hosts' firewall).")


class ChannelRecord:
    """The run's records, sent to the head through its channel by a background thread.

    `append` only queues a line. While the head does not answer, lines wait and are sent in
    order when it does. `close` waits up to FLUSH_SECONDS; lines still unsent then are written
    to this host's run directory, with a warning naming it (the head may be gone for good)."""

    def __init__(self, channel_url: str, token: str, local_dir: Path):
        self.channel_url = channel_url.rstrip("/")
        self.token = token
        self.local_dir = Path(local_dir)
        self._pending: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closing = False
        self._warned = False
        self._thread = threading.Thread(target=self._send_loop, name="record-sender", daemon=True)
        self._thread.start()

    def append(self, name: str, row: dict) -> None:
        with self._lock:
            self._pending.append((name, json.dumps(row) + "\n"))
        self._wake.set()

    def write_summary(self, text: str, timeout: float = FLUSH_SECONDS) -> None:
        """The summary goes last, after every line before it has been sent."""
        self.flush(timeout)
        try:
            _request(f"{self.channel_url}/{SUMMARY_NAME}", self.token, "PUT", text.encode())
        except (urllib.error.URLError, OSError) as e:
            self.local_dir.mkdir(parents=True, exist_ok=True)
            (self.local_dir / SUMMARY_NAME).write_text(text)
            log.warning("the launcher's channel did not take the summary (%s); it is in %s on this host",
                        getattr(e, "reason", e), self.local_dir / SUMMARY_NAME)

    def flush(self, timeout: float = FLUSH_SECONDS) -> bool:
        """Wait until every queued line has been sent; False if some are still waiting."""
        deadline = time.monotonic() + timeout
        self._wake.set()
        while self.pending() and time.monotonic() < deadline and self._thread.is_alive():
            time.sleep(0.02)
        return not self.pending()

    def pending(self) -> int:
        with self._lock:
            return len(self._pending)

    def close(self, timeout: float = FLUSH_SECONDS) -> None:
        self.flush(timeout)
        self._closing = True
        self._wake.set()
        with self._lock:
            left, self._pending = self._pending, []
        if left:
            self.local_dir.mkdir(parents=True, exist_ok=True)
            for name, line in left:
                with open(self.local_dir / name, "a") as f:
                    f.write(line)
            log.warning("the launcher's channel did not take %d record lines before this worker ended; they are "
                        "in %s on this host", len(left), self.local_dir)

    def _send_loop(self) -> None:
        while not self._closing:
            self._wake.wait(RETRY_SECONDS if self._warned else None)
            self._wake.clear()
            while self._send_some():
                pass

    def _send_some(self) -> bool:
        """Send the queued lines of the first name waiting; True if it sent any."""
        with self._lock:
            if not self._pending:
                return False
            name = self._pending[0][0]
            batch = [line for n, line in self._pending if n == name]
        try:
            _request(f"{self.channel_url}/records/{name}", self.token, "POST", "".join(batch).encode())
        except (urllib.error.URLError, OSError) as e:
            if not self._warned:
                self._warned = True
                log.warning("the launcher's channel at %s does not answer (%s); records wait on this worker",
                            self.channel_url, getattr(e, "reason", e))
            return False
        self._warned = False
        with self._lock:  # the batch was the first lines of that name; later ones may have come
            left_to_drop, kept = len(batch), []
            for item in self._pending:
                if left_to_drop and item[0] == name:
                    left_to_drop -= 1
                else:
                    kept.append(item)
            self._pending = kept
        return True


class LocalRecord:
    """The run's records as files in the run directory: a job whose hosts share the launcher's
    disk (local slots, a shared mount) or one started by hand."""

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)

    def append(self, name: str, row: dict) -> None:
        # One write() per line in append mode: lines from several local ranks don't interleave.
        with open(self.run_dir / name, "a") as f:
            f.write(json.dumps(row) + "\n")

    def write_summary(self, text: str) -> None:
        (self.run_dir / SUMMARY_NAME).write_text(text)

    def close(self, timeout: float = 0) -> None:
        pass
