"""The launcher's replay clock waits for a worker on every host, and keeps the first host
state fresh meanwhile, so that discovery never calls a slowly starting cluster's state stale."""
from __future__ import annotations

import time

import yaml

from conftest import wait_until
from transientvod.config import config_from_yaml
from transientvod.head import spot_watcher
from transientvod.spot.hosts import NOTICED, USABLE, read_host_state, register_worker


def replay_config(tmp_path):
    return config_from_yaml(yaml.safe_dump({
        "run": {"name": "replay", "output_dir": str(tmp_path / "runs")},
        # worker-0 of this run is revoked at 941.8 s; its notice comes 1 s of real time (x100)
        # after the clock starts.
        "spot": {"provider": "trace", "trace": "k80_spot_2workers_vm_trace.csv", "trace_run": "spot2-us-east1-c-run1",
                 "hosts": "hostA,hostB", "time_scale": 100.0, "start_at": 811.8, "poll_seconds": 0.1}}), "test")


def test_first_state_is_refreshed_until_every_host_has_a_worker(tmp_path, monkeypatch):
    monkeypatch.setattr(spot_watcher, "STATE_REFRESH_SECONDS", 0.3)
    config = replay_config(tmp_path)
    _, stop = spot_watcher.start_spot_watcher(config)
    try:
        state_file = config.host_state_file
        first = read_host_state(state_file)
        assert [(h.name, h.state) for h in first.hosts] == [("hostA", USABLE), ("hostB", USABLE)]
        # Only hostA has a worker: the replay must not start, but the state must stay fresh.
        register_worker(state_file, "hostA", 1)
        wait_until(lambda: read_host_state(state_file).written_at > first.written_at, 10, "a refreshed state")
        refreshed = read_host_state(state_file).written_at
        time.sleep(2.0)  # twice the notice's delay, had the clock started
        waiting = read_host_state(state_file)
        assert [(h.name, h.state) for h in waiting.hosts] == [("hostA", USABLE), ("hostB", USABLE)]
        assert waiting.written_at > refreshed + 1.0, "the first state must go on being rewritten"

        register_worker(state_file, "hostB", 2)
        registered = time.time()
        wait_until(lambda: any(h.state == NOTICED for h in read_host_state(state_file).hosts), 10, "the notice")
        assert time.time() - registered >= 0.9, "the clock must start when the last host got its worker"
    finally:
        stop.set()
