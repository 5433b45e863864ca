"""The worker's step path (transientvod/worker/train.py): sharded evaluation, the background
checkpoint in a job, the notice vote and how often it is asked. Real Horovod: single-process `hvd.init()`
for the pieces, `horovodrun` (Gloo) for what needs two ranks."""
from __future__ import annotations


import pytest
import torch

from conftest import explain, run_probe
from transientvod.checkpoint import LocalCheckpointStore
from transientvod.config import config_from_yaml
from transientvod.tasks.resnet.data import load_dataset
from transientvod.tasks.resnet.models import build_model
from transientvod.worker.evaluation import count_correct, evaluation_slice

# -- sharded evaluation -------------------------------------------------------------------------

@pytest.mark.parametrize("total", [0, 1, 2, 5, 359, 360, 10_000])
@pytest.mark.parametrize("size", [1, 2, 3, 7])
def test_evaluation_slices_are_disjoint_cover_the_split_and_differ_by_at_most_one(total, size):
    slices = [evaluation_slice(total, rank, size) for rank in range(size)]
    covered = [i for s in slices for i in range(total)[s]]
    assert covered == list(range(total))  # in order: contiguous, disjoint, complete
    lengths = [s.stop - s.start for s in slices]
    assert max(lengths) - min(lengths) <= 1


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
def test_sharded_accuracy_equals_one_process_scoring_the_whole_split(world):
    rows = run_probe("step_probe.py", world, "evaluate")
    assert sorted(r["rank"] for r in rows) == list(range(world))
    root = next(r for r in rows if r["rank"] == 0)
    assert all(r["buffers_differed_before"] for r in rows), "the probe did not make the ranks' buffers differ"
    assert all(r["buffers_equal_after"] for r in rows)
    assert {r["sharded"] for r in rows} == {root["whole_split"]}, rows
    assert 0.0 < root["whole_split"] < 1.0  # an untrained model: some right, some wrong


@pytest.mark.slow
def test_job_accuracy_is_its_last_checkpoint_scored_by_one_process(job):
    j = job("sharded", train={"steps": 120, "eval_every": 40, "commit_every": 10, "checkpoint_every": 50})
    done = j.run(j.discovery("0=localhost:1,127.0.0.1:1"))
    assert done.returncode == 0, explain(done)
    summary = j.summary()
    assert summary["world_sizes_seen"] == [2]
    evals = [r for r in j.rows("metrics.jsonl") if "test_accuracy" in r]
    assert [r["step"] for r in evals] == [40, 80, 120, 120]  # every eval_every steps, then the final one
    # Every log row carries rank 0's CPU seconds so far (benchmarks/exchange.py reads them).
    logged = [r for r in j.rows("metrics.jsonl") if "loss" in r]
    cpu = [r["cpu_s"] for r in logged]
    assert len(cpu) == 120 // 10 and 0 < cpu[0] < cpu[-1] and cpu == sorted(cpu), cpu
    # ... and the seconds it waited so far for the gradients and for the commit vote: running
    # totals, so never falling, and never more than the job's own time between its rows.
    for key in ("exchange_wait_s", "vote_wait_s"):
        waits = [r[key] for r in logged]
        assert waits == sorted(waits) and waits[0] >= 0, (key, waits)
        assert waits[-1] - waits[0] <= logged[-1]["time"] - logged[0]["time"], (key, waits)
    # The last checkpoint was written in the background; the job waited for it before its summary.
    last = LocalCheckpointStore(j.run_dir / "checkpoints").load_latest()
    assert last.step == 120
    config = config_from_yaml(last.config_yaml, "the checkpoint's config")
    data = load_dataset(config.data, seed=config.train.seed)
    model = build_model(config.model, data.in_channels, data.num_classes)
    model.load_state_dict(last.state["model"])
    whole_split = count_correct(model, data.test_x, data.test_y, torch.device("cpu")) / len(data.test_y)
    assert summary["test_accuracy"] == whole_split
    assert evals[-2]["test_accuracy"] == evals[-1]["test_accuracy"] == whole_split


