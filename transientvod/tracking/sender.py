"""Rank 0's metrics on their way to MLflow: `MetricSender` (a background thread, so a slow or
unreachable tracking server never stalls training) and `resend_unsent` (the launcher's
second try at what the sender could not send before its worker ended).

While the server is away metrics wait in memory (one warning); when it answers again they go
out in order. What is still unsent when the worker ends goes to `<run dir>/mlflow-unsent.jsonl`.
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time
import typing
from pathlib import Path

from transientvod.tracking.store import client, redacted, unreachable

log = logging.getLogger(__name__)

RETRY_SECONDS = float(os.environ.get("TRANSIENTVOD_MLFLOW_RETRY_SECONDS", "2"))
# How long a finishing worker, and the launcher, wait for buffered metrics to go out.
FLUSH_SECONDS = float(os.environ.get("TRANSIENTVOD_MLFLOW_FLUSH_SECONDS", "20"))
UNSENT_FILE = "mlflow-unsent.jsonl"
BATCH_LIMIT = 1000  # MLflow's log_batch accepts at most 1000 metrics per call


def resend_unsent(mlflow_client, run_id: str, path: Path) -> int:
    """Send the metrics a worker could not, then remove the file; returns how many."""
    if not path.exists():
        return 0
    from mlflow.entities import Metric

    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    metrics = [Metric(r["key"], r["value"], r["timestamp"], r["step"]) for r in rows]
    for start in range(0, len(metrics), BATCH_LIMIT):
        mlflow_client.log_batch(run_id, metrics=metrics[start:start + BATCH_LIMIT])
    path.unlink()
    log.info("sent %d metrics that waited in %s", len(metrics), path)
    return len(metrics)


class _Point(typing.NamedTuple):
    """One metric value as MLflow stores it (mlflow.entities.Metric, without importing MLflow)."""
    key: str
    value: float
    timestamp: int  # milliseconds since the epoch
    step: int


class MetricSender:
    """Sends metrics to one MLflow run from a background thread.

    Neither the constructor nor `log()` imports MLflow or waits for the tracking server:
    `log()` only appends to a list, and the thread imports MLflow (seconds on a loaded
    machine) and sends. Rank 0 runs this inside the training loop, where every other rank
    waits for it at the next collective: a stall there is a stall of the whole ring, with the
    steps since the last commit at risk if a server goes meanwhile. The thread sends in
    batches, in order; when a send fails it warns once, keeps everything, and tries again
    every RETRY_SECONDS. `close()` waits up to FLUSH_SECONDS for the rest and writes
    whatever is still unsent to `unsent_path` for the launcher to send.
    """

    def __init__(self, uri: str, run_id: str, unsent_path: Path, retry_seconds: float = RETRY_SECONDS,
                 record=None):
        self.uri = uri
        self.run_id = run_id
        self.unsent_path = Path(unsent_path)
        # The run's records (channel/): on a host that shares no disk with the launcher,
        # what is left unsent goes to the head through them, where the launcher looks for it.
        self.record = record
        self.retry_seconds = retry_seconds
        self._client = None  # made by the thread
        self._pending: list[_Point] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closing = False
        self._failing_since: float | None = None
        self._thread = threading.Thread(target=self._send_loop, name="mlflow-sender", daemon=True)
        self._thread.start()

    def log(self, metrics: dict[str, float], step: int, at: float | None = None) -> None:
        timestamp = int((time.time() if at is None else at) * 1000)
        with self._lock:
            self._pending.extend(_Point(k, float(v), timestamp, step) for k, v in metrics.items())
        self._wake.set()

    def pending(self) -> int:
        with self._lock:
            return len(self._pending)

    def close(self, timeout: float = FLUSH_SECONDS) -> int:
        """Flush, then stop; returns how many metrics were left for the launcher to send."""
        self._closing = True
        self._wake.set()
        self._thread.join(timeout)
        with self._lock:
            left, self._pending = self._pending, []
        if left:
            rows = [{"key": m.key, "value": m.value, "timestamp": m.timestamp, "step": m.step} for m in left]
            if self.record is not None:
                for row in rows:
                    self.record.append(self.unsent_path.name, row)
            else:
                with open(self.unsent_path, "a") as f:
                    f.writelines(json.dumps(row) + "\n" for row in rows)
            log.warning("MLflow at %s did not take %d metrics before the worker ended; they are in %s "
                        "and the launcher sends them when the store answers", redacted(self.uri), len(left), self.unsent_path)
        return len(left)

    def _send_loop(self) -> None:
        try:
            self._ready_client()  # import MLflow before the first metric arrives, off the training loop's path
        except Exception:
            pass  # _send tries again, and says what is wrong
        while True:
            # Sleep until there is something to send, or until the next retry while failing.
            self._wake.wait(self.retry_seconds if self._failing_since is not None else None)
            self._wake.clear()
            while True:
                with self._lock:
                    batch = list(self._pending[:BATCH_LIMIT])
                if not batch or not self._send(batch):
                    break
                with self._lock:
                    del self._pending[:len(batch)]
            # Closing: leave once all is sent; while failing, retry until close() stops waiting.
            if self._closing and not self.pending():
                return

    def _ready_client(self):
        if self._client is None:
            self._client = client(self.uri)
        return self._client

    def _send(self, batch: list[_Point]) -> bool:
        try:
            from mlflow.entities import Metric

            self._ready_client().log_batch(self.run_id, metrics=[Metric(*point) for point in batch])
        except Exception as e:  # an unreachable server shows up as several exception types
            if self._failing_since is None:
                self._failing_since = time.monotonic()
                log.warning("%s Training goes on; metrics wait in memory until it answers.",
                            unreachable(self.uri, e))
            return False
        if self._failing_since is not None:
            log.info("MLflow at %s answers again after %.0f s; sending %d buffered metrics", redacted(self.uri),
                     time.monotonic() - self._failing_since, self.pending())
            self._failing_since = None
        return True
