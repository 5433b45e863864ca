"""Durable checkpoints: round trip, pruning, crash atomicity, corruption, unusable stores."""
from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from transientvod.checkpoint import (
    Checkpoint,
    CheckpointError,
    LocalCheckpointStore,
    open_store,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
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


def corruption_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and r.name.startswith("transientvod.checkpoint")]


# -- round trip, ordering, pruning ------------------------------------------------------------

def test_save_then_load_latest_round_trips_state_config_and_location(tmp_path):
    store = LocalCheckpointStore(tmp_path / "ckpt")
    state = make_state(200)
    location = store.save(200, state, CONFIG_YAML)

    assert location == str(tmp_path / "ckpt" / "step-000000200")
    assert sorted(os.listdir(location)) == ["config.yaml", "manifest.json", "state.pt"]
    manifest = json.loads(Path(location, "manifest.json").read_text())
    assert manifest["step"] == 200 and manifest["format"] == 1
    assert abs(manifest["created"] - time.time()) < 60
    assert manifest["files"]["state.pt"]["bytes"] == Path(location, "state.pt").stat().st_size
    assert (tmp_path / "ckpt" / "latest").read_text().strip() == "step-000000200"

    loaded = store.load_latest()
    assert isinstance(loaded, Checkpoint)
    assert loaded.step == 200
    assert loaded.location == location
    assert loaded.config_yaml == CONFIG_YAML
    assert_state_equal(loaded.state, state)
    assert loaded.state["model"]["conv.weight"].device.type == "cpu"
    assert store.location == str(tmp_path / "ckpt")


def test_newest_step_wins_and_steps_are_ascending(tmp_path):
    store = LocalCheckpointStore(tmp_path, keep_last=5)
    for step in (300, 100, 200):
        store.save(step, make_state(step), CONFIG_YAML)
    assert store.steps() == [100, 200, 300]
    loaded = store.load_latest()
    assert loaded.step == 300
    assert_state_equal(loaded.state, make_state(300))


def test_keep_last_prunes_older_checkpoints(tmp_path):
    store = LocalCheckpointStore(tmp_path, keep_last=2)
    for step in (100, 200, 300, 400):
        store.save(step, make_state(step), CONFIG_YAML)
    assert store.steps() == [300, 400]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step-000000300", "step-000000400"]


def test_prune_never_removes_the_checkpoint_just_written(tmp_path):
    # A job that resumed from an older step (the newer ones were corrupted) saves below them.
    store = LocalCheckpointStore(tmp_path, keep_last=2)
    for step in (300, 400):
        store.save(step, make_state(step), CONFIG_YAML)
    store.save(100, make_state(100), CONFIG_YAML)
    assert store.steps() == [100, 300, 400]


def test_resave_of_a_step_replaces_it(tmp_path):
    store = LocalCheckpointStore(tmp_path)
    store.save(200, make_state(1), "first: 1\n")
    store.save(200, make_state(2), "second: 2\n")
    loaded = store.load_latest()
    assert (loaded.step, loaded.config_yaml) == (200, "second: 2\n")
    assert_state_equal(loaded.state, make_state(2))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step-000000200"]


def test_stale_latest_pointer_does_not_hide_a_newer_complete_checkpoint(tmp_path, caplog):
    # A writer that crashed between its rename and the pointer update leaves `latest` behind.
    store = LocalCheckpointStore(tmp_path)
    store.save(100, make_state(100), CONFIG_YAML)
    store.save(200, make_state(200), CONFIG_YAML)
    (tmp_path / "latest").write_text("step-000000100\n")
    assert store.load_latest().step == 200
    (tmp_path / "latest").write_text("garbage")
    assert store.load_latest().step == 200
    (tmp_path / "latest").unlink()
    assert store.load_latest().step == 200
    assert corruption_warnings(caplog) == []


# -- a writer killed mid-save ------------------------------------------------------------------