# -- the notice vote ----------------------------------------------------------------------------

@pytest.mark.slow
def test_a_commit_wanted_by_one_rank_is_heard_by_every_rank_one_step_later():
    rows = run_probe("step_probe.py", 2, "vote")
    assert len(rows) == 2
    for row in rows:
        # A notice on the last rank at step 5, a host update on rank 0 at step 7, rank 0's
        # budget reached at step 9: each heard by every rank at the next step, as what it is.
        expected = [[step == 6, step == 8, step == 10] for step in range(1, 11)]
        assert row["answers"] == expected, row
        assert row["after_reset"] == [[False, False, False], [False, False, False]], row
    # Rank 0's meter is asked once per vote it starts (every step here), the others never.
    asked = {row["rank"]: row["budget_asked"] for row in rows}
    assert asked == {0: list(range(1, 11)), 1: []}, asked


@pytest.mark.slow
def test_votes_about_every_half_second_on_every_rank_alike_and_every_step_after_a_notice():
    from transientvod.worker.commit import VOTE_STEPS_MAX

    rows = run_probe("step_probe.py", 2, "vote_cadence")
    assert len(rows) == 2
    # Every rank votes at the same steps and hears the same answers: the cadence travels in
    # the votes themselves (rank 0's proposal), so no rank can ask alone.
    assert rows[0]["voted"] == rows[1]["voted"] and rows[0]["answers"] == rows[1]["answers"], rows
    voted, answers = rows[0]["voted"], rows[0]["answers"]
    # The ring's first two steps vote (before rank 0 has a step time); then, at 20 ms a step,
    # half a second is more than VOTE_STEPS_MAX steps, so the votes come VOTE_STEPS_MAX steps
    # apart (here 1, 2, 10, 18, 26). A slow step (the first allreduce's negotiation, a busy
    # machine) shortens a gap, so the test asserts the cap and far fewer votes than steps:
    # a ring voting every step would vote 29 times before the notice.
    heard = next(step for step, (notice, _) in enumerate(answers, start=1) if notice)
    before_notice = [step for step in voted if step < heard - 1]
    assert before_notice[:2] == [1, 2], voted
    assert all(b - a <= VOTE_STEPS_MAX for a, b in zip(before_notice, before_notice[1:])), voted
    assert len(before_notice) <= 10, voted
    # The notice, set from step 30 on, travels in the first vote from step 30 and is heard one
    # step later, within VOTE_STEPS_MAX steps of step 30 ...
    assert heard - 1 in voted and 30 <= heard - 1 < 30 + VOTE_STEPS_MAX, (heard, voted)
    assert not any(notice for notice, _ in answers[:heard - 1]), answers
    # ... and from then on every step votes and hears it (the job commits every step until
    # the noticed host has left).
    assert voted[voted.index(heard - 1):] == list(range(heard - 1, 61)), voted
    assert all(notice for notice, _ in answers[heard - 1:]), answers


def test_more_slots_than_gpus_is_one_sentence_before_nccl_refuses(monkeypatch):
    """A host given more slots than it has GPUs: the second slot would take a GPU that does not
    exist (or share one, which NCCL refuses deep in its setup). The GPU cannot exist on this
    machine, so torch's and Horovod's answers about it are stood in for."""
    import horovod.torch as hvd

    from transientvod.worker import setup as worker_setup
    from transientvod.config import ConfigError

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(hvd, "local_rank", lambda: 1)
    monkeypatch.setattr(hvd, "local_size", lambda: 2)
    config = config_from_yaml("train: {device: auto}", "the test")
    with pytest.raises(ConfigError) as raised:
        worker_setup.pick_device(config)
    message = str(raised.value)
    assert message == ("this host runs 2 slots but has 1 GPU(s); give it at most 1 slot(s) in the host "
                       "discovery (host:1) or set train.device to cpu."), message
