"""What one checkpoint is, in bytes: the names of its files, its manifest, and the checks that
tell a whole checkpoint from a damaged one. Every store writes and reads exactly these bytes::

    <root>/step-000000200/state.pt        torch.save of the state dict
    <root>/step-000000200/config.yaml     the resolved config the job ran with
    <root>/step-000000200/manifest.json   {"step", "created", "files": {name: {"sha256", "bytes"}}, "format"}
    <root>/latest                         "step-000000200": the newest step directory

Within a checkpoint the manifest is written last and `latest` after the whole checkpoint,
so a reader never mistakes half a checkpoint for a whole one; the checksums in the manifest
catch bytes damaged after they were written.
"""
from __future__ import annotations

import hashlib
import io
import json
import re
import time
import typing

FORMAT = 1  # manifest.json "format"; a reader skips checkpoints of a format it does not know
STATE_FILE = "state.pt"
CONFIG_FILE = "config.yaml"
MANIFEST_FILE = "manifest.json"
LATEST_FILE = "latest"

_STEP_DIR = re.compile(r"^step-(\d{9,})$")


class CheckpointError(RuntimeError):
    """The store cannot be used (a directory that cannot be created or written, an unknown
    URI scheme); the message is one sentence naming the location to fix."""


class CorruptCheckpoint(Exception):
    """One checkpoint's bytes do not match its manifest; the message says what is wrong.
    Stores catch it, log it and fall back to an older checkpoint."""


def step_dir_name(step: int) -> str:
    # Zero-padded so that a plain name sort (an S3 listing, `ls`) is also a step sort.
    return f"step-{step:09d}"


def step_of_dir_name(name: str) -> int | None:
    match = _STEP_DIR.match(name)
    return int(match.group(1)) if match else None


def encode_checkpoint(step: int, state: dict, config_yaml: str) -> dict[str, bytes]:
    """The files of one checkpoint, by name, in the order to write them: manifest last."""
    import torch  # here, not at the top: the launcher's shared-disk check imports this package

    buffer = io.BytesIO()
    # Serialized to bytes first so that the checksum is of exactly the bytes written, and an
    # object store can upload them without a temporary file.
    torch.save(state, buffer)
    files = {STATE_FILE: buffer.getvalue(), CONFIG_FILE: config_yaml.encode("utf-8")}
    manifest = {
        "step": step,
        "created": time.time(),
        "files": {name: {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
                  for name, data in files.items()},
        "format": FORMAT,
    }
    files[MANIFEST_FILE] = json.dumps(manifest, indent=2).encode("utf-8")
    return files


def decode_checkpoint(step: int, read_file: typing.Callable[[str], bytes]) -> tuple[dict, str]:
    """(state, config_yaml) of the checkpoint of `step`, whose files `read_file(name)` returns
    (raising FileNotFoundError for a missing one). Raises CorruptCheckpoint saying why."""
    try:
        manifest_bytes = read_file(MANIFEST_FILE)
    except FileNotFoundError:
        raise CorruptCheckpoint(f"{MANIFEST_FILE} is missing") from None
    try:
        manifest = json.loads(manifest_bytes)
        fmt, manifest_step, listed = manifest["format"], manifest["step"], manifest["files"]
        expected = {name: (str(listed[name]["sha256"]), int(listed[name]["bytes"]))
                    for name in (STATE_FILE, CONFIG_FILE)}
    except (ValueError, KeyError, TypeError) as e:
        raise CorruptCheckpoint(f"{MANIFEST_FILE} is unreadable: {type(e).__name__}: {e}") from None
    if fmt != FORMAT:
        raise CorruptCheckpoint(f"{MANIFEST_FILE} has format {fmt!r}; this version reads format {FORMAT}")
    if manifest_step != step:
        raise CorruptCheckpoint(f"{MANIFEST_FILE} is of step {manifest_step!r}, not {step}")
    contents = {}
    for name, (sha256, size) in expected.items():
        try:
            data = read_file(name)
        except FileNotFoundError:
            raise CorruptCheckpoint(f"{name} is missing") from None
        if len(data) != size:
            raise CorruptCheckpoint(f"{name} has {len(data)} bytes, the manifest says {size}")
        if hashlib.sha256(data).hexdigest() != sha256:
            raise CorruptCheckpoint(f"{name} does not match its sha256 in the manifest")
        contents[name] = data
    import torch

    try:
        # weights_only=False: the state holds optimizer and sampler objects, and the checksum
        # above shows these are the bytes this package wrote.
        state = torch.load(io.BytesIO(contents[STATE_FILE]), map_location="cpu", weights_only=False)
        config_yaml = contents[CONFIG_FILE].decode("utf-8")
    except Exception as e:  # noqa: BLE001 - any failure here means the bytes are unusable
        raise CorruptCheckpoint(f"{STATE_FILE} cannot be loaded: {type(e).__name__}: {e}") from None
    return state, config_yaml
