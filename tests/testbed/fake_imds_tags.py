"""A stand-in for EC2's instance-metadata service, as far as the watchdog reads it: an IMDSv2
token (PUT /latest/api/token) and instance tags (GET /latest/meta-data/tags/instance/<key>),
each tag's value read from the file <tags dir>/<key> at every request, so a test (or a
head) changes a tag by writing a file. A missing file is a 404, as EC2 answers for a tag the
instance does not have; a request without a valid token is a 401, as IMDSv2 answers.

Used in-process (FakeImdsTags, on loopback) and as a program inside a testbed host's network
namespace (`python fake_imds_tags.py --address 169.254.169.254 --port 80 --tags-dir DIR`),
where the instance's own programs reach it at EC2's address. Also `stand_in_shutdown`: a
`shutdown` and a `poweroff` that only record that they were called."""
from __future__ import annotations

import argparse
import secrets
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

TOKEN_PATH = "/latest/api/token"
TAGS_PATH = "/latest/meta-data/tags/instance/"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _answer(self, status: int, body: str = "") -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_PUT(self):
        if self.path != TOKEN_PATH or not self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
            return self._answer(400)
        token = secrets.token_hex(16)
        with self.server.lock:
            self.server.tokens.add(token)
            self.server.token_puts += 1
        self._answer(200, token)

    def do_GET(self):
        with self.server.lock:
            if self.headers.get("X-aws-ec2-metadata-token") not in self.server.tokens:
                return self._answer(401)
        value = self.server.lookup(self.path)
        self._answer(404) if value is None else self._answer(200, value)


def tag_from_dir(tags_dir: Path):
    """The lookup of a service whose tags are files: <tags dir>/<key>."""
    def lookup(path: str) -> str | None:
        if not path.startswith(TAGS_PATH):
            return None
        key = path[len(TAGS_PATH):]
        file = tags_dir / key
        return file.read_text() if "/" not in key and file.is_file() else None
    return lookup


def metadata_server(address: str, port: int, lookup) -> ThreadingHTTPServer:
    """The service's HTTP server: IMDSv2 tokens, and `lookup(path)` (None: 404) for every GET
    that carries one."""
    server = ThreadingHTTPServer((address, port), Handler)
    server.daemon_threads = True
    server.lookup, server.tokens, server.token_puts = lookup, set(), 0
    server.lock = threading.Lock()
    return server


class FakeImdsTags:
    """The service on `address:port` (0: any free port) in a thread, while in a `with` block."""

    def __init__(self, address: str, port: int, tags_dir: Path):
        tags_dir.mkdir(parents=True, exist_ok=True)
        self.tags_dir = tags_dir
        self.server = metadata_server(address, port, tag_from_dir(tags_dir))
        self.url = f"http://{address}:{self.server.server_address[1]}"

    @property
    def token_puts(self) -> int:
        return self.server.token_puts

    def set_heartbeat(self, value: str) -> None:
        set_tag(self.tags_dir, "transientvod:heartbeat", value)

    def __enter__(self) -> FakeImdsTags:
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=10)


def set_tag(tags_dir: Path, key: str, value: str) -> None:
    """Replace the tag's file at once (rename), so a request never reads half a value."""
    partial = tags_dir / f".{key}.partial"
    partial.write_text(value)
    partial.replace(tags_dir / key)


STAND_IN = """#!/bin/sh
# A stand-in for {name}: records its call; ends nothing.
echo "{name} $*" >> '{calls}'
"""


def stand_in_shutdown(directory: Path) -> tuple[Path, Path]:
    """A bin directory with a recording `shutdown` and `poweroff`, and the file they record to."""
    bin_dir, calls = directory / "stand-in-bin", directory / "shutdown-calls"
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name in ("shutdown", "poweroff"):
        program = bin_dir / name
        program.write_text(STAND_IN.format(name=name, calls=calls))
        program.chmod(0o755)
    return bin_dir, calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--tags-dir", type=Path, required=True)
    args = parser.parse_args()
    service = FakeImdsTags(args.address, args.port, args.tags_dir)
    print(f"serving {service.url}", flush=True)
    service.server.serve_forever()


if __name__ == "__main__":
    main()
