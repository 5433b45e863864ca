"""The worker's half of the job channel: its config fetched from the head, and the run's records
sent there by a background thread (ChannelRecord), or written to a shared run directory
(LocalRecord)."""
from __future__ import annotations

import json
import logging
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from transientvod.channel.protocol import (FLUSH_SECONDS, REQUEST_TIMEOUT_SECONDS, RETRY_SECONDS, SUMMARY_NAME,
                                           TOKEN_HEADER, ChannelError)

log = logging.getLogger(__name__)


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
