"""The job's SQLite MLflow store, served over HTTP from the head node: `StoreServer`.

A job's default store is a SQLite file on the head (`sqlite:///<output dir>/mlflow.db`). Rank 0
may run on another host with no shared disk, where that path names nothing (and SQLite over a
network filesystem is unsafe anyway), so the head runs `mlflow server` on that file, bound to
its cluster address, and workers log to the server's URL instead.

    with StoreServer(store_uri, "10.0.0.5") as server:   # port 0: any free port
        ...  # workers get server.url, "http://10.0.0.5:PORT"

`start()` returns once the server answers /health; a server that cannot start is one
TrackingError sentence, with no process left behind. `stop()` ends the server and its uvicorn
worker (one process group) and waits for them.
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from transientvod.tracking.store import TrackingError, redacted, sqlite_path, store_uri

log = logging.getLogger(__name__)

# How long `mlflow server` may take to answer /health: 3-5 s on an idle machine, 10-20 s on a
# loaded two-core one (it imports MLflow twice: the CLI, then uvicorn's worker).
START_SECONDS = float(os.environ.get("TRANSIENTVOD_MLFLOW_START_SECONDS", "60"))
# How long a stopping server may finish its requests before it is killed.
STOP_SECONDS = 10.0
POLL_SECONDS = 0.25
# Addresses that bind every interface: no worker can use them in a URL.
WILDCARDS = ("", "0.0.0.0", "::", "[::]")
# A log line that says what went wrong: uvicorn's and MLflow's ERROR lines, a traceback's last line.
ERROR_LINE = re.compile(r"\bERROR\b|^[\w.]*(Error|Exception)\b")
LOG_TIMESTAMP = re.compile(r"^\d{4}/\d\d/\d\d \d\d:\d\d:\d\d\s+(ERROR:?\s*)?")

# /health polls go straight to the server: a head's HTTP(S)_PROXY cannot reach a cluster address.
_direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class PortTaken(TrackingError):
    """The port asked for is in use on the address."""


class StoreServer:
    """`mlflow server` for one SQLite store, listening on `address` (the head's cluster address).

    port 0 picks a free port. The server's output goes to `log_path` (default: a temporary
    file, removed by a clean `stop()`). Use it as a context manager, or `start()` and `stop()`.
    """

    def __init__(self, sqlite_uri: str, address: str, port: int = 0, log_path: Path | None = None,
                 start_seconds: float = START_SECONDS, ports: tuple[int, int] | None = None):
        """`ports`: (first, last), cluster.head_ports: the first free port of the range, in place of `port`."""
        path = sqlite_path(sqlite_uri)
        if path is None:
            raise TrackingError(f"{redacted(sqlite_uri)} is not a SQLite store; only a SQLite file needs serving "
                                "to workers, a server store they can reach themselves.")
        if address in WILDCARDS:
            raise TrackingError(f"serve the MLflow store on the head's cluster address, which workers can put in "
                                f"a URL, not on {address or 'every interface'!r}.")
        # Absolute, because the server runs in the database's directory, not the caller's.
        self.sqlite_uri = store_uri(sqlite_uri)
        self.database = sqlite_path(self.sqlite_uri)
        self.address = address
        self.port = port
        self.ports = tuple(ports) if ports else None
        self.start_seconds = start_seconds
        self._own_log = log_path is None
        self.log_path = Path(log_path) if log_path is not None else None
        self._process: subprocess.Popen | None = None
        self._log_start = 0  # where this start's output begins in a log that may hold earlier ones

    @property
    def url(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"http://{host}:{self.port}"

    def __enter__(self) -> StoreServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> StoreServer:
        if self._process is not None:
            return self
        # The launcher opens the run before it serves the store; `mlflow server` would quietly
        # create an empty store at a missing path, and every worker's log_batch would then fail.
        if not self.database.is_file():
            raise TrackingError(f"cannot serve the MLflow store {self.sqlite_uri}: {self.database} does not exist "
                                "(the launcher opens the run, which creates it, before it serves it).")
        pick_port = self.port == 0 or self.ports is not None
        # Before the log is made: a bad address or a taken port starts nothing and leaves nothing.
        self.port = self._pick_port() if pick_port else self._free_port(self.port)
        if self.log_path is None:
            handle, name = tempfile.mkstemp(prefix="mlflow-server-", suffix=".log")
            os.close(handle)
            self.log_path = Path(name)
        began = time.monotonic()
        for attempt in (1, 2):
            if attempt == 2:
                self.port = self._pick_port(after=self.port)
            self._process = self._launch()
            try:
                self._wait_until_ready()
            except BaseException as e:  # a TrackingError, or Ctrl-C while waiting: leave no server
                _end_group(self._process)
                self._process = None
                # A free port can be taken between our check and uvicorn's bind: try once more.
                if isinstance(e, TrackingError) and pick_port and attempt == 1 and "[Errno 98]" in self._log_text():
                    continue
                raise
            break
        log.info("MLflow store %s served at %s (it answered after %.1f s; log %s)",
                 redacted(self.sqlite_uri), self.url, time.monotonic() - began, self.log_path)
        return self

    def stop(self) -> None:
        """End the server and every process it started, and wait for them; safe to call again."""
        process, self._process = self._process, None
        if process is None:
            return
        _end_group(process)
        if self._own_log and self.log_path is not None:
            self.log_path.unlink(missing_ok=True)
            self.log_path = None

    @property
    def pid(self) -> int | None:
        """The server's process id, which is also its process group's (None when not running)."""
        return self._process.pid if self._process is not None else None

    def _launch(self) -> subprocess.Popen:
        command = [sys.executable, "-m", "mlflow", "server",
                   "--backend-store-uri", self.sqlite_uri,
                   "--host", self.address, "--port", str(self.port),
                   # One rank 0 sends a batch every few seconds: one process is plenty, and each
                   # further uvicorn worker is another copy of MLflow in the head's memory.
                   "--workers", "1",
                   # Workers only log metrics and read runs; the launcher writes artifacts itself,
                   # straight to the experiment's file: location next to the database. Serving
                   # artifacts would open an unauthenticated upload path into the head's disk on
                   # the cluster network, for nothing.
                   "--no-serve-artifacts",
                   # Should an experiment be created through the server, its artifacts go where
                   # the launcher's go, not to ./mlruns of the server's working directory.
                   "--default-artifact-root", (self.database.parent / "mlartifacts").resolve().as_uri(),
                   # MLflow refuses requests whose Host header is not localhost or a private IP
                   # (DNS-rebinding protection); the name workers use is this one, whatever it is.
                   # (CORS does not matter: Python clients send no Origin header.)
                   "--allowed-hosts", self.url.removeprefix("http://")]
        environment = {**os.environ,
                       "MLFLOW_DISABLE_TELEMETRY": "true",
                       # The job runner (GenAI evaluation jobs, periodic tasks) is seven more
                       # processes and a directory in /dev/shm; logging metrics needs none of it.
                       "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        with open(self.log_path, "ab") as server_log:
            self._log_start = server_log.tell()
            # A file, not a pipe: nobody reads the output while it runs. Its own session, so
            # that one signal to the group reaches the uvicorn process the CLI starts.
            return subprocess.Popen(command, stdout=server_log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    cwd=self.database.parent, env=environment, start_new_session=True,
                                    preexec_fn=_terminate_with_parent)

    def _wait_until_ready(self) -> None:
        deadline = time.monotonic() + self.start_seconds
        while True:
            # Ask the process first: another server on the port must not answer in its place.
            if self._process.poll() is not None:
                self._fail(f"it exited with status {self._process.returncode}")
            if _answers(self.url):
                return
            if time.monotonic() > deadline:
                self._fail(f"it did not answer {self.url}/health within {self.start_seconds:g} s")
            time.sleep(POLL_SECONDS)

    def _fail(self, what: str) -> None:
        raise TrackingError(f"the MLflow server for {redacted(self.sqlite_uri)} on {self.address}:{self.port} did "
                            f"not start: {what} ({_last_error(self._log_text())}; log {self.log_path}).")

    def _pick_port(self, after: int = 0) -> int:
        """Any free port, or the first free one of `ports` above `after` (cluster.head_ports)."""
        if self.ports is None:
            return self._free_port(0)
        first, last = self.ports
        for port in range(max(first, after + 1), last + 1):
            try:
                return self._free_port(port)
            except PortTaken:
                continue
        raise TrackingError(f"every port of cluster.head_ports [{first}, {last}] is taken on {self.address} (by "
                            "other jobs or programs), so the MLflow server has none; widen the range.")

    def _free_port(self, port: int) -> int:
        """`port` if it is free on the address, or any free port for 0 (bound, read, released:
        the server may lose it to another program before it binds, which start() retries once)."""
        store, address = redacted(self.sqlite_uri), self.address
        try:
            family, kind, protocol, _, socket_address = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM)[0]
        except socket.gaierror as e:
            raise TrackingError(f"cannot serve the MLflow store {store} on {address}: the name does not resolve "
                                f"({e.strerror}).") from None
        with socket.socket(family, kind, protocol) as probe:
            # As uvicorn binds: a port whose old connections linger in TIME_WAIT is free to it.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(socket_address)
            except OSError as e:
                if e.errno == errno.EADDRNOTAVAIL:
                    raise TrackingError(f"cannot serve the MLflow store {store} on {address}: it is not an address "
                                        "of this machine; give the head's cluster address.") from None
                if e.errno == errno.EADDRINUSE:
                    raise PortTaken(f"cannot serve the MLflow store {store} on {address}:{port} ({e.strerror}); "
                                    "pick another port, or 0 for any free one.") from None
                raise TrackingError(f"cannot serve the MLflow store {store} on {address}:{port} ({e.strerror}); "
                                    "pick another port, or 0 for any free one.") from None
            return probe.getsockname()[1]

    def _log_text(self) -> str:
        try:
            with open(self.log_path, "rb") as server_log:
                server_log.seek(self._log_start)
                return server_log.read().decode(errors="replace")
        except OSError:
            return ""




def _answers(url: str) -> bool:
    try:
        with _direct.open(f"{url}/health", timeout=2) as reply:
            return reply.status == 200
    except OSError:  # refused, reset, timed out; urllib's URLError and HTTPError are OSErrors
        return False


def _last_error(text: str) -> str:
    """The line of a server log that says why it stopped: its last error line, else its last line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if ERROR_LINE.search(line)]
    line = (errors or lines or ["the server wrote nothing"])[-1]
    return LOG_TIMESTAMP.sub("", line)[:200].rstrip(".")


PR_SET_PDEATHSIG = 1
try:  # looked up here, in the launcher: the forked child must not load anything before exec
    _prctl = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):
    _prctl = None  # not Linux: stop() is then the only way the server ends


def _terminate_with_parent() -> None:
    """In the server's process, before exec: SIGTERM it when the launcher dies, even by SIGKILL
    (Linux's parent-death signal), so that it ends its uvicorn and no server outlives its job."""
    if _prctl is not None:
        _prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM))


def _end_group(process: subprocess.Popen) -> None:
    """SIGTERM the process group (the MLflow CLI and its uvicorn), then SIGKILL what is left; wait."""
    group = process.pid  # start_new_session: the leader's pid is the group's id
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(STOP_SECONDS)  # the CLI waits for uvicorn before it exits
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group, signal.SIGKILL)
    process.wait()
    # A member that outlived the leader now belongs to init, which reaps it after SIGKILL.
    deadline = time.monotonic() + STOP_SECONDS
    while time.monotonic() < deadline:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    log.warning("processes of the MLflow server's group %d are still there %g s after SIGKILL", group, STOP_SECONDS)
