"""A task's code failing inside a real elastic job (horovodrun, 2 local hosts): the job stops,
the launcher prints the task's traceback once and one sentence, with the task's exit code.
What only the ring can see, a model built differently on different ranks, stops it the same way."""
from __future__ import annotations

import textwrap

import pytest

from conftest import explain

pytestmark = pytest.mark.slow

BOTH = "localhost:1,127.0.0.1:1"
TASK = """
import os
import torch
from torch.utils.data import TensorDataset

def build_datasets(config):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(600, 8, generator=g)
    y = (x[:, 0] > 0).long()
    return TensorDataset(x[:500], y[:500]), TensorDataset(x[500:], y[500:])

def build_model(config):
    return torch.nn.Linear(8, 2)
"""


def task_job(job, tmp_path, name: str, extra: str, **sections):
    task = tmp_path / f"{name}.py"
    task.write_text(textwrap.dedent(TASK + extra))
    return job(name, task=str(task), data={"batch_size": 8, "loader_workers": 0}, **sections)


@pytest.mark.parametrize("failing", ["every_rank", "rank1"])
def test_a_task_that_raises_mid_step_stops_the_job_with_its_traceback_once(job, tmp_path, failing):
    # Rank 1 alone is the hard case: without the launcher stepping in, rank 0 would roll back
    # and train on without it, and Horovod would bring rank 1's host back to fail again.
    who = "True" if failing == "every_rank" else 'os.environ.get("HOROVOD_RANK") == "1"'
    j = task_job(job, tmp_path, f"raises_{failing}", f"""
steps = 0
def loss_fn(output, target):
    global steps
    steps += 1
    if steps > 30 and {who}:
        raise ValueError("the task's own bug at its step " + str(steps))
    return torch.nn.functional.cross_entropy(output, target)
""")
    done = j.run(j.discovery(f"0={BOTH}"), timeout=120)
    log = done.stdout + done.stderr
    assert done.returncode == 3, explain(done)
    assert log.count("Traceback (most recent call last)") == 1, explain(done)
    assert "ValueError: the task's own bug at its step 31" in log, explain(done)
    assert "raise ValueError(\"the task's own bug" in log, "the traceback shows the task's own line"
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("transientvod: a training step in the task ") and "raised ValueError" in last, last
    assert f"{j.config['task'].rsplit('/', 1)[-1]}, line" in last and last.endswith("the job was stopped."), last
    assert not (j.run_dir / "summary.json").exists()


def test_a_model_built_differently_on_one_rank_stops_the_job_naming_the_parameter(job, tmp_path):
    # The launcher's own try builds rank 0's model (no HOROVOD_RANK there): only the ring sees this.
    j = task_job(job, tmp_path, "shapes", """
def build_model(config):
    hidden = 16 if os.environ.get("HOROVOD_RANK") == "1" else 8
    return torch.nn.Sequential(torch.nn.Linear(8, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 2))
""")
    done = j.run(j.discovery(f"0={BOTH}"), timeout=120)
    assert done.returncode == 3, explain(done)
    last = done.stderr.strip().splitlines()[-1]
    assert "rank 1 built a different model from rank 0's" in last, explain(done)
    assert "0.weight has shape (16, 8) where rank 0's 0.weight has (8, 8)" in last, last
    assert "build_model must build the same model on every rank" in last, last
    assert "Traceback" not in done.stdout + done.stderr, explain(done)


def test_a_checkpoint_of_another_model_stops_the_job_and_is_kept(job, tmp_path):
    # The same run name with a changed model: resuming must not train the new model from step 0
    # on the survivors and prune the old checkpoints away; the job stops and says why.
    first = task_job(job, tmp_path, "first", "", train={"steps": 60, "commit_every": 10, "checkpoint_every": 50})
    done = first.run(first.discovery(f"0={BOTH}"))
    assert done.returncode == 0, explain(done)
    saved = sorted(p.name for p in (first.run_dir / "checkpoints").iterdir())
    changed = task_job(job, tmp_path, "first", """
def build_model(config):
    return torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Linear(4, 2))
""")
    done = changed.run(changed.discovery(f"0={BOTH}"), timeout=120)
    assert done.returncode == 3, explain(done)
    last = done.stderr.strip().splitlines()[-1]
    assert "does not fit this job's model or optimizer" in last and "under another run.name" in last, last
    assert sorted(p.name for p in (first.run_dir / "checkpoints").iterdir()) == saved, "checkpoints were lost"


@pytest.mark.parametrize("codec, staleness", [("fp16", 0), ("int8", 2)])
def test_bf16_autocast_on_the_cpu_and_a_non_finite_step_is_skipped_on_every_rank(job, tmp_path, codec, staleness):
    # train.precision bf16: the task's forward pass and loss run under autocast; one step on
    # rank 1 alone makes an Inf gradient, which the exchange's flag skips on both ranks.
    j = task_job(job, tmp_path, f"bf16_{codec}", """
steps = 0
def loss_fn(output, target):
    global steps
    steps += 1
    if output.dtype != torch.bfloat16:
        raise TypeError(f"the forward pass ran in {output.dtype}, not under bf16 autocast")
    loss = torch.nn.functional.cross_entropy(output, target)
    if steps == 40 and os.environ.get("HOROVOD_RANK") == "1":
        return loss * float("inf")
    return loss
""", train={"steps": 150, "precision": "bf16"},
                 exchange={"codec": codec, "staleness": staleness, "min_compress_elements": 0, "compress_after": 0.0})
    done = j.run(j.discovery(f"0={BOTH}"), timeout=150)
    assert done.returncode == 0, explain(done)
    summary = j.summary()
    assert summary["steps"] == 150 and summary["steps_skipped_not_finite"] == 1, summary
    assert "NaN/Inf in step 39's gradients; skipped it on every rank" in done.stderr, explain(done)
    assert summary["test_accuracy"] > 0.9, summary  # the sign of one feature: learnt, not poisoned
