"""The rules every checkpoint store keeps (transientvod/checkpoint/store.py), checked on every
store (local, S3, GCS): which steps may be saved, which checkpoints pruning keeps, the newest intact one
found past corrupted ones, and what the `latest` pointer is trusted for."""
from __future__ import annotations

import json
import logging
import time

import pytest

from store_backends import (  # noqa: F401 (moto_endpoint, gcs_endpoint and backend are fixtures)
    CONFIG_YAML,
    assert_state_equal,
    backend,
    corruption_warnings,
    gcs_endpoint,
    make_state,
    moto_endpoint,
)
from transientvod.checkpoint import Checkpoint


def test_save_then_load_latest_round_trips_state_config_and_location(backend):
    store = backend.open()
    state = make_state(200)
    location = store.save(200, state, CONFIG_YAML)

    assert location == f"{store.location}/step-000000200"
    assert backend.names() == ["latest", "step-000000200/config.yaml", "step-000000200/manifest.json",
                               "step-000000200/state.pt"]
    assert backend.read("latest") == b"step-000000200\n"
    manifest = json.loads(backend.read("step-000000200/manifest.json"))
    assert manifest["step"] == 200 and manifest["format"] == 1
    assert abs(manifest["created"] - time.time()) < 60
    assert manifest["files"]["state.pt"]["bytes"] == len(backend.read("step-000000200/state.pt"))

    loaded = store.load_latest()
    assert isinstance(loaded, Checkpoint)
    assert (loaded.step, loaded.location, loaded.config_yaml) == (200, location, CONFIG_YAML)
    assert_state_equal(loaded.state, state)
    assert loaded.state["model"]["conv.weight"].device.type == "cpu"


def test_newest_step_wins_and_steps_are_ascending(backend):
    store = backend.open(keep_last=5)
    assert store.steps() == [] and store.load_latest() is None
    for step in (300, 100, 200):
        store.save(step, make_state(step), CONFIG_YAML)
    assert store.steps() == [100, 200, 300]
    loaded = store.load_latest()
    assert loaded.step == 300
    assert_state_equal(loaded.state, make_state(300))


def test_keep_last_prunes_older_checkpoints(backend):
    store = backend.open(keep_last=2)
    for step in (100, 200, 300, 400):
        store.save(step, make_state(step), CONFIG_YAML)
    assert store.steps() == [300, 400]
    assert {name.split("/")[0] for name in backend.names()} == {"latest", "step-000000300", "step-000000400"}


def test_prune_never_removes_the_checkpoint_just_written(backend):
    # A job that resumed from an older step (the newer ones were corrupted) saves below them.
    store = backend.open(keep_last=2)
    for step in (300, 400):
        store.save(step, make_state(step), CONFIG_YAML)
    store.save(100, make_state(100), CONFIG_YAML)
    assert store.steps() == [100, 300, 400]
    store.save(500, make_state(500), CONFIG_YAML)
    assert store.steps() == [400, 500]


def test_step_without_manifest_is_kept_while_newer_than_a_kept_one_and_pruned_once_older(backend, caplog):
    store = backend.open(keep_last=1)
    store.save(100, make_state(100), CONFIG_YAML)
    for step in (50, 300):  # a writer died before the manifest, or (S3) is still writing
        backend.write(f"step-{step:09d}/state.pt", b"partial")
    with caplog.at_level(logging.WARNING, logger="transientvod.checkpoint"):
        assert store.steps() == [100]
        assert store.load_latest().step == 100
    # Passed over in silence where files appear one by one (see the last test of this file).
    assert len(corruption_warnings(caplog)) == (1 if store.steps_appear_whole else 0)

    store.save(200, make_state(200), CONFIG_YAML)
    assert {name.split("/")[0] for name in backend.names()} == {"latest", "step-000000200", "step-000000300"}


def test_resave_of_a_step_replaces_it(backend):
    store = backend.open()
    store.save(200, make_state(1), "first: 1\n")
    store.save(200, make_state(2), "second: 2\n")
    loaded = store.load_latest()
    assert (loaded.step, loaded.config_yaml) == (200, "second: 2\n")
    assert_state_equal(loaded.state, make_state(2))
    assert store.steps() == [200]
    assert {name.split("/")[0] for name in backend.names()} == {"latest", "step-000000200"}


@pytest.mark.parametrize("step", [-1, True, 1.5, "100", None])
def test_step_that_is_not_a_whole_number_of_at_least_zero_is_rejected(backend, step):
    store = backend.open()
    with pytest.raises(ValueError, match=r"step is .*; it must be an int of at least 0\.$"):
        store.save(step, make_state(0), CONFIG_YAML)
    assert backend.names() == []


def test_keep_last_below_one_is_rejected(backend):
    with pytest.raises(ValueError, match="keep_last is 0; it must be at least 1"):
        backend.open(keep_last=0)


