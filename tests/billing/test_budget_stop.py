"""A real job (2 local slots through horovodrun, the digits) that its budget stops: rank 0's
cost meter votes, every rank commits at the same step, a durable checkpoint is written, the
launcher says so in one sentence and exits 4; a budget spent already is refused before
anything starts; a second `train` with a larger budget resumes from that checkpoint's step.

Prices: one on-demand "testbox" at $3600/h ($1 a second) per host, from a price table. Each
host's first minute is billed whole ($60), so two hosts have spent $120 as soon as the ring
forms, and the projection adds the lead (30 s of both: $60): $180, past a $150 budget at the
first vote (a ring's first step votes; the answer comes a step later), and short of $1000.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess

import pytest

from conftest import REPO, explain, job_environment

BOTH = "localhost:1,127.0.0.1:1"
STEPS = 40


def train(j, discovery: str, *extra: str, timeout: float = 240) -> subprocess.CompletedProcess:
    """`transientvod train` of the job with `extra` options (conftest's Job.run, plus options)."""
    proc = subprocess.Popen(j.argv(discovery) + list(extra), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=REPO, start_new_session=True, env=job_environment(j.step_seconds))
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # horovodrun and every worker with it
        stdout, stderr = proc.communicate()
        pytest.fail(f"the job did not end within {timeout} s\n{stdout[-3000:]}\n{stderr[-8000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


@pytest.fixture
def priced_job(job, tmp_path, monkeypatch):
    monkeypatch.delenv("TRANSIENTVOD_BUDGET_LEAD_SECONDS", raising=False)  # the default 30 s
    table = tmp_path / "prices.csv"
    table.write_text("instance_type,on_demand_usd_per_hour\ntestbox,3600\n")
    return job("budget", tracking={"enabled": True}, train={"steps": STEPS, "commit_every": 10, "checkpoint_every": 20, "log_every": 10},
               cost={"cloud": "aws", "market": "on-demand", "instance_type": "testbox", "price_table": str(table),
                     "budget_usd": 150.0})


@pytest.mark.slow
def test_a_job_stops_at_its_budget_with_a_durable_checkpoint_and_resumes_with_a_larger_one(priced_job):
    j = priced_job
    discovery = j.discovery(f"0={BOTH}")

    # -- the budget stops the job ------------------------------------------------------------
    done = train(j, discovery)
    assert done.returncode == 4, explain(done)
    summary = j.summary()
    stop = summary["budget_stop"]
    stopped_at = summary["steps"]
    assert 1 <= stopped_at < STEPS and stop["step"] == stopped_at
    checkpoints = j.run_dir / "checkpoints"
    assert (checkpoints / f"step-{stopped_at:09d}" / "manifest.json").exists()
    assert (checkpoints / "latest").read_text().strip() == f"step-{stopped_at:09d}"
    assert stop["budget_usd"] == 150.0 and stop["projected_usd"] >= 150.0
    assert stop["spent_usd"] == summary["cost"]["cost_usd"] and stop["spent_usd"] >= 120.0
    sentence = (f"transientvod: the job stopped at step {stopped_at} of {STEPS} because its projected spend "
                f"${stop['projected_usd']:.2f} reached its budget (cost.budget_usd) of $150.00: it spent "
                f"${stop['spent_usd']:.2f}, and its durable checkpoint of step {stopped_at} is in {checkpoints}; run "
                "train again with a larger cost.budget_usd to resume.")
    assert sentence in done.stdout.splitlines(), explain(done)
    # Rank 0 recorded no step past it (every rank left the loop at that step: the vote's answer
    # is read by all at once, and a rank that went on would have hung the job on its collectives).
    assert max(row["step"] for row in j.rows("metrics.jsonl")) <= stopped_at
    assert "test_accuracy" not in summary  # no final evaluation past the budget
    first_mlflow_run = summary["mlflow"]["run_id"]
    events = len(j.rows("events.jsonl"))

    # -- a budget spent already is refused before anything starts ----------------------------
    refused = train(j, discovery, "--budget", "100")
    assert refused.returncode == 2, explain(refused)
    spent = re.search(r"says it has spent \$(\d+\.\d\d) already", refused.stderr)
    assert spent and float(spent.group(1)) >= 120.0, explain(refused)
    assert refused.stderr.strip().splitlines()[-1] == (
        f"transientvod: the job's checkpoint of step {stopped_at} in {checkpoints} says it has spent "
        f"${spent.group(1)} already, its whole budget (cost.budget_usd) of $100.00 or more; run train again with a "
        "larger cost.budget_usd to resume."), explain(refused)
    assert "starting" not in refused.stdout and len(j.rows("events.jsonl")) == events  # no horovodrun, no worker

    # -- a larger budget resumes from the checkpoint and finishes ------------------------------
    resumed = train(j, discovery, "--budget", "1000")
    assert resumed.returncode == 0, explain(resumed)
    assert "resumed from the durable checkpoint" in resumed.stdout + resumed.stderr
    restarted = j.rows("events.jsonl")[events:]
    assert restarted and {e["step"] for e in restarted[:2]} == {stopped_at}, restarted[:2]
    summary = j.summary()
    assert summary["steps"] == STEPS and "budget_stop" not in summary
    assert summary["cost"]["cost_usd"] > stop["spent_usd"]  # the bill carried on from the ledger
    # ... in the same MLflow run: the budget left it KILLED, not FINISHED, so it is continued.
    assert summary["mlflow"]["run_id"] == first_mlflow_run
    assert "transientvod: job finished" in resumed.stdout


@pytest.mark.parametrize("option", [["--budget", "-1"], ["--budget", "0"], ["--set", "cost.budget_usd=0"]])
def test_a_budget_of_zero_or_less_is_one_sentence_and_nothing_starts(job, option):
    j = job("bad-budget")
    done = subprocess.run(j.argv(None) + option, capture_output=True, text=True, timeout=120, cwd=REPO,
                          env=job_environment())
    assert done.returncode == 2, explain(done)
    value = "-1.0" if option[1] == "-1" else "0.0"
    assert done.stderr.strip().splitlines() == [
        f"transientvod: {j.config_path} with overrides: cost.budget_usd is {value}; set it to the most the job may "
        "cost, a positive number of dollars (or null for no limit)."], explain(done)
    assert not j.run_dir.exists()  # no run directory, no MLflow store, no checkpoint
