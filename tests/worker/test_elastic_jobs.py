"""Real elastic jobs: `transientvod train` -> `horovodrun --elastic` (Gloo) -> workers.

`localhost` and `127.0.0.1` are two hosts to Horovod, both on this machine, so a host can
leave or join without ssh. Nothing of Horovod is mocked.
"""
from __future__ import annotations

import os
import signal
import time

import pytest
import yaml

from conftest import BOTH, explain, wait_until

pytestmark = pytest.mark.slow

BASE_LR = 0.05


def test_host_removed_mid_run_job_shrinks_and_lr_follows(job):
    j = job("shrink", train={"steps": 400})
    done = j.run(j.discovery(f"0={BOTH}", "100=localhost:1"))
    assert done.returncode == 0, explain(done)
    summary = j.summary()
    assert summary["steps"] == 400
    assert summary["world_sizes_seen"] == [2, 1]
    assert summary["steps_lost"] == 0, "a host removed through discovery must not cost steps"
    assert summary["revocations_survived"] == 1
    rows = [r for r in j.rows("metrics.jsonl") if "lr" in r]
    assert {r["world_size"] for r in rows} == {1, 2}
    for r in rows:  # constant schedule, no warm-up: lr = one worker's lr x active workers
        assert r["lr"] == pytest.approx(BASE_LR * r["world_size"]), r
    first_small = min(r["step"] for r in rows if r["world_size"] == 1)
    assert first_small > 100, "the host left before discovery dropped it"
    assert all(r["world_size"] == 1 for r in rows if r["step"] >= first_small), "the host came back"
    assert "recovered (hosts changed): world size 2 -> 1" in done.stderr + done.stdout


def test_host_added_mid_run_new_worker_gets_synchronized_state(job):
    # One host at the start: name the interface, since Horovod cannot probe for a common one.
    j = job("grow", cluster={"np": 1, "network_interface": "lo"}, optimizer={"warmup_steps": 20},
            train={"steps": 400})
    done = j.run(j.discovery("0=localhost:1", f"60={BOTH}"))
    assert done.returncode == 0, explain(done)
    summary = j.summary()
    assert summary["steps"] == 400
    assert summary["world_sizes_seen"] == [1, 2]
    grown = [e for e in j.rows("events.jsonl") if e["size"] == 2]
    assert {e["rank"] for e in grown} == {0, 1}
    assert len({e["step"] for e in grown}) == 1
    assert len({e["checksum"] for e in grown}) == 1, f"ranks differ after the reset: {grown}"
    # Growth ramps the rate from 1x to 2x over warmup_steps instead of jumping. A metrics row
    # for step s reports the rate that step s used, which was computed at step s - 1.
    grow_step = grown[0]["step"]
    two = [r for r in j.rows("metrics.jsonl") if r.get("world_size") == 2]
    assert two
    for r in two:
        ramp = min(1.0, (r["step"] - 1 - grow_step) / 20)
        assert r["lr"] == pytest.approx(BASE_LR * (1 + ramp)), r
    assert any(r["lr"] < 2 * BASE_LR - 1e-9 for r in two), "no warm-up after growth"


@pytest.mark.parametrize("notices", ["on", "off"])
def test_host_joining_joins_within_steps_and_is_no_notice(job, tmp_path, notices):
    # The ranks vote every step, notices on or off, and a host update (Horovod tells rank 0
    # alone) rides that vote: the new host joins soon after the update instead of at the next
    # commit_every, and nothing treats it as an interruption notice (no extra durable
    # checkpoint, no notice log line). With notices on, the notice source reads a host-state
    # file that never has a notice.
    from transientvod.spot.hosts import HostState, HostStatus, write_host_state

    sections = {}
    if notices == "on":
        state_file = tmp_path / "hosts.json"
        write_host_state(state_file, HostState("test", time.time(),
                                               [HostStatus("localhost", 1), HostStatus("127.0.0.1", 1)]))
        sections = {"notices": {"source": "hoststate"}, "spot": {"state_file": str(state_file)}}
    j = job(f"join{notices}", cluster={"np": 1, "network_interface": "lo"},
            train={"steps": 600, "commit_every": 300, "checkpoint_every": 600}, **sections)
    done = j.run(j.discovery("0=localhost:1", f"60={BOTH}"))
    assert done.returncode == 0, explain(done)
    assert j.summary()["world_sizes_seen"] == [1, 2], explain(done)
    joined_at = min(e["step"] for e in j.rows("events.jsonl") if e["size"] == 2)
    print(f"discovery added the host at step 60; it joined at step {joined_at}")
    # Discovery is polled once a second, and steps take tens of ms: some steps pass before the
    # update reaches rank 0. Without the vote the host would wait for step 300.
    assert 60 <= joined_at < 300, f"the host joined at step {joined_at}; it waited for commit_every"
    log = done.stderr + done.stdout
    assert "interruption notice" not in log, explain(done)
    assert log.count("saved checkpoint") == 1, "only the last step's checkpoint was due"


