"""The directory store: what it writes, crash atomicity (a writer killed mid-save), the
temporary directories of dead writers, unusable directories, and open_store for paths.
The rules both stores keep are in test_store_contract.py."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from store_backends import CONFIG_YAML, assert_state_equal, corruption_warnings, make_state
from transientvod.checkpoint import CheckpointError, LocalCheckpointStore, open_store

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_save_writes_a_step_directory_and_the_latest_file(tmp_path):
    store = LocalCheckpointStore(tmp_path / "ckpt")
    location = store.save(200, make_state(200), CONFIG_YAML)
    assert store.location == str(tmp_path / "ckpt")
    assert location == str(tmp_path / "ckpt" / "step-000000200")
    assert sorted(os.listdir(location)) == ["config.yaml", "manifest.json", "state.pt"]
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["latest", "step-000000200"]  # no temporary left
    assert store.load_latest().location == location


# -- a writer killed mid-save ------------------------------------------------------------------

CRASHING_WRITER = """
import os, signal, sys
import torch
from transientvod.checkpoint import local

where = sys.argv[2]
def die():
    os.kill(os.getpid(), signal.SIGKILL)

write_durably = local._write_durably
def crashing_write(path, data):
    if where == "torn_state" and path.name == "state.pt":
        with open(path, "wb") as f:
            f.write(data[: len(data) // 2])
            f.flush()
        die()
    if where == "before_manifest" and path.name == "manifest.json":
        die()
    write_durably(path, data)
local._write_durably = crashing_write

rename = os.rename
renames = []
def crashing_rename(src, dst):
    renames.append(src)
    if where == "before_rename" or (where == "between_replace_renames" and len(renames) == 2):
        die()
    rename(src, dst)
local.os.rename = crashing_rename

store = local.LocalCheckpointStore(sys.argv[1])
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


# -- empty and unusable stores ---------------------------------------------------------------

def test_empty_root_has_no_checkpoint(tmp_path, caplog):
    store = LocalCheckpointStore(tmp_path / "new" / "dir")
    assert (tmp_path / "new" / "dir").is_dir()
    assert store.load_latest() is None
    assert store.steps() == []
    assert corruption_warnings(caplog) == []


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
    # s3:// opens an S3CheckpointStore (test_s3.py); with nothing listening
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

