"""The background checkpoint writer on real stores: a directory, and S3 on a moto server."""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import boto3
import pytest
import torch

from conftest import moto_aws
from transientvod.checkpoint import CheckpointError, LocalCheckpointStore
from transientvod.checkpoint.writer import BackgroundCheckpointWriter, cpu_snapshot

REPO_ROOT = Path(__file__).resolve().parents[2]
CONFIG_YAML = "train:\n  steps: 400\n"


def training_state(step: int) -> dict:
    """The shape of TransientState.checkpoint_payload(): a real model's and optimizer's dicts."""
    torch.manual_seed(step)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(4, 8)).sum().backward()
    optimizer.step()
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
            "sampler": {"epoch": 1, "processed_num": 64}, "progress": {"step": step, "world_sizes": [2, 1]}}


class GatedStore(LocalCheckpointStore):
    """A real directory store whose saves start only when the test opens the gate, so that
    the test decides when a write is 'slow'."""

    def __init__(self, root):
        super().__init__(root, keep_last=10)
        self.gate = threading.Event()
        self.started = []

    def save(self, step, state, config_yaml):
        self.started.append(step)
        assert self.gate.wait(60), "the test never opened the gate"
        return super().save(step, state, config_yaml)


def test_snapshot_is_a_copy_that_later_steps_cannot_change():
    state = training_state(1)
    snapshot = cpu_snapshot(state)
    weight = state["model"]["0.weight"]
    expected = weight.clone()
    weight.add_(1.0)  # the next optimizer step, in place
    state["progress"]["world_sizes"].append(3)
    torch.testing.assert_close(snapshot["model"]["0.weight"], expected)
    assert snapshot["progress"]["world_sizes"] == [2, 1]
    assert type(snapshot["model"]) is type(state["model"])
    assert snapshot["model"]._metadata == state["model"]._metadata  # load_state_dict reads the versions
    momentum = state["optimizer"]["state"][0]["momentum_buffer"]
    assert snapshot["optimizer"]["state"][0]["momentum_buffer"].data_ptr() != momentum.data_ptr()


def test_snapshot_into_an_older_one_reuses_its_memory_and_copies_every_value():
    state = training_state(1)
    older = cpu_snapshot(state)
    newer_state = training_state(2)
    newer = cpu_snapshot(newer_state, reuse=older)
    assert newer["model"]["0.weight"].data_ptr() == older["model"]["0.weight"].data_ptr()
    torch.testing.assert_close(newer["model"], newer_state["model"])
    torch.testing.assert_close(newer["optimizer"]["state"], newer_state["optimizer"]["state"])
    assert newer["progress"] == newer_state["progress"]
    # A shape that changed gets fresh memory.
    newer_state["model"]["0.weight"] = torch.ones(3, 3)
    torch.testing.assert_close(cpu_snapshot(newer_state, reuse=newer)["model"]["0.weight"], torch.ones(3, 3))


def test_consecutive_background_writes_each_keep_their_own_step(tmp_path):
    store = LocalCheckpointStore(tmp_path, keep_last=5)
    writer = BackgroundCheckpointWriter(store)
    for step in (100, 200, 300):  # the later snapshots reuse the memory of the earlier ones
        writer.submit(step, training_state(step), CONFIG_YAML)
        writer.wait(timeout=60)
    assert store.steps() == [100, 200, 300]
    for step in (100, 200, 300):
        checkpoint_dir = tmp_path / f"step-{step:09d}"
        state = torch.load(checkpoint_dir / "state.pt", weights_only=False)
        torch.testing.assert_close(state["model"], training_state(step)["model"])


def test_background_write_round_trips_and_returns_while_the_store_writes(tmp_path):
    store = GatedStore(tmp_path)
    writer = BackgroundCheckpointWriter(store)
    state = training_state(100)
    expected = cpu_snapshot(state)
    writer.submit(100, state, CONFIG_YAML)  # returns although the store cannot write yet
    state["model"]["0.weight"].zero_()  # training goes on and changes the live tensors
    assert writer.busy() and store.steps() == []
    store.gate.set()
    assert writer.wait(timeout=60) == str(tmp_path / "step-000000100")
    assert not writer.busy()
    loaded = store.load_latest()
    assert loaded.step == 100 and loaded.config_yaml == CONFIG_YAML
    torch.testing.assert_close(loaded.state["model"], expected["model"])
    torch.testing.assert_close(loaded.state["optimizer"]["state"], expected["optimizer"]["state"])
    assert loaded.state["progress"] == expected["progress"]
    # What the job does on resume: the checkpoint loads into a fresh model.
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8))
    model.load_state_dict(loaded.state["model"])


def test_snapshots_requested_during_a_write_coalesce_to_the_newest(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="transientvod.checkpoint.writer")
    store = GatedStore(tmp_path)
    writer = BackgroundCheckpointWriter(store)
    writer.submit(100, training_state(100), CONFIG_YAML)
    deadline = time.monotonic() + 30
    while store.started != [100]:  # the thread has taken 100 and is held at the gate
        assert time.monotonic() < deadline
        time.sleep(0.01)
    writer.submit(200, training_state(200), CONFIG_YAML)  # pending
    writer.submit(300, training_state(300), CONFIG_YAML)  # replaces 200, which never started
    store.gate.set()
    assert writer.wait(timeout=60) == str(tmp_path / "step-000000300")
    assert store.started == [100, 300]  # one write at a time, and 200 skipped
    assert store.steps() == [100, 300]
    torch.testing.assert_close(store.load_latest().state["model"], training_state(300)["model"])
    assert any("checkpoint of step 200 was not written: step 300 replaces it" in r.getMessage()
               for r in caplog.records)


