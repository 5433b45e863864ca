"""Durable checkpoints in Google Cloud Storage: the same bytes as LocalCheckpointStore (the
layout: format.py), as objects::

    gs://bucket/prefix/step-000000200/state.pt
    gs://bucket/prefix/step-000000200/config.yaml
    gs://bucket/prefix/step-000000200/manifest.json   written last within a checkpoint
    gs://bucket/prefix/latest                         written after the whole checkpoint

The rules are S3's (s3.py): GCS has no rename, so the manifest takes its place: a step
without one is a checkpoint still being written (or one whose writer died) and readers pass
over it in silence; a step whose bytes do not match its manifest is skipped with a warning.
GCS reads, writes and listings are strongly consistent, so a manifest just written is seen by
the next read and the next listing. Every upload sends its CRC32C, which GCS checks before it
stores the object, and every download checks the CRC32C GCS stored with it, on top of the
manifest's SHA-256. Files above the client's 8 MiB go up as resumable uploads in CHUNK_BYTES
chunks, each chunk retried on its own.

Retries: google-cloud-storage retries reads, listings and deletes on 429, 5xx and dropped
connections with exponential backoff; it retries uploads only when they carry a generation
precondition, since two writers could otherwise race. A store has one writer (rank 0 of one
job), so uploads here are retried as well, for up to RETRY_SECONDS.

Credentials are Application Default Credentials (``gcloud auth application-default login``,
GOOGLE_APPLICATION_CREDENTIALS, or the VM's service account, which needs the storage
read-write scope); the project is the credentials' or GOOGLE_CLOUD_PROJECT. With
STORAGE_EMULATOR_HOST set, the client talks to that emulator without credentials.
A killed writer's unfinished resumable upload is not an object, is not billed and expires
on its own within a week, so there is nothing of it to clean up.
"""
from __future__ import annotations

import logging
import os
import urllib.parse

import google.auth.exceptions
import requests
from google.api_core import exceptions as api_exceptions
from google.cloud import storage
from google.cloud.storage.retry import DEFAULT_RETRY

from transientvod.checkpoint.format import (
    LATEST_FILE,
    MANIFEST_FILE,
    CheckpointError,
    CorruptCheckpoint,
    step_of_dir_name,
)
from transientvod.checkpoint.store import CheckpointStore

try:  # google-cloud-storage 3 carries the media layer; 2.x had it in google-resumable-media
    from google.cloud.storage.exceptions import DataCorruption, InvalidResponse
except ImportError:  # pragma: no cover - google-cloud-storage 2.x
    from google.resumable_media import DataCorruption, InvalidResponse

log = logging.getLogger(__name__)

# How long one request is retried (backoff included) before a save or a load fails: about a
# minute of trouble ridden out, as the S3 store's 8 attempts do.
RETRY_SECONDS = 60.0
RETRY_SECONDS_ENV = "TRANSIENTVOD_GCS_RETRY_SECONDS"
# (connect, read) per request: an endpoint that drops packets must not hold an attempt for long.
TIMEOUT_SECONDS = (10.0, 60.0)
# The chunk of a resumable upload (the client uploads files above 8 MiB so), a multiple of
# 256 KiB as GCS requires: a chunk lost to a dropped connection is all that is sent again.
CHUNK_BYTES = 16 * 2**20
CHECKSUM = "crc32c"


