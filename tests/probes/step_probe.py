"""Run by tests/worker/test_train_step.py under `horovodrun -np N`: prints one JSON line per rank.

    horovodrun -np 2 -H localhost:2 --gloo python tests/probes/step_probe.py evaluate
    horovodrun -np 2 -H localhost:2 --gloo python tests/probes/step_probe.py vote
    horovodrun -np 2 -H localhost:2 --gloo python tests/probes/step_probe.py vote_cadence

evaluate: every rank holds the same parameters but its own BatchNorm running statistics (as
after training, where only gradients are averaged); the sharded `evaluate` must score exactly
what one process scores over the whole test split with rank 0's model.

vote: voting every step, the last rank sees a notice at step 5 and rank 0 has a host update
pending at step 7; every rank must hear of each, and only of it, one step later, and a reset
in between (the handle dropped, as Horovod's reset callbacks do) must not leave a stale answer
behind.

vote_cadence: votes about every half second, steps of 20 ms: which steps vote, and what each
step heard, on every rank; the last rank sees a notice from step 30 on (it stays set, as the
watcher's does).
"""
from __future__ import annotations

import json
import sys
import time
import zlib

import torch
from torch.utils.data import TensorDataset

import horovod.torch as hvd

from transientvod.config import ModelConfig
from transientvod.tasks.resnet.data import load_digits_dataset
from transientvod.tasks.resnet.models import build_model
from transientvod.worker.commit import CommitVote
from transientvod.worker.evaluation import count_correct, evaluate


def buffers_checksum(model: torch.nn.Module) -> int:
    crc = 0
    for buffer in model.buffers():
        crc = zlib.crc32(buffer.detach().contiguous().numpy().tobytes(), crc)
    return crc


def check_evaluate() -> dict:
    torch.manual_seed(0)
    data = load_digits_dataset()
    model = build_model(ModelConfig(depth=8, width=4), data.in_channels, data.num_classes)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    # Forward passes in training mode on this rank's own batches: the running statistics
    # drift apart per rank, the parameters stay equal.
    with torch.no_grad():
        for start in range(hvd.rank() * 64, hvd.rank() * 64 + 256, 32):
            model(data.train_x[start:start + 32])
    before = hvd.allgather_object(buffers_checksum(model))
    device = torch.device("cpu")
    sharded = evaluate(model, TensorDataset(data.test_x, data.test_y), device)["test_accuracy"]
    after = hvd.allgather_object(buffers_checksum(model))
    row = {"rank": hvd.rank(), "size": hvd.size(), "sharded": sharded,
           "buffers_differed_before": len(set(before)) > 1, "buffers_equal_after": len(set(after)) == 1}
    if hvd.rank() == 0:
        # One process, the whole split, rank 0's model: what rank 0 alone reported before.
        row["whole_split"] = count_correct(model, data.test_x, data.test_y, device) / len(data.test_y)
        row["test_samples"] = len(data.test_y)
    return row


def as_pairs(votes) -> list:
    return [[v.notice, v.hosts_update] for v in votes]


def as_triples(votes) -> list:
    return [[v.notice, v.hosts_update, v.budget] for v in votes]


def check_vote() -> dict:
    vote = CommitVote(interval_seconds=0)  # every step
    vote.begin(0)
    last = hvd.size() - 1
    # The last rank sees a notice at step 5; rank 0 has a host update pending at step 7, and
    # its meter says the budget is reached at step 9 (asked only by rank 0, as train.py does).
    asked = []

    def budget_reached(step: int):
        return lambda: asked.append(step) or step == 9

    answers = [vote.exchange(step, hvd.rank() == last and step == 5, hvd.rank() == 0 and step == 7,
                             budget_reached(step) if hvd.rank() == 0 else None)
               for step in range(1, 11)]
    vote.finish()
    # A vote in flight when the job resets is dropped, not read on the new ring. (A real
    # reset shuts Horovod down, which ends the dropped op; here it completes unread, and the
    # new ring's name, from its first step, keeps the next votes apart from it.)
    vote.exchange(11, True, True)
    vote.reset()
    vote.begin(21)
    after_reset = [vote.exchange(step, False, False) for step in (22, 23)]
    vote.finish()
    return {"rank": hvd.rank(), "answers": as_triples(answers), "after_reset": as_triples(after_reset),
            "budget_asked": asked}


def check_vote_cadence() -> dict:
    vote = CommitVote(interval_seconds=0.5)
    vote.begin(0)
    last = hvd.size() - 1
    answers, voted = [], []
    for step in range(1, 61):
        time.sleep(0.02)  # the step's compute
        before = vote.votes
        answers.append(vote.exchange(step, hvd.rank() == last and step >= 30, False))
        if vote.votes > before:
            voted.append(step)
    vote.finish()
    return {"rank": hvd.rank(), "answers": as_pairs(answers), "voted": voted}


def main() -> None:
    hvd.init()
    torch.set_num_threads(1)
    check = {"evaluate": check_evaluate, "vote": check_vote, "vote_cadence": check_vote_cadence}[sys.argv[1]]
    print(json.dumps(check()), flush=True)


if __name__ == "__main__":
    main()