def test_write_error_is_raised_by_wait_and_by_the_next_submit_as_one_sentence(tmp_path):
    root = tmp_path / "ckpt"
    store = LocalCheckpointStore(root)
    writer = BackgroundCheckpointWriter(store)
    root.rmdir()
    root.write_text("replaced by a file")  # as in checkpoint/test_local: root cannot stop a chmod
    writer.submit(100, training_state(100), CONFIG_YAML)
    with pytest.raises(CheckpointError, match=str(root)) as raised:
        writer.wait(timeout=60)
    message = str(raised.value)
    assert message.count(". ") == 0 and message.endswith(".")
    with pytest.raises(CheckpointError, match=str(root)):
        writer.submit(200, training_state(200), CONFIG_YAML)


# Each line goes out in one os.write: print() writes the text and the newline separately, so
# from two threads "writing" could land inside a step's line ("step 205writing"), the test
# never saw it and read on until pytest's timeout: the likely cause of one CI run that hung
# here for 600 s (two threads printing 200,000 lines each garbled 6,562 of them on this machine).
KILLED_MID_WRITE = """
import os, sys, time
import torch
from transientvod.checkpoint import local
from transientvod.checkpoint.writer import BackgroundCheckpointWriter

write_durably = local._write_durably
def stalled_write(path, data):
    if path.name == "state.pt":
        with open(path, "wb") as f:  # half the bytes, then the disk is 'slow'
            f.write(data[: len(data) // 2])
            f.flush()
        os.write(1, b"writing\\n")
        time.sleep(600)  # the test kills the process here
    write_durably(path, data)
local._write_durably = stalled_write

writer = BackgroundCheckpointWriter(local.LocalCheckpointStore(sys.argv[1]))
writer.submit(200, {"weights": torch.randn(1 << 20), "step": 200}, "killed: true\\n")
for step in range(201, 100000):  # the training thread goes on while the write stalls
    writer.raise_failure()  # a write that failed before the stall: its error, not silence
    os.write(1, f"step {step}\\n".encode())
    time.sleep(0.01)
"""
WRITING_WITHIN_SECONDS = 60  # "writing" and 3 steps after it; normally about a second


def test_worker_killed_during_a_background_write_leaves_the_previous_checkpoint(tmp_path):
    store = LocalCheckpointStore(tmp_path)
    before = training_state(100)
    store.save(100, before, CONFIG_YAML)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(KILLED_MID_WRITE), str(tmp_path)],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # Lines are read in a thread, so that a child that never reaches the write fails the test
    # at a deadline with what it printed, instead of holding it until pytest's timeout.
    lines: list[str] = []
    reached, stopped = threading.Event(), threading.Event()  # mid-write with 3 steps after; or the output ended

    def read_lines() -> None:
        seen_writing, steps_after = False, 0
        for line in child.stdout:
            lines.append(line)
            seen_writing = seen_writing or line.strip() == "writing"
            steps_after += seen_writing and line.startswith("step ")
            if steps_after >= 3:  # mid-write, and training did not wait for it
                reached.set()
        stopped.set()

    threading.Thread(target=read_lines, daemon=True).start()
    try:
        deadline = time.monotonic() + WRITING_WITHIN_SECONDS
        while not (reached.is_set() or stopped.is_set()) and time.monotonic() < deadline:
            reached.wait(0.1)
        if not reached.is_set():
            child.kill()
            child.wait(timeout=30)
            pytest.fail(f"the child did not reach the stalled write (it ended, or took over "
                        f"{WRITING_WITHIN_SECONDS} s); exit {child.returncode}; last lines {lines[-5:]}; "
                        f"stderr:\n{child.stderr.read()[-4000:]}")
        os.kill(child.pid, signal.SIGKILL)  # as the cloud or the OOM killer would
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == -signal.SIGKILL
    assert (tmp_path / f".tmp-step-000000200-{child.pid}" / "state.pt").is_file()  # the torn write
    assert store.steps() == [100]
    loaded = store.load_latest()
    assert loaded.step == 100
    torch.testing.assert_close(loaded.state["model"], before["model"])


@pytest.fixture(scope="module")
def moto_endpoint(tmp_path_factory):
    with moto_aws(tmp_path_factory.mktemp("aws")) as endpoint:
        yield endpoint


def test_background_write_to_s3_round_trips_and_a_lost_bucket_is_one_sentence(moto_endpoint):
    from transientvod.checkpoint.s3 import S3CheckpointStore

    s3 = boto3.session.Session().client("s3", endpoint_url=moto_endpoint)
    s3.create_bucket(Bucket="writer-test")
    store = S3CheckpointStore("s3://writer-test/run", endpoint_url=moto_endpoint)
    writer = BackgroundCheckpointWriter(store)
    state = training_state(100)
    writer.submit(100, state, CONFIG_YAML)
    assert writer.wait(timeout=60) == "s3://writer-test/run/step-000000100"
    torch.testing.assert_close(store.load_latest().state["model"], state["model"])

    for item in s3.list_objects_v2(Bucket="writer-test").get("Contents", []):
        s3.delete_object(Bucket="writer-test", Key=item["Key"])
    s3.delete_bucket(Bucket="writer-test")
    writer.submit(200, training_state(200), CONFIG_YAML)
    with pytest.raises(CheckpointError, match="S3 bucket 'writer-test' does not exist; create it or fix checkpoint.dir."):
        writer.wait(timeout=60)
