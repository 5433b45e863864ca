"""The MLflow store, once for every caller: which store a job or `compare` uses, what a
`sqlite:` URI names, an MlflowClient that fails fast, and the checks that turn a store that
cannot be used into one sentence (TrackingError).

    store_uri(configured, output_dir)  the configured URI, else $MLFLOW_TRACKING_URI, else
                                       sqlite:///<output_dir>/mlflow.db; SQLite files made absolute
    sqlite_path(uri)                   the database file of a sqlite: URI (SQLAlchemy's rule)
    client(uri)                        an MlflowClient with the fail-fast defaults below
    check_writable(uri)                a job's check, before it opens a run
    readable_client(uri)               `compare`'s: the store must exist and answer; never created
    redacted(text)                     text with every URL's password shown as ***, for printing and logs

SQLAlchemy's rule, which MLflow follows: `sqlite:///runs/mlflow.db` is relative to the current
directory, `sqlite:////srv/mlflow.db` is absolute (four slashes), what follows `?` is options,
and `sqlite://` or `sqlite:///:memory:` is a database in memory, which no other process (a
worker, `compare`, MLflow's UI) can see. A job's workers may start in another directory, so
`store_uri` writes a SQLite file's path absolute before it goes into the resolved config.

The default store is one file for all the runs in an output directory, so that MLflow's UI
can put them side by side (MLflow refuses its old file store).
"""
from __future__ import annotations

import os
import re
import sqlite3
import tempfile
from pathlib import Path

from transientvod.config import DEFAULT_OUTPUT_DIR

STORE_FILE = "mlflow.db"
SQLITE = "sqlite:"
# Fail fast instead of MLflow's default seven retries with exponential backoff (minutes): the
# metric sender retries on its own schedule, and the launcher and `compare` want an answer now.
# MLflow decides about telemetry when it is imported, so these are set when this module is
# (every tracking module imports it before it imports MLflow), and again for each client.
CLIENT_DEFAULTS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
    "MLFLOW_DISABLE_TELEMETRY": "true",
}


# scheme://user:PASSWORD@host, the userinfo of RFC 3986 (the user may be empty, and the
# password may hold ':'). A server store (http://user:pw@host, postgresql://user:pw@host/db)
# carries its password this way; MLflow passes it on, but no message or log needs it.
PASSWORD_IN_URL = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]*:)[^/\s@]+@")


def redacted(text: str) -> str:
    """`text` with the password of every URL in it shown as ***: what may be printed or logged
    of a tracking URI, and of a message that may quote one."""
    return PASSWORD_IN_URL.sub(r"\g<head>***@", text)


class TrackingError(RuntimeError):
    """The tracking store cannot be used (unreachable, unwritable, missing, not a store, an
    unknown run); the message is one sentence that names it."""


def _set_client_defaults() -> None:
    for name, value in CLIENT_DEFAULTS.items():
        os.environ.setdefault(name, value)


_set_client_defaults()


def client(uri: str):
    """An MlflowClient for `uri`; it connects on first use."""
    _set_client_defaults()
    if redacted(uri) != uri:
        # MLflow prints "View run ... at: <the URI>" to stdout when a run on a server ends,
        # password and all; the launcher's summary names the run and the store (redacted).
        os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] = "true"
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=uri)


def sqlite_path(uri: str) -> Path | None:
    """The database file a sqlite: URI names (relative to the current directory with three
    slashes, absolute with four), or None for a store that is not SQLite."""
    if not uri.startswith(SQLITE):
        return None
    rest = uri[len(SQLITE):].split("?", 1)[0]
    if rest == "//" or (rest.startswith("///") and rest[3:] in ("", ":memory:")):
        raise TrackingError(f"{uri} is a SQLite database in memory, which keeps no runs that a worker, compare "
                            f"or MLflow's UI could read; name a file, for example sqlite:///{DEFAULT_OUTPUT_DIR}/{STORE_FILE}.")
    if not rest.startswith("///"):
        raise TrackingError(f"{uri} is not a SQLite URI; write sqlite:///relative/path.db (three slashes) or "
                            "sqlite:////absolute/path.db (four).")
    return Path(rest[3:])


