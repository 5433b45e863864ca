"""The head's half of the job channel: an HTTP server on the head's cluster address that serves
the resolved config and appends the workers' records to the run directory (protocol.py says
what it serves, and why the channel exists)."""
from __future__ import annotations

import errno
import http.server
import json
import logging
import os
import secrets
import threading
from pathlib import Path

from transientvod.channel.protocol import (CONFIG_PATH, RECORD_NAMES, SUMMARY_NAME, TOKEN_HEADER, ChannelError)

log = logging.getLogger(__name__)


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