CRASHING_WRITER = """
import os, signal, sys
import torch
from transientvod.checkpoint import local as checkpoint

where = sys.argv[2]
def die():
    os.kill(os.getpid(), signal.SIGKILL)

write_durably = checkpoint._write_durably
def crashing_write(path, data):
    if where == "torn_state" and path.name == "state.pt":
        with open(path, "wb") as f:
            f.write(data[: len(data) // 2])
            f.flush()
        die()
    if where == "before_manifest" and path.name == "manifest.json":
        die()
    write_durably(path, data)
checkpoint._write_durably = crashing_write

rename = os.rename
renames = []
def crashing_rename(src, dst):
    renames.append(src)
    if where == "before_rename" or (where == "between_replace_renames" and len(renames) == 2):
        die()
    rename(src, dst)
checkpoint.os.rename = crashing_rename

store = checkpoint.LocalCheckpointStore(sys.argv[1])
# Large enough that the write takes real work, small enough to keep the test fast.
store.save(200, {"weights": torch.randn(1 << 20), "step": 200}, "crashed: true\\n")
sys.exit(3)  # not reached: the writer is killed above
"""


def run_crashing_writer(root: Path, where: str) -> int:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(CRASHING_WRITER), str(root), where],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, stderr = child.communicate(timeout=120)
    assert child.returncode == -signal.SIGKILL, stderr
    return child.pid  # its temporary directory is named after it


@pytest.mark.parametrize("where", ["torn_state", "before_manifest", "before_rename"])
def test_writer_killed_mid_save_leaves_the_previous_checkpoint_intact(tmp_path, where, caplog):
    store = LocalCheckpointStore(tmp_path)
    store.save(100, make_state(100), CONFIG_YAML)

    pid = run_crashing_writer(tmp_path, where)

    leftover = tmp_path / f".tmp-step-000000200-{pid}"
    assert leftover.is_dir(), sorted(os.listdir(tmp_path))
    assert store.steps() == [100]
    loaded = store.load_latest()
    assert loaded.step == 100
    assert loaded.config_yaml == CONFIG_YAML
    assert_state_equal(loaded.state, make_state(100))
    assert (tmp_path / "latest").read_text().strip() == "step-000000100"
    assert corruption_warnings(caplog) == []

    store.save(300, make_state(300), CONFIG_YAML)
    assert not leftover.exists()
    assert not [name for name in os.listdir(tmp_path) if name.startswith(".tmp-")]
    assert store.steps() == [100, 300]


def test_writer_killed_while_replacing_a_step_loses_only_that_step(tmp_path):
    store = LocalCheckpointStore(tmp_path)
    store.save(100, make_state(100), CONFIG_YAML)
    store.save(200, make_state(200), CONFIG_YAML)

    pid = run_crashing_writer(tmp_path, "between_replace_renames")

    assert store.steps() == [100]
    assert store.load_latest().step == 100
    store.save(300, make_state(300), CONFIG_YAML)
    assert not [name for name in os.listdir(tmp_path) if str(pid) in name]


def test_temporary_directory_of_a_live_writer_is_kept_until_an_hour_old(tmp_path):
    store = LocalCheckpointStore(tmp_path)
    live = tmp_path / f".tmp-step-000000500-{os.getppid()}"  # the pytest runner's parent: alive
    live.mkdir()
    (live / "state.pt").write_bytes(b"partial")
    store.save(100, make_state(100), CONFIG_YAML)
    assert live.is_dir()

    two_hours_ago = time.time() - 7200
    os.utime(live, (two_hours_ago, two_hours_ago))
    store.save(200, make_state(200), CONFIG_YAML)
    assert not live.exists()


# -- corrupted checkpoints -------------------------------------------------------------------

def flip_bytes(path: Path) -> None:
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 8] = bytes(b ^ 0xFF for b in data[middle:middle + 8])
    path.write_bytes(bytes(data))


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


CORRUPTIONS = {
    "flipped state.pt": (lambda d: flip_bytes(d / "state.pt"), "sha256"),
    "truncated state.pt": (lambda d: truncate(d / "state.pt"), "bytes"),
    "truncated config.yaml": (lambda d: truncate(d / "config.yaml"), "bytes"),
    "deleted manifest": (lambda d: (d / "manifest.json").unlink(), "manifest.json is missing"),
    "deleted state.pt": (lambda d: (d / "state.pt").unlink(), "state.pt is missing"),
    "garbled manifest": (lambda d: (d / "manifest.json").write_text("{not json"), "unreadable"),
}