def _check_not_a_path(uri: str) -> None:
    # MLflow would take a bare path for its old file store, which this project does not use.
    if ":" not in uri:
        raise TrackingError(f"tracking URI {uri!r} is a path, not a store's URI; use one like "
                            f"sqlite:///{DEFAULT_OUTPUT_DIR}/{STORE_FILE} or http://HOST:5000.")


def store_uri(configured: str = "", output_dir: str = DEFAULT_OUTPUT_DIR) -> str:
    """The configured URI, else $MLFLOW_TRACKING_URI, else the output directory's SQLite
    store; a SQLite file's path is made absolute (options after `?` kept)."""
    uri = configured or os.environ.get("MLFLOW_TRACKING_URI", "")
    if not uri:
        return SQLITE + "///" + str((Path(output_dir) / STORE_FILE).resolve())
    _check_not_a_path(uri)
    path = sqlite_path(uri)
    if path is None or path.is_absolute():
        return uri
    options = uri.partition("?")[2]
    return SQLITE + "///" + str(path.resolve()) + ("?" + options if options else "")


def artifact_location(uri: str, experiment: str) -> str | None:
    """Where a new experiment keeps its artifacts: next to a SQLite database (else MLflow puts
    them in ./mlruns of whatever directory the job started from); a server decides for itself."""
    path = sqlite_path(uri)
    if path is None:
        return None
    return (path.parent / "mlartifacts" / experiment).resolve().as_uri()


def reason(error: Exception) -> str:
    """Why a store did not answer, in a few words (MLflow wraps HTTP, SQLAlchemy and store
    failures in several exception types, with long messages)."""
    text = redacted(getattr(error, "message", None) or str(error))
    if "Connection refused" in text or "Max retries exceeded" in text or "NewConnectionError" in text:
        return "no server listens there"
    if "timed out" in text.lower():
        return "it timed out"
    return (text.strip().splitlines() or [type(error).__name__])[0][:160]


def unreachable(uri: str, error: Exception) -> TrackingError:
    """A job's store did not answer: the sentence says what to do about it."""
    return TrackingError(f"the MLflow tracking store {redacted(uri)} does not answer ({reason(error)}); start it, or set "
                         "tracking.uri / MLFLOW_TRACKING_URI to one that runs, or tracking.enabled=false.")


def check_writable(uri: str) -> None:
    """A job's store: a SQLite store's directory must be writable (it is made if missing); a
    server is checked by talking to it when the run is opened."""
    _check_not_a_path(uri)
    path = sqlite_path(uri)
    if path is None:
        return
    directory = path.parent
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".write-check-"):
            pass
    except OSError as e:
        raise TrackingError(f"the MLflow store directory {directory} is not writable ({e.strerror}); set "
                            "tracking.uri or MLFLOW_TRACKING_URI to a writable place.") from None


def _check_sqlite_store(uri: str, path: Path) -> None:
    # MLflow creates a missing SQLite file (and its directories) on first use; reading must not.
    if not path.exists():
        raise TrackingError(f"no MLflow store at {uri} ({path} does not exist); run a job first "
                            "or set MLFLOW_TRACKING_URI to the store your runs were logged to.")
    if not path.is_file():
        raise TrackingError(f"{path} is not a file, so {uri} is not an MLflow store.")
    try:
        # Read-only, so that a file which is not an MLflow store is left as it was.
        with sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True) as db:
            found = db.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='runs'").fetchone()
    except sqlite3.Error as e:
        raise TrackingError(f"cannot open the MLflow store {uri}: {e}.") from None
    if found is None:
        raise TrackingError(f"{path} is not an MLflow store (it has no runs table); check {uri}.")


def readable_client(uri: str):
    """A client for a store that must already hold runs (`compare`): a missing SQLite file is
    an error, never created; a server must answer now."""
    _check_not_a_path(uri)
    path = sqlite_path(uri)
    if path is not None:
        _check_sqlite_store(uri, path)
    reader = client(uri)
    try:
        reader.search_experiments(max_results=1)  # the client connects lazily: make it answer now
    except Exception as e:  # SQLAlchemy, sqlite, HTTP errors: all mean "this store cannot be read"
        raise TrackingError(f"cannot open the MLflow store {redacted(uri)} ({reason(e)}).") from None
    return reader