class GcsCheckpointStore(CheckpointStore):
    """Checkpoints under a gs://bucket/prefix URI."""

    steps_appear_whole = False  # GCS has no rename: a step without its manifest is being written
    storage_errors = (api_exceptions.GoogleAPIError, google.auth.exceptions.GoogleAuthError,
                      requests.exceptions.RequestException, InvalidResponse, DataCorruption)

    def __init__(self, uri: str, keep_last: int = 3, project: str | None = None, client=None):
        super().__init__(keep_last)
        self.bucket_name, prefix = parse_gs_uri(uri)
        # Object names are "<prefix>/step-.../state.pt"; with no prefix they start at the root.
        self._name_prefix = f"{prefix}/" if prefix else ""
        self._uri = f"gs://{self.bucket_name}/{prefix}" if prefix else f"gs://{self.bucket_name}"
        self._retry = DEFAULT_RETRY.with_timeout(_retry_seconds())
        self.client = client if client is not None else self._make_client(project)
        self.bucket = self.client.bucket(self.bucket_name)
        self._check_bucket()

    def _make_client(self, project: str | None):
        try:
            return storage.Client(project=project or os.environ.get("GOOGLE_CLOUD_PROJECT") or None)
        except google.auth.exceptions.DefaultCredentialsError:
            raise CheckpointError(f"no Google credentials were found for checkpoint store {self._uri}; run gcloud "
                                  "auth application-default login, set GOOGLE_APPLICATION_CREDENTIALS, or run on "
                                  "a VM whose service account may write to the bucket.") from None
        except (google.auth.exceptions.GoogleAuthError, OSError, ValueError) as e:
            raise CheckpointError(f"a Cloud Storage client for checkpoint store {self._uri} cannot be made "
                                  f"({_reason(e)}); fix the Google credentials or project settings.") from None

    def _check_bucket(self) -> None:
        # At construction, so that a job with a wrong bucket or no access fails before it
        # trains. A listing, not a bucket get: writing checkpoints needs storage.objects.*
        # permissions, not storage.buckets.get.
        try:
            for _ in self.client.list_blobs(self.bucket_name, prefix=self._name_prefix, max_results=1,
                                            retry=self._retry, timeout=TIMEOUT_SECONDS):
                break
        except self.storage_errors as e:
            raise self._failure(e, "cannot be opened") from None

    @property
    def location(self) -> str:
        return self._uri

    def __repr__(self) -> str:
        return f"GcsCheckpointStore({self._uri!r}, keep_last={self.keep_last})"

    # -- writing ---------------------------------------------------------------------------

    def _write_step(self, name: str, files: dict[str, bytes]) -> None:
        # A re-save of a step loses the old manifest first, so that no reader pairs it with
        # new state bytes: meanwhile the step is incomplete, not corrupted.
        self._delete_if_present(self._name(name, MANIFEST_FILE))
        for file_name, data in files.items():  # manifest.json last
            self._upload(self._name(name, file_name), data)

    def _write_latest(self, data: bytes) -> None:
        self._upload(self._name_prefix + LATEST_FILE, data)

    def _upload(self, object_name: str, data: bytes) -> None:
        # A new Blob per upload: a Blob carries the last generation it saw.
        blob = self.bucket.blob(object_name, chunk_size=CHUNK_BYTES)
        blob.upload_from_string(data, content_type="application/octet-stream", checksum=CHECKSUM,
                                retry=self._retry, timeout=TIMEOUT_SECONDS)

    def _prune(self, keep_step: int) -> None:
        # A failure here costs storage, not the checkpoint just written, so it is only logged.
        try:
            super()._prune(keep_step)
        except self.storage_errors as e:
            log.warning("old checkpoints under %s could not be removed (%s); the next save tries again",
                        self._uri, _reason(e))

    def _delete_step(self, name: str) -> None:
        # The manifest first: a reader then sees an incomplete step, never a corrupted one.
        self._delete_if_present(self._name(name, MANIFEST_FILE))
        for blob in self.client.list_blobs(self.bucket_name, prefix=f"{self._name_prefix}{name}/",
                                           retry=self._retry, timeout=TIMEOUT_SECONDS):
            self._delete_if_present(blob.name)

    def _delete_if_present(self, object_name: str) -> None:
        try:
            self.bucket.delete_blob(object_name, retry=self._retry, timeout=TIMEOUT_SECONDS)
        except api_exceptions.NotFound:
            pass  # absent already, or a retried delete that had worked

    def _remove_abandoned_writes(self) -> None:
        """Nothing to do: an unfinished resumable upload is no object and expires on its own."""

    # -- reading ---------------------------------------------------------------------------

    def _read_latest(self) -> bytes | None:
        try:
            return self._download(self._name_prefix + LATEST_FILE)
        except api_exceptions.NotFound:
            return None
        except DataCorruption:
            # The pointer only names a step for a log line; the listing decides what loads.
            log.warning("%s/%s does not match the checksum Cloud Storage stored with it; ignoring it",
                        self._uri, LATEST_FILE)
            return None

    def _read_file(self, name: str, file_name: str) -> bytes:
        try:
            return self._download(self._name(name, file_name))
        except api_exceptions.NotFound:
            raise FileNotFoundError(file_name) from None
        except DataCorruption:
            raise CorruptCheckpoint(f"{file_name} does not match the checksum Cloud Storage stored with it") from None

    def _download(self, object_name: str) -> bytes:
        return self.bucket.blob(object_name).download_as_bytes(checksum=CHECKSUM, retry=self._retry,
                                                               timeout=TIMEOUT_SECONDS)

    def _list_steps(self) -> list[tuple[int, str]]:
        """(step, name) of every step "directory" under the prefix, ascending."""
        # delimiter="/": one entry per step however many objects it holds, and nothing from
        # deeper "directories" that other tools keep under the same prefix. The iterator
        # fills `prefixes` as its pages are read.
        listing = self.client.list_blobs(self.bucket_name, prefix=f"{self._name_prefix}step-", delimiter="/",
                                         retry=self._retry, timeout=TIMEOUT_SECONDS)
        for _ in listing:
            pass
        found = []
        for prefix in listing.prefixes:
            name = prefix[len(self._name_prefix):].rstrip("/")
            step = step_of_dir_name(name)
            if step is not None:
                found.append((step, name))
        return sorted(found)

    def _has_manifest(self, name: str) -> bool:
        return self.bucket.blob(self._name(name, MANIFEST_FILE)).exists(retry=self._retry, timeout=TIMEOUT_SECONDS)

    # -- names and errors ------------------------------------------------------------------

    def _name(self, name: str, file_name: str) -> str:
        return f"{self._name_prefix}{name}/{file_name}"

    def _step_location(self, name: str) -> str:
        return f"gs://{self.bucket_name}/{self._name_prefix}{name}"

    def _failure(self, error: Exception, failed: str) -> CheckpointError:
        """The one sentence a user needs to fix what `error` says went wrong."""
        if isinstance(error, api_exceptions.RetryError) and isinstance(error.cause, Exception):
            # Retried until RETRY_SECONDS ran out: the last answer says what went wrong.
            return self._failure(error.cause, f"{failed} after {self._retry.timeout:g} s of retries")
        if isinstance(error, google.auth.exceptions.RefreshError):
            return CheckpointError(f"Google refused to refresh the credentials for checkpoint store {self._uri} "
                                   f"({_reason(error)}); run gcloud auth application-default login again or fix "
                                   "GOOGLE_APPLICATION_CREDENTIALS.")
        if isinstance(error, (requests.exceptions.ConnectionError, requests.exceptions.Timeout,
                              google.auth.exceptions.TransportError, api_exceptions.RetryError)):
            endpoint = getattr(getattr(self.client, "_connection", None), "API_BASE_URL", None) or "Cloud Storage"
            return CheckpointError(f"Cloud Storage at {endpoint} cannot be reached for checkpoint store {self._uri} "
                                   f"({type(error).__name__}); check the network and STORAGE_EMULATOR_HOST if set.")
        status = _http_status(error)
        if status == 404:
            return CheckpointError(f"Cloud Storage bucket '{self.bucket_name}' does not exist; "
                                   "create it or fix checkpoint.dir.")
        if status == 401:
            return CheckpointError(f"Cloud Storage rejected the credentials for checkpoint store {self._uri}; "
                                   "run gcloud auth application-default login again or fix "
                                   "GOOGLE_APPLICATION_CREDENTIALS.")
        if status == 403:
            return CheckpointError(f"access to Cloud Storage bucket '{self.bucket_name}' is denied; grant these "
                                   f"credentials storage.objects.list, get, create and delete on it "
                                   "(roles/storage.objectUser has them).")
        if status is not None:
            return CheckpointError(f"checkpoint store {self._uri} {failed}: Cloud Storage answered HTTP "
                                   f"{status}; check the bucket and try again.")
        return CheckpointError(f"checkpoint store {self._uri} {failed} ({_reason(error)}); "
                               "check the Cloud Storage settings and try again.")