# -- the `latest` pointer ----------------------------------------------------------------------

def test_stale_latest_pointer_does_not_hide_a_newer_complete_checkpoint(backend, caplog):
    # A writer that died after its step was whole but before the pointer leaves `latest` behind.
    store = backend.open()
    store.save(100, make_state(100), CONFIG_YAML)
    store.save(200, make_state(200), CONFIG_YAML)
    with caplog.at_level(logging.INFO, logger="transientvod.checkpoint"):
        backend.write("latest", b"step-000000100\n")
        assert store.load_latest().step == 200
        assert any("names step 100 but the newest checkpoint is step 200" in r.getMessage() for r in caplog.records)
        backend.write("latest", b"garbage")
        assert store.load_latest().step == 200
        backend.write("latest", b"\xff\xfe not ascii")
        assert store.load_latest().step == 200
        backend.delete("latest")
        assert store.load_latest().step == 200
    assert corruption_warnings(caplog) == []


# -- corrupted checkpoints -------------------------------------------------------------------

def flip_bytes(backend, name: str) -> None:
    data = bytearray(backend.read(name))
    middle = len(data) // 2
    data[middle:middle + 8] = bytes(b ^ 0xFF for b in data[middle:middle + 8])  # same length
    backend.write(name, bytes(data))


def truncate(backend, name: str) -> None:
    data = backend.read(name)
    backend.write(name, data[: len(data) // 2])


def edit_manifest(backend, step: str, old: bytes, new: bytes) -> None:
    manifest = backend.read(f"{step}/manifest.json")
    assert old in manifest
    backend.write(f"{step}/manifest.json", manifest.replace(old, new))


CORRUPTIONS = {
    "flipped state.pt": (lambda b, step: flip_bytes(b, f"{step}/state.pt"), "sha256"),
    "truncated state.pt": (lambda b, step: truncate(b, f"{step}/state.pt"), "bytes"),
    "truncated config.yaml": (lambda b, step: truncate(b, f"{step}/config.yaml"), "bytes"),
    "deleted state.pt": (lambda b, step: b.delete(f"{step}/state.pt"), "state.pt is missing"),
    "garbled manifest": (lambda b, step: b.write(f"{step}/manifest.json", b"{not json"), "unreadable"),
    "manifest of another step": (lambda b, step: edit_manifest(b, step, b'"step": 200', b'"step": 201'),
                                 "is of step 201, not 200"),
    "manifest of an unknown format": (lambda b, step: edit_manifest(b, step, b'"format": 1', b'"format": 2'),
                                      "has format 2; this version reads format 1"),
}


@pytest.mark.parametrize("corruption", list(CORRUPTIONS))
def test_corrupted_newest_checkpoint_is_skipped_with_a_warning(backend, caplog, corruption):
    damage, why = CORRUPTIONS[corruption]
    store = backend.open()
    store.save(100, make_state(100), CONFIG_YAML)
    newest = store.save(200, make_state(200), CONFIG_YAML)
    damage(backend, "step-000000200")

    with caplog.at_level(logging.WARNING, logger="transientvod.checkpoint"):
        loaded = store.load_latest()

    assert loaded.step == 100
    assert_state_equal(loaded.state, make_state(100))
    warnings = corruption_warnings(caplog)
    assert len(warnings) == 1
    assert newest in warnings[0] and "corrupted" in warnings[0] and why in warnings[0]
    assert "skipping it" in warnings[0]


def test_all_checkpoints_corrupted_gives_none_with_a_warning_for_each(backend, caplog):
    store = backend.open()
    locations = [store.save(step, make_state(step), CONFIG_YAML) for step in (100, 200)]
    for step in (100, 200):
        flip_bytes(backend, f"step-{step:09d}/state.pt")
    with caplog.at_level(logging.WARNING, logger="transientvod.checkpoint"):
        assert store.load_latest() is None
    warnings = corruption_warnings(caplog)
    assert len(warnings) == 2
    assert locations[1] in warnings[0] and locations[0] in warnings[1]


def test_step_without_manifest_is_damage_where_steps_appear_whole_and_work_in_progress_elsewhere(backend, caplog):
    # A directory is renamed into place whole, so one without its manifest was damaged later;
    # S3 and GCS objects appear one by one, so one without its manifest is still being written.
    store = backend.open()
    store.save(100, make_state(100), CONFIG_YAML)
    newest = store.save(200, make_state(200), CONFIG_YAML)
    backend.delete("step-000000200/manifest.json")

    with caplog.at_level(logging.WARNING, logger="transientvod.checkpoint"):
        assert store.steps() == [100]
        assert store.load_latest().step == 100

    warnings = corruption_warnings(caplog)
    if store.steps_appear_whole:
        assert len(warnings) == 1
        assert newest in warnings[0] and "manifest.json is missing" in warnings[0] and "skipping it" in warnings[0]
    else:
        assert warnings == []
