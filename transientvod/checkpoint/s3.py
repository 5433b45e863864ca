"""Durable checkpoints in S3 (or any S3-compatible object store): the same bytes as
LocalCheckpointStore (the layout: format.py), as objects::

    s3://bucket/prefix/step-000000200/state.pt
    s3://bucket/prefix/step-000000200/config.yaml
    s3://bucket/prefix/step-000000200/manifest.json   written last within a checkpoint
    s3://bucket/prefix/latest                         written after the whole checkpoint

S3 has no rename, so the manifest takes its place: a step without one is a checkpoint still
being written (or one whose writer died) and readers pass over it in silence; a step whose
bytes do not match its manifest is skipped with a warning, as in the local store. Large
state files go through boto3's managed transfer, so they upload (and download) as parallel
multipart transfers; throttling and 5xx answers are retried by botocore with backoff.

The endpoint is `endpoint_url`, else AWS_ENDPOINT_URL_S3, else AWS_ENDPOINT_URL, else AWS;
region and credentials come from boto3's usual chain (environment, profile, instance role).
A killed writer can leave an unfinished multipart upload behind, which S3 bills until it is
aborted: the next save aborts those older than STALE_UPLOAD_SECONDS under the prefix.
"""
from __future__ import annotations

import io
import logging
import os
import time
import urllib.parse

from boto3.s3.transfer import TransferConfig
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionError as BotoConnectionError,
    FlexibleChecksumError,
    HTTPClientError,
    NoCredentialsError,
    PartialCredentialsError,
)

from transientvod.aws_clients import aws_client
from transientvod.checkpoint.format import (
    LATEST_FILE,
    MANIFEST_FILE,
    CheckpointError,
    CorruptCheckpoint,
    step_of_dir_name,
)
from transientvod.checkpoint.store import STALE_TEMP_SECONDS, CheckpointStore

log = logging.getLogger(__name__)

# Attempts per S3 request (the first one included). botocore's "standard" mode retries
# throttling (SlowDown, 429) and 5xx answers and dropped connections with exponential
# backoff, so 8 attempts ride out about a minute of trouble before a save fails.
MAX_ATTEMPTS = 8
MAX_ATTEMPTS_ENV = "TRANSIENTVOD_S3_MAX_ATTEMPTS"
# An endpoint that drops packets would otherwise hold each attempt for botocore's 60 s.
CONNECT_TIMEOUT_SECONDS = 10.0
# botocore's default: a part of a large state file may take a while on a slow link, and a
# write runs in the background, so the step loop does not wait on it.
READ_TIMEOUT_SECONDS = 60.0
# An unfinished multipart upload this old is from a writer that died, not one still writing.
STALE_UPLOAD_SECONDS = STALE_TEMP_SECONDS
_MISSING = ("404", "NoSuchKey", "NotFound")
_DENIED = ("403", "AccessDenied", "AllAccessDisabled", "Forbidden")
_BAD_CREDENTIALS = ("InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken",
                    "TokenRefreshRequired")
_DELETE_BATCH = 1000  # the most keys one DeleteObjects request takes