def _http_status(error: Exception) -> int | None:
    """The HTTP status of a Cloud Storage answer: JSON API calls raise GoogleAPICallError,
    uploads and downloads (the media layer) InvalidResponse carrying the response."""
    if isinstance(error, api_exceptions.GoogleAPICallError) and error.code:
        return int(error.code)
    if isinstance(error, InvalidResponse):
        return getattr(getattr(error, "response", None), "status_code", None)
    return None


def parse_gs_uri(uri: str) -> tuple[str, str]:
    """(bucket, prefix) of gs://bucket/prefix; one sentence when it names no bucket."""
    parsed = urllib.parse.urlsplit(os.fspath(uri))
    if parsed.scheme.lower() != "gs" or not parsed.netloc:
        raise CheckpointError(f"checkpoint location {uri} names no Cloud Storage bucket; "
                              "write it as gs://bucket/prefix.")
    return parsed.netloc, parsed.path.strip("/")


def _retry_seconds() -> float:
    # Read when a store is made, not at import, so that a job's environment decides.
    text = os.environ.get(RETRY_SECONDS_ENV, "").strip()
    if not text:
        return RETRY_SECONDS
    try:
        seconds = float(text)
    except ValueError:
        seconds = 0.0
    if not seconds > 0:
        raise CheckpointError(f"{RETRY_SECONDS_ENV} is {text!r}; set it to a number of seconds above 0.")
    return seconds


def _reason(error: Exception) -> str:
    # Google's messages can run to several sentences and carry the request's URL; the first
    # sentence says what happened.
    text = getattr(error, "message", None) or str(error)
    text = " ".join(str(text).split()).split(". ")[0].rstrip(".")[:200]
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
