"""What the checkpoint tests share: a state to save, the checks on what comes back, and the
three stores behind one small interface (`backend`), so that one contract suite runs on each:
a directory under tmp_path, an s3:// prefix on a moto server on 127.0.0.1, and a gs:// prefix
on gcp-storage-emulator (PyPI) serving on 127.0.0.1 in this process."""
from __future__ import annotations

import logging
import os
import re
from pathlib import Path

import boto3
import pytest
import torch

from conftest import moto_aws
from transientvod.checkpoint import CheckpointStore, LocalCheckpointStore

BUCKET = "transientvod-checkpoints"
CONFIG_YAML = "train:\n  steps: 400\n  commit_every: 20\nmodel:\n  depth: 8\n"


def make_state(step: int) -> dict:
    generator = torch.Generator().manual_seed(step)
    return {
        "model": {"conv.weight": torch.randn(4, 3, 3, 3, generator=generator), "bn.num_batches": torch.tensor(step)},
        "optimizer": {"state": {0: {"momentum_buffer": torch.ones(5) * step}}, "param_groups": [{"lr": 0.1}]},
        "step": step,
        "epoch": step // 100,
        "sampler": {"processed_indices": [1, 2, 3], "seed": 7},
    }


def assert_state_equal(actual: dict, expected: dict) -> None:
    torch.testing.assert_close(actual["model"], expected["model"])
    torch.testing.assert_close(actual["optimizer"]["state"][0]["momentum_buffer"],
                               expected["optimizer"]["state"][0]["momentum_buffer"])
    assert actual["optimizer"]["param_groups"] == expected["optimizer"]["param_groups"]
    assert (actual["step"], actual["epoch"], actual["sampler"]) == (expected["step"], expected["epoch"], expected["sampler"])


def assert_one_sentence(message: str) -> None:
    assert message.endswith(".") and message.count(". ") == 0, message
    assert "\n" not in message and "Traceback" not in message, message


def corruption_warnings(caplog) -> list[str]:
    """The warnings of every checkpoint module (the store's rules and both stores)."""
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and r.name.startswith("transientvod.checkpoint")]


@pytest.fixture(scope="module")
def moto_endpoint(tmp_path_factory):
    """http://127.0.0.1:<port> of a moto S3 server holding BUCKET, with fake credentials."""
    with moto_aws(tmp_path_factory.mktemp("aws")) as endpoint:
        boto3.session.Session().client("s3", endpoint_url=endpoint).create_bucket(Bucket=BUCKET)
        yield endpoint


class LocalBackend:
    """A directory; `names` are paths under it, as the S3 backend's are keys under its prefix."""

    def __init__(self, root: Path):
        self.root = root

    def open(self, keep_last: int = 3) -> CheckpointStore:
        return LocalCheckpointStore(self.root, keep_last=keep_last)

    def names(self) -> list[str]:
        return sorted(str(p.relative_to(self.root)) for p in self.root.rglob("*") if p.is_file())

    def read(self, name: str) -> bytes:
        return (self.root / name).read_bytes()

    def write(self, name: str, data: bytes) -> None:
        (self.root / name).parent.mkdir(parents=True, exist_ok=True)
        (self.root / name).write_bytes(data)

    def delete(self, name: str) -> None:
        (self.root / name).unlink()


class S3Backend:
    def __init__(self, endpoint: str, prefix: str):
        self.endpoint, self.prefix = endpoint, prefix
        self.s3 = boto3.session.Session().client("s3", endpoint_url=endpoint)

    def open(self, keep_last: int = 3) -> CheckpointStore:
        from transientvod.checkpoint.s3 import S3CheckpointStore

        return S3CheckpointStore(f"s3://{BUCKET}/{self.prefix}", keep_last=keep_last, endpoint_url=self.endpoint)

    def names(self) -> list[str]:
        listed = self.s3.list_objects_v2(Bucket=BUCKET, Prefix=self.prefix + "/").get("Contents", [])
        return sorted(item["Key"][len(self.prefix) + 1:] for item in listed)

    def read(self, name: str) -> bytes:
        return self.s3.get_object(Bucket=BUCKET, Key=f"{self.prefix}/{name}")["Body"].read()

    def write(self, name: str, data: bytes) -> None:
        self.s3.put_object(Bucket=BUCKET, Key=f"{self.prefix}/{name}", Body=data)

    def delete(self, name: str) -> None:
        self.s3.delete_object(Bucket=BUCKET, Key=f"{self.prefix}/{name}")


@pytest.fixture(scope="module")
def gcs_endpoint():
    """http://127.0.0.1:<port> of a GCS emulator holding BUCKET in memory; STORAGE_EMULATOR_HOST
    names it while the module's tests run, so google-cloud-storage talks to it without
    credentials. Port 0, and the port read back from the bound socket: no race for a port."""
    from gcp_storage_emulator.server import create_server

    server = create_server("127.0.0.1", 0, in_memory=True, default_bucket=BUCKET)
    server.start()
    endpoint = f"http://127.0.0.1:{server._api._httpd.server_address[1]}"
    before = os.environ.get("STORAGE_EMULATOR_HOST")
    os.environ["STORAGE_EMULATOR_HOST"] = endpoint
    try:
        yield endpoint
    finally:
        if before is None:
            os.environ.pop("STORAGE_EMULATOR_HOST", None)
        else:
            os.environ["STORAGE_EMULATOR_HOST"] = before
        server.stop()


class GcsBackend:
    def __init__(self, endpoint: str, prefix: str):
        from google.cloud import storage

        self.endpoint, self.prefix = endpoint, prefix
        self.bucket = storage.Client(project="tvd-test").bucket(BUCKET)

    def open(self, keep_last: int = 3) -> CheckpointStore:
        from transientvod.checkpoint.gs import GcsCheckpointStore

        return GcsCheckpointStore(f"gs://{BUCKET}/{self.prefix}", keep_last=keep_last, project="tvd-test")

    def names(self) -> list[str]:
        return sorted(blob.name[len(self.prefix) + 1:] for blob in self.bucket.client.list_blobs(
            BUCKET, prefix=self.prefix + "/"))

    def read(self, name: str) -> bytes:
        return self.bucket.blob(f"{self.prefix}/{name}").download_as_bytes()

    def write(self, name: str, data: bytes) -> None:
        self.bucket.blob(f"{self.prefix}/{name}").upload_from_string(data)

    def delete(self, name: str) -> None:
        self.bucket.blob(f"{self.prefix}/{name}").delete()


@pytest.fixture(params=["local", "s3", "gs"])
def backend(request, tmp_path):
    """Each store in turn: a fresh directory, or a fresh prefix of the shared bucket."""
    if request.param == "local":
        return LocalBackend(tmp_path / "ckpt")
    prefix = re.sub(r"[^A-Za-z0-9_-]+", "-", request.node.name).strip("-")
    if request.param == "gs":
        return GcsBackend(request.getfixturevalue("gcs_endpoint"), prefix)
    return S3Backend(request.getfixturevalue("moto_endpoint"), prefix)