class S3CheckpointStore(CheckpointStore):
    """Checkpoints under an s3://bucket/prefix URI."""

    steps_appear_whole = False  # S3 has no rename: a step without its manifest is being written
    storage_errors = (ClientError, BotoCoreError)

    def __init__(self, uri: str, keep_last: int = 3, endpoint_url: str | None = None,
                 multipart_threshold: int = 64 * 2**20, multipart_chunksize: int = 16 * 2**20,
                 client=None):
        super().__init__(keep_last)
        self.bucket, prefix = _parse_s3_uri(uri)
        # Keys are "<prefix>/step-.../state.pt"; with no prefix they start at the bucket's root.
        self._key_prefix = f"{prefix}/" if prefix else ""
        self._uri = f"s3://{self.bucket}/{prefix}" if prefix else f"s3://{self.bucket}"
        # "classic": the CRT client that boto3 picks on some GPU instance types ignores the
        # client's retry configuration.
        self.transfer_config = TransferConfig(multipart_threshold=multipart_threshold,
                                              multipart_chunksize=multipart_chunksize,
                                              preferred_transfer_client="classic")
        self.client = client if client is not None else self._make_client(endpoint_url)
        self._check_bucket()

    def _make_client(self, endpoint_url: str | None):
        # Recent boto3 reads these variables itself; older versions do not, and an explicit
        # endpoint also decides the addressing style (aws_client).
        endpoint_url = (endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3")
                        or os.environ.get("AWS_ENDPOINT_URL") or None)
        try:
            return aws_client("s3", endpoint_url=endpoint_url, attempts=_max_attempts(),
                              connect_timeout=CONNECT_TIMEOUT_SECONDS, read_timeout=READ_TIMEOUT_SECONDS)
        except (BotoCoreError, ValueError) as e:
            raise CheckpointError(f"an S3 client for checkpoint store {self._uri} cannot be made "
                                  f"({_reason(e)}); fix the AWS profile, region or endpoint settings.") from None

    def _check_bucket(self) -> None:
        # At construction, so that a job with a wrong bucket or no credentials fails before
        # it trains, not at its first checkpoint.
        try:
            self.client.head_bucket(Bucket=self.bucket)
        except ClientError as e:
            if _error_code(e) in ("404", "NoSuchBucket"):
                raise CheckpointError(f"S3 bucket '{self.bucket}' does not exist; "
                                      f"create it or fix checkpoint.dir.") from None
            raise self._failure(e, "cannot be opened") from None
        except BotoCoreError as e:
            raise self._failure(e, "cannot be opened") from None

    @property
    def location(self) -> str:
        return self._uri

    def __repr__(self) -> str:
        return f"S3CheckpointStore({self._uri!r}, keep_last={self.keep_last})"

    # -- writing ---------------------------------------------------------------------------

    def _write_step(self, name: str, files: dict[str, bytes]) -> None:
        # A re-save of a step loses the old manifest first, so that no reader pairs it with
        # new state bytes: meanwhile the step is incomplete, not corrupted.
        self.client.delete_object(Bucket=self.bucket, Key=self._key(name, MANIFEST_FILE))
        for file_name, data in files.items():  # manifest.json last
            self._upload(self._key(name, file_name), data)

    def _write_latest(self, data: bytes) -> None:
        self._upload(self._key_prefix + LATEST_FILE, data)

    def _upload(self, key: str, data: bytes) -> None:
        # Managed transfer: above multipart_threshold it becomes a parallel multipart upload,
        # each part retried on its own.
        self.client.upload_fileobj(io.BytesIO(data), self.bucket, key, Config=self.transfer_config)

    def _prune(self, keep_step: int) -> None:
        # A failure here costs storage, not the checkpoint just written, so it is only logged.
        try:
            super()._prune(keep_step)
        except self.storage_errors as e:
            log.warning("old checkpoints under %s could not be removed (%s); the next save tries again",
                        self._uri, _reason(e))

    def _delete_step(self, name: str) -> None:
        # The manifest first: a reader then sees an incomplete step, never a corrupted one.
        self.client.delete_object(Bucket=self.bucket, Key=self._key(name, MANIFEST_FILE))
        keys = [item["Key"] for page in self._pages(Prefix=f"{self._key_prefix}{name}/")
                for item in page.get("Contents", [])]
        for start in range(0, len(keys), _DELETE_BATCH):
            batch = [{"Key": key} for key in keys[start:start + _DELETE_BATCH]]
            answer = self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True})
            for failed in answer.get("Errors", []):
                log.warning("s3://%s/%s could not be removed (%s)", self.bucket, failed.get("Key"), failed.get("Code"))

    def _remove_abandoned_writes(self) -> None:
        # A killed writer's unfinished multipart upload is billed until it is aborted.
        now = time.time()
        paginator = self.client.get_paginator("list_multipart_uploads")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=self._key_prefix):
            for upload in page.get("Uploads", []):
                if now - upload["Initiated"].timestamp() > STALE_UPLOAD_SECONDS:
                    self.client.abort_multipart_upload(Bucket=self.bucket, Key=upload["Key"],
                                                       UploadId=upload["UploadId"])
                    log.info("aborted the unfinished upload of s3://%s/%s, left by a checkpoint writer that died",
                             self.bucket, upload["Key"])

    # -- reading ---------------------------------------------------------------------------

    def _read_latest(self) -> bytes | None:
        try:
            return self.client.get_object(Bucket=self.bucket, Key=self._key_prefix + LATEST_FILE)["Body"].read()
        except ClientError as e:
            if _error_code(e) in _MISSING:
                return None
            raise

    def _read_file(self, name: str, file_name: str) -> bytes:
        buffer = io.BytesIO()
        try:
            # Managed transfer: a large state file comes down as parallel ranged GETs.
            self.client.download_fileobj(self.bucket, self._key(name, file_name), buffer, Config=self.transfer_config)
        except ClientError as e:
            code = _error_code(e)
            if code in _MISSING:
                raise FileNotFoundError(file_name) from None
            if code in ("412", "PreconditionFailed"):  # replaced between two ranged GETs
                raise CorruptCheckpoint(f"{file_name} changed while it was being read") from None
            raise
        except FlexibleChecksumError:
            raise CorruptCheckpoint(f"{file_name} does not match the checksum S3 stored with it") from None
        return buffer.getvalue()

    def _list_steps(self) -> list[tuple[int, str]]:
        """(step, name) of every step "directory" under the prefix, ascending."""
        found = []
        # Delimiter="/": one entry per step however many objects it holds, and nothing from
        # deeper "directories" that other tools keep under the same prefix.
        for page in self._pages(Prefix=f"{self._key_prefix}step-", Delimiter="/"):
            for common in page.get("CommonPrefixes", []):
                name = common["Prefix"][len(self._key_prefix):].rstrip("/")
                step = step_of_dir_name(name)
                if step is not None:
                    found.append((step, name))
        return sorted(found)

    def _has_manifest(self, name: str) -> bool:
        try:
            self.client.head_object(Bucket=self.bucket, Key=self._key(name, MANIFEST_FILE))
        except ClientError as e:
            if _error_code(e) in _MISSING:
                return False
            raise
        return True

    def _pages(self, **list_arguments):
        paginator = self.client.get_paginator("list_objects_v2")
        return paginator.paginate(Bucket=self.bucket, **list_arguments)

    # -- names and errors ------------------------------------------------------------------

    def _key(self, name: str, file_name: str) -> str:
        return f"{self._key_prefix}{name}/{file_name}"

    def _step_location(self, name: str) -> str:
        return f"s3://{self.bucket}/{self._key_prefix}{name}"

    def _failure(self, error: Exception, failed: str) -> CheckpointError:
        """The one sentence a user needs to fix what `error` says went wrong."""
        if isinstance(error, (NoCredentialsError, PartialCredentialsError)):
            return CheckpointError(
                f"no AWS credentials were found for checkpoint store {self._uri}; set AWS_ACCESS_KEY_ID "
                f"and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE, or give the machine an instance role.")
        if isinstance(error, (BotoConnectionError, HTTPClientError)):
            endpoint = getattr(getattr(self.client, "meta", None), "endpoint_url", None) or "the S3 endpoint"
            return CheckpointError(
                f"S3 endpoint {endpoint} cannot be reached for checkpoint store {self._uri} "
                f"({type(error).__name__}); check AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL and the network.")
        if isinstance(error, ClientError):
            code = _error_code(error)
            status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code == "NoSuchBucket":
                return CheckpointError(f"S3 bucket '{self.bucket}' does not exist; create it or fix checkpoint.dir.")
            if code in _BAD_CREDENTIALS:
                return CheckpointError(f"S3 rejected the AWS credentials ({code}) for checkpoint store {self._uri}; "
                                       f"fix or refresh them.")
            if code in _DENIED or status == 403:
                return CheckpointError(
                    f"access to S3 bucket '{self.bucket}' is denied ({code}); allow these credentials "
                    f"s3:ListBucket, s3:GetObject, s3:PutObject and s3:DeleteObject on {self._uri}.")
            attempts = error.response.get("ResponseMetadata", {}).get("RetryAttempts", 0) + 1
            return CheckpointError(
                f"checkpoint store {self._uri} {failed}: S3 answered {code} (HTTP {status}) "
                f"after {attempts} attempt{'s' if attempts != 1 else ''}; check the bucket and try again.")
        return CheckpointError(f"checkpoint store {self._uri} {failed} ({_reason(error)}); "
                               f"check the S3 settings and try again.")


def _parse_s3_uri(uri: str) -> tuple[str, str]:
    parsed = urllib.parse.urlsplit(os.fspath(uri))
    if parsed.scheme.lower() != "s3" or not parsed.netloc:
        raise CheckpointError(f"checkpoint location {uri} is not an S3 URI; write it as s3://bucket/prefix.")
    return parsed.netloc, parsed.path.strip("/")


def _max_attempts() -> int:
    # Read when a store is made, not at import, so that a job's environment decides.
    text = os.environ.get(MAX_ATTEMPTS_ENV, "").strip()
    if not text:
        return MAX_ATTEMPTS
    try:
        attempts = int(text)
    except ValueError:
        attempts = 0
    if attempts < 1:
        raise CheckpointError(f"{MAX_ATTEMPTS_ENV} is {text!r}; set it to a whole number of at least 1.")
    return attempts


def _error_code(error: ClientError) -> str:
    return str(error.response.get("Error", {}).get("Code", ""))


def _reason(error: Exception) -> str:
    # botocore's messages can run to several sentences; the first says what happened.
    text = " ".join(str(error).split()).split(". ")[0].rstrip(".")
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