@pytest.mark.parametrize("corruption", list(CORRUPTIONS))
def test_corrupted_newest_checkpoint_is_skipped_with_a_warning(tmp_path, caplog, corruption):
    damage, why = CORRUPTIONS[corruption]
    store = LocalCheckpointStore(tmp_path)
    store.save(100, make_state(100), CONFIG_YAML)
    newest = Path(store.save(200, make_state(200), CONFIG_YAML))
    damage(newest)

    with caplog.at_level(logging.WARNING, logger="transientvod.checkpoint"):
        loaded = store.load_latest()

    assert loaded.step == 100
    assert_state_equal(loaded.state, make_state(100))
    warnings = corruption_warnings(caplog)
    assert len(warnings) == 1
    assert str(newest) in warnings[0] and "corrupted" in warnings[0] and why in warnings[0]
    assert "skipping it" in warnings[0]


def test_all_checkpoints_corrupted_gives_none_with_a_warning_for_each(tmp_path, caplog):
    store = LocalCheckpointStore(tmp_path)
    paths = [Path(store.save(step, make_state(step), CONFIG_YAML)) for step in (100, 200)]
    for path in paths:
        flip_bytes(path / "state.pt")
    with caplog.at_level(logging.WARNING, logger="transientvod.checkpoint"):
        assert store.load_latest() is None
    warnings = corruption_warnings(caplog)
    assert len(warnings) == 2
    assert str(paths[1]) in warnings[0] and str(paths[0]) in warnings[1]


def test_empty_root_has_no_checkpoint(tmp_path, caplog):
    store = LocalCheckpointStore(tmp_path / "new" / "dir")
    assert (tmp_path / "new" / "dir").is_dir()
    assert store.load_latest() is None
    assert store.steps() == []
    assert corruption_warnings(caplog) == []


# -- unusable stores ---------------------------------------------------------------------------

def test_root_under_a_regular_file_is_a_checkpoint_error_naming_it(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    root = blocker / "checkpoints"
    with pytest.raises(CheckpointError) as raised:
        LocalCheckpointStore(root)
    message = str(raised.value)
    assert str(root) in message
    assert message.count(". ") == 0 and message.endswith(".")  # one sentence
    with pytest.raises(CheckpointError, match="a-file"):
        open_store(str(root))
    with pytest.raises(CheckpointError, match="a-file"):
        LocalCheckpointStore(blocker)  # the root itself is a regular file


def test_save_into_a_root_that_became_unwritable_is_a_checkpoint_error(tmp_path):
    root = tmp_path / "ckpt"
    store = LocalCheckpointStore(root)
    root.rmdir()
    root.write_text("replaced by a file")
    with pytest.raises(CheckpointError, match=str(root)):
        store.save(100, make_state(100), CONFIG_YAML)


def test_open_store_local_path_and_file_uri(tmp_path):
    by_path = open_store(str(tmp_path / "a"), keep_last=4)
    assert isinstance(by_path, LocalCheckpointStore)
    assert by_path.location == str(tmp_path / "a") and by_path.keep_last == 4
    by_uri = open_store(f"file://{tmp_path}/b")
    assert isinstance(by_uri, LocalCheckpointStore) and by_uri.location == str(tmp_path / "b")
    by_uri.save(100, make_state(100), CONFIG_YAML)
    assert open_store(str(tmp_path / "b")).load_latest().step == 100


def test_open_store_s3_without_a_reachable_endpoint_and_unknown_schemes(monkeypatch):
    # s3:// opens an S3CheckpointStore (tests/test_checkpoint_s3.py); with nothing listening
    # at its endpoint it fails at once with a CheckpointError naming the store.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed_port = sock.getsockname()[1]
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{closed_port}")
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("TRANSIENTVOD_S3_MAX_ATTEMPTS", "1")
    with pytest.raises(CheckpointError, match=r"cannot be reached for checkpoint store s3://b/p "):
        open_store("s3://b/p")
    with pytest.raises(CheckpointError, match="ftp"):
        open_store("ftp://x")
    with pytest.raises(CheckpointError, match="empty"):
        open_store("")


def test_keep_last_below_one_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="keep_last"):
        LocalCheckpointStore(tmp_path, keep_last=0)