@pytest.mark.parametrize("victim_rank", [1, 0], ids=["worker", "rank0"])
def test_worker_killed_mid_step_survivors_roll_back_and_finish(job, tmp_path, victim_rank):
    # Rank 0 is no special case: the study's system died with its master; this one must not.
    j = job("sigkill", train={"steps": 600})
    proc = j.start(j.discovery(f"0={BOTH}"), tmp_path / "sigkill.log")
    try:
        wait_until(lambda: j.last_step() >= 150, 120, "step 150", proc)
        victim = next(e for e in j.rows("events.jsonl") if e["rank"] == victim_rank)
        os.kill(victim["pid"], signal.SIGKILL)
        proc.wait(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    log = (tmp_path / "sigkill.log").read_text()
    assert proc.returncode == 0, log[-6000:]
    summary = j.summary()
    assert summary["steps"] == 600
    assert 1 in summary["world_sizes_seen"][1:]
    assert summary["revocations_survived"] >= 1
    assert 0 <= summary["steps_lost"] <= 10, "survivors must lose at most commit_every steps"
    assert "recovered (a worker failed)" in log


def test_whole_job_killed_then_restarted_resumes_from_checkpoint(job, tmp_path):
    j = job("restart", tracking={"enabled": True}, train={"steps": 500})
    discovery = j.discovery(f"0={BOTH}")
    proc = j.start(discovery, tmp_path / "first.log")
    checkpoints = j.run_dir / "checkpoints"
    try:
        wait_until(lambda: checkpoints.exists() and any(p.name >= "step-000000150" for p in checkpoints.iterdir()),
                 120, "a checkpoint at step 150", proc)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # every worker and the driver at once
        proc.wait(timeout=30)
    saved = max(int(p.name.split("-")[1]) for p in checkpoints.iterdir() if p.name.startswith("step-"))
    assert saved < 500
    first_run_events = len(j.rows("events.jsonl"))
    first_mlflow_run = yaml.safe_load((j.run_dir / "config.yaml").read_text())["tracking"]["run_id"]
    billed_before = [row["cost_usd"] for row in j.rows("metrics.jsonl") if "cost_usd" in row][-1]

    done = j.run(discovery)
    assert done.returncode == 0, explain(done)
    assert "resumed from the durable checkpoint" in done.stderr + done.stdout
    restarted = j.rows("events.jsonl")[first_run_events:]
    assert restarted and {e["step"] for e in restarted[:2]} == {saved}, restarted[:2]
    summary = j.summary()
    assert summary["steps"] == 500
    # One MLflow run for the whole job, and a bill that carried on from the checkpoint.
    assert summary["mlflow"]["run_id"] == first_mlflow_run
    assert summary["cost"]["cost_usd"] > billed_before
    hosts = [s["host"] for s in summary["cost"]["servers"]]
    assert sorted(hosts) == ["127.0.0.1", "127.0.0.1", "localhost", "localhost"], "old servers end, new ones start"


def test_demo_reaches_90_percent_after_losing_and_regaining_a_host():
    import subprocess
    import sys
    import json
    from conftest import REPO

    done = subprocess.run([sys.executable, "-m", "transientvod.cli", "demo", "--set", "run.output_dir=" +
                           str(REPO / "runs" / "test-demo")], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, explain(done)
    summary = json.loads((REPO / "runs" / "test-demo" / "demo" / "summary.json").read_text())
    assert summary["world_sizes_seen"] == [2, 1, 2]
    assert summary["test_accuracy"] >= 0.90
    assert "revocations survived  1" in done.stdout


def test_one_host_and_no_interface_named_is_one_sentence_naming_the_setting(job):
    """Horovod's elastic driver probes two hosts for their common network interface before it
    starts anyone; with one host up it waits out the elastic timeout. The launcher says which
    setting starts such a job instead of blaming capacity."""
    j = job("one-host", cluster={"min_np": 1, "max_np": 1, "elastic_timeout": 5})
    done = j.run(j.discovery("0=localhost:1"), timeout=120)
    assert done.returncode != 0, explain(done)
    assert ("transientvod: Horovod waited cluster.elastic_timeout (5 s) for two hosts to find their common "
            "network interface and fewer were up; name it in cluster.network_interface (lo for a job on this "
            "machine alone, else the hosts' own, for example eth0 or ens5) or start when two hosts are up."
            ) in done.stderr + done.stdout, explain(done)
    assert "fewer than cluster.min_np" not in done.stderr + done.stdout
    # and naming it starts the job on that one host
    j = job("one-host-lo", cluster={"min_np": 1, "max_np": 1, "network_interface": "lo"}, train={"steps": 30})
    done = j.run(j.discovery("0=localhost:1"), timeout=120)
    assert done.returncode == 0, explain(done)
    assert j.summary()["steps"] == 30
