"""The learning-rate rule and the disjoint shard sampler, without a cluster.

A single-process `hvd.init()` (world size 1) is real Horovod; the shard layout for other
world sizes is computed by the same `reshard` that the reset callback calls.
"""
import math

import horovod.torch as hvd
import pytest
import torch

from transientvod.gradients.staleness import StalenessRule

from transientvod.worker.commit import CommitPolicy, NO_VOTE, Vote

from transientvod.worker.schedule import LearningRateRule

from transientvod.worker.state import ShardSampler


@pytest.fixture(scope="module", autouse=True)
def horovod_single_process():
    hvd.init()
    yield


def dataset(n):
    return torch.utils.data.TensorDataset(torch.arange(n))


@pytest.mark.parametrize("n, world", [(1437, 2), (1437, 3), (100, 4), (7, 2)])
def test_shards_are_disjoint_and_cover_all_but_the_remainder(n, world):
    sampler = ShardSampler(dataset(n), shuffle=True, seed=3)
    shards = []
    for rank in range(world):
        sampler.reshard(world, rank)
        shards.append(list(iter(sampler)))
    assert len({len(s) for s in shards}) == 1, "every rank must run the same number of batches"
    seen = [i for s in shards for i in s]
    assert len(seen) == len(set(seen)), "shards overlap"
    assert n - len(seen) < world, "more than the remainder was dropped"


def test_reshard_after_progress_covers_only_the_rest():
    sampler = ShardSampler(dataset(200), shuffle=True, seed=0)
    sampler.reshard(2, 0)
    first_half = set(list(iter(sampler))[:25])
    sampler.reshard(2, 1)
    first_half |= set(list(iter(sampler))[:25])
    sampler.record_batch(0, 25)  # both ranks processed 25 samples
    rest = set()
    for rank in range(3):  # the cluster grew to 3 mid-epoch
        sampler.reshard(3, rank)
        rest |= set(iter(sampler))
    assert not rest & first_half, "processed samples were handed out again"
    assert len(rest) == 150


def test_epochs_reshuffle():
    sampler = ShardSampler(dataset(50), shuffle=True, seed=0)
    sampler.reshard(1, 0)
    first = list(iter(sampler))
    sampler.set_epoch(1)
    assert sorted(first) == sorted(iter(sampler)) and first != list(iter(sampler))


def rule(**kw):
    args = dict(base_lr=0.1, scaling="linear", warmup_steps=10, schedule="constant", total_steps=1000)
    args.update(kw)
    return LearningRateRule(**args)


def test_linear_scaling_with_warmup_at_start():
    r = rule()
    ramp = r.start_ramp(world_size=4, step=0)
    assert r.lr(ramp, 0) == pytest.approx(0.1)
    assert r.lr(ramp, 5) == pytest.approx(0.1 * 2.5)
    assert r.lr(ramp, 10) == pytest.approx(0.4)
    assert r.lr(ramp, 500) == pytest.approx(0.4)


def test_shrink_drops_at_once_and_growth_ramps():
    r = rule()
    ramp = r.start_ramp(2, 0)
    ramp = r.resize_ramp(ramp, 1, step=100)
    assert r.lr(ramp, 100) == pytest.approx(0.1)
    ramp = r.resize_ramp(ramp, 2, step=200)
    assert r.lr(ramp, 200) == pytest.approx(0.1)
    assert r.lr(ramp, 205) == pytest.approx(0.15)
    assert r.lr(ramp, 210) == pytest.approx(0.2)


def test_growth_during_a_ramp_starts_from_the_current_rate():
    r = rule()
    ramp = r.start_ramp(2, 0)
    ramp = r.resize_ramp(ramp, 4, step=5)  # the rate was 0.15 at step 5
    assert r.lr(ramp, 5) == pytest.approx(0.15)
    assert r.lr(ramp, 15) == pytest.approx(0.4)


def test_no_scaling_and_cosine_decay():
    r = rule(scaling="none", schedule="cosine", warmup_steps=0)
    ramp = r.start_ramp(8, 0)
    assert r.lr(ramp, 0) == pytest.approx(0.1)
    assert r.lr(ramp, 500) == pytest.approx(0.05)
    assert r.lr(ramp, 1000) == pytest.approx(0.0, abs=1e-12)
    assert r.lr(ramp, 250) == pytest.approx(0.1 * 0.5 * (1 + math.cos(math.pi / 4)))


@pytest.mark.parametrize("staleness, stale_momentum", [(1, 0.4), (2, 0.9 - 2 / 3), (4, 0.1), (9, 0.0)])
def test_staleness_lowers_momentum_by_s_over_s_plus_1_after_the_synchronous_steps(staleness, stale_momentum):
    r = StalenessRule(staleness, momentum=0.9, stale_momentum=True, stale_from_step=100)
    assert [r.delay(step) for step in (0, 99, 100, 5000)] == [0, 0, staleness, staleness]
    assert r.momentum_at(99) == 0.9
    assert r.momentum_at(100) == pytest.approx(stale_momentum)
    assert r.momentum_at(5000) == pytest.approx(stale_momentum)


def test_synchronous_training_and_the_opt_out_keep_the_momentum():
    assert StalenessRule(0, 0.9).momentum_at(10) == 0.9
    assert StalenessRule(2, 0.9, stale_momentum=False).momentum_at(10) == 0.9
    assert StalenessRule(2, 0.9, stale_from_step=0).delay(0) == 2


@pytest.mark.parametrize("kw, match", [(dict(base_lr=0), "positive"), (dict(scaling="sqrt"), "linear"),
                                       (dict(schedule="step"), "cosine")])
def test_rule_rejects_bad_hyperparameters(kw, match):
    with pytest.raises(ValueError, match=match):
        rule(**kw)


# -- the commit policy -----------------------------------------------------------------------------

def decisions(policy: CommitPolicy, votes: dict[int, Vote], steps: range) -> dict[int, tuple[bool, bool, bool]]:
    """step -> (commit, durable, first_notice), for the steps where anything happens."""
    out = {}
    for step in steps:
        d = policy.decide(step, votes.get(step, NO_VOTE))
        if d.commit or d.durable or d.first_notice:
            out[step] = (d.commit, d.durable, d.first_notice)
    return out


def test_policy_commits_every_commit_every_and_checkpoints_every_checkpoint_every_and_at_the_end():
    policy = CommitPolicy(commit_every=10, checkpoint_every=30, total_steps=65)
    assert decisions(policy, {}, range(1, 66)) == {
        10: (True, False, False), 20: (True, False, False), 30: (True, True, False), 40: (True, False, False),
        50: (True, False, False), 60: (True, True, False), 65: (True, True, False)}


def test_a_host_update_commits_at_once_and_is_not_treated_as_a_notice():
    # A host joining (or leaving through discovery) takes effect at the next step; no durable
    # checkpoint, no notice log line: nothing is about to be lost.
    policy = CommitPolicy(commit_every=50, checkpoint_every=500, total_steps=1000)
    votes = {7: Vote(hosts_update=True), 8: Vote(hosts_update=True)}
    assert decisions(policy, votes, range(1, 50)) == {7: (True, False, False), 8: (True, False, False)}


def test_a_notice_commits_every_step_and_checkpoints_once_per_ring():
    policy = CommitPolicy(commit_every=50, checkpoint_every=500, total_steps=1000)
    votes = {step: Vote(notice=True) for step in range(12, 16)}
    assert decisions(policy, votes, range(1, 20)) == {
        12: (True, True, True), 13: (True, False, False), 14: (True, False, False), 15: (True, False, False)}
    # After the host left, the ring re-forms; a later notice is news again.
    policy.ring_started()
    assert decisions(policy, {30: Vote(notice=True)}, range(30, 31)) == {30: (True, True, True)}


def test_the_budget_commits_checkpoints_and_stops_at_the_step_of_its_vote():
    policy = CommitPolicy(commit_every=50, checkpoint_every=500, total_steps=1000)
    stops = [step for step in range(1, 20) if policy.decide(step, Vote(budget=step == 7)).stop]
    assert stops == [7]
    policy = CommitPolicy(commit_every=50, checkpoint_every=500, total_steps=1000)
    assert decisions(policy, {7: Vote(budget=True)}, range(1, 8)) == {7: (True, True, False)}
    # With a notice at the same step: the same durable commit, still a stop.
    decision = CommitPolicy(50, 500, 1000).decide(7, Vote(notice=True, budget=True))
    assert (decision.commit, decision.durable, decision.first_notice, decision.stop) == (True, True, True, True)
    assert not CommitPolicy(50, 500, 1000).decide(50, NO_VOTE).stop
