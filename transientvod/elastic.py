"""Elastic state for transient servers: what survives a lost worker, and what follows the
number of *active* workers after Horovod resets the job.

Horovod's elastic mode (`hvd.elastic.run`) recovers from two events, and this module
only adds bookkeeping and policy on top of its machinery:

- `HostsUpdatedInterrupt`: discovery added or removed hosts. Raised at the next
  `state.commit()`, right after the state was saved, so a graceful removal loses no steps.
- `HorovodInternalError`: a peer died mid-collective (revoked without notice, SIGKILL).
  Survivors `restore()` the last commit, so they lose the steps since that commit.

When to commit, and which commits become durable checkpoints, is `CommitPolicy`'s to say
(every `commit_every` steps; at once for a pending host update; every step after an
interruption notice). After either event, Horovod re-forms the ring and calls our reset callbacks; `TransientState`
records what was lost and how long recovery took, the learning rate is rescaled to the new
world size, and the sampler re-shards the rest of the epoch among the active workers.
"""
from __future__ import annotations

import logging
import math
import os
import random
import time
from dataclasses import dataclass

import torch

import horovod.torch as hvd
from horovod.common.exceptions import HostsUpdatedInterrupt
from horovod.torch.elastic import ElasticSampler, TorchState

from transientvod.horovod_wait import broadcast_parameters, wait

log = logging.getLogger(__name__)

# How long one collective may wait on a silent peer before the survivors treat it as lost.
# A server that vanishes (revoked, its link gone) sends no FIN or RST: without this bound the
# survivors wait out Gloo's 30 s. It is our Horovod build's HOROVOD_GLOO_OP_TIMEOUT_SECONDS
# (launch/horovod-0.28.1-transient.patch), which leaves the rendezvous, where a new worker may
# still be starting, at HOROVOD_GLOO_TIMEOUT_SECONDS. Gloo ring-allreduces in segments of at
# most 1 MB, so a healthy ring never waits this long, but a broadcast sends each tensor whole:
# raise it (set the variable) if your largest tensor takes longer than this on your links.
COLLECTIVE_TIMEOUT_SECONDS = 5


def bound_collective_waits() -> None:
    """Call before hvd.init(): the collective timeout above, unless the user set one."""
    os.environ.setdefault("HOROVOD_GLOO_OP_TIMEOUT_SECONDS", str(COLLECTIVE_TIMEOUT_SECONDS))


def network_address() -> str:
    """The IPv4 address of the interface Gloo uses (HOROVOD_GLOO_IFACE), for the job's logs."""
    import psutil  # Horovod's own dependency

    iface = os.environ.get("HOROVOD_GLOO_IFACE", "")
    for address in psutil.net_if_addrs().get(iface, []):
        if address.family.name == "AF_INET":
            return address.address
    return "?"


class ShardSampler(ElasticSampler):
    """Horovod's `ElasticSampler`, but every rank's shard is disjoint.

    The parent pads the index list so it divides evenly, which makes a few samples appear on
    two ranks. We drop the remainder instead (at most world_size - 1 samples of an epoch,
    different ones each epoch since the order is reshuffled), so shards are disjoint, cover
    all but that remainder, and every rank still runs the same number of batches (a rank
    with one batch more would wait forever in its allreduce).
    """

    def reset(self):
        self.reshard(hvd.size(), hvd.rank())

    def reshard(self, num_replicas: int, rank: int) -> None:
        """Split what is left of this epoch among `num_replicas` workers; this one is `rank`."""
        self.num_replicas = num_replicas
        self.rank = rank
        order = list(range(len(self.dataset)))
        if self.shuffle:
            # The same seed on every rank gives every rank the same permutation.
            random.Random(self.seed + self.epoch).shuffle(order)
        self.remaining_indices = order[self.processed_num:]
        self.num_samples = len(self.remaining_indices) // num_replicas
        self.total_size = self.num_samples * num_replicas

    def __iter__(self):
        self.indices = self.remaining_indices[self.rank:self.total_size:self.num_replicas]
        return iter(self.indices)

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        # Every rank processed a batch of this size; the parent counts the same way.
        self.processed_num += batch_size * self.num_replicas


class LearningRateRule:
    """The learning rate as a function of step and the number of active workers.

    Linear scaling (Goyal et al. 2017): with n workers averaging gradients, the global batch is
    n times larger, so the rate is n times one worker's rate. A jump to a larger rate is ramped
    linearly over `warmup_steps` (at the start, and whenever the cluster grows); a shrinking
    cluster drops to the smaller rate at once. On top, an optional cosine decay to 0 at `total_steps`.
    The ramp's position lives in `TransientState` (`lr_ramp`), so a rank that joins later
    computes the same rate as everyone else after Horovod's sync.
    """

    __slots__ = ("base_lr", "scaling", "warmup_steps", "schedule", "total_steps")

    def __init__(self, base_lr: float, scaling: str, warmup_steps: int, schedule: str, total_steps: int):
        if base_lr <= 0:
            raise ValueError(f"base_lr is {base_lr}; a learning rate must be positive.")
        if scaling not in ("linear", "none"):
            raise ValueError(f"scaling is {scaling!r}; it must be 'linear' or 'none'.")
        if schedule not in ("cosine", "constant"):
            raise ValueError(f"schedule is {schedule!r}; it must be 'cosine' or 'constant'.")
        self.base_lr = base_lr
        self.scaling = scaling
        self.warmup_steps = warmup_steps
        self.schedule = schedule
        self.total_steps = total_steps

    def target_factor(self, world_size: int) -> float:
        return float(world_size) if self.scaling == "linear" else 1.0

    def start_ramp(self, world_size: int, step: int) -> tuple[float, float, int]:
        """The ramp at job start: from one worker's rate to the scaled one."""
        return (1.0, self.target_factor(world_size), step)

    def resize_ramp(self, ramp: tuple[float, float, int], world_size: int, step: int) -> tuple[float, float, int]:
        """The ramp after the cluster changed size at `step`."""
        now = self.factor(ramp, step)
        target = self.target_factor(world_size)
        if target > now:
            return (now, target, step)
        return (target, target, step)

    def factor(self, ramp: tuple[float, float, int], step: int) -> float:
        start_factor, target, ramp_start = ramp
        if self.warmup_steps == 0 or step >= ramp_start + self.warmup_steps:
            return target
        progress = max(0, step - ramp_start) / self.warmup_steps
        return start_factor + (target - start_factor) * progress

    def lr(self, ramp: tuple[float, float, int], step: int) -> float:
        decay = 1.0
        if self.schedule == "cosine":
            decay = 0.5 * (1.0 + math.cos(math.pi * min(step, self.total_steps) / self.total_steps))
        return self.base_lr * self.factor(ramp, step) * decay


class StalenessRule:
    """What bounded staleness s does to the optimizer, as a function of the step.

    A gradient applied s steps after it was computed acts like extra momentum: the parameters
    keep moving along old gradients for s steps before any correction arrives ("asynchrony
    begets momentum", Mitliagkas et al. 2016, about s / (s + 1) of it). On top of SGD's own
    momentum 0.9 that makes deep networks diverge: ResNet-32 on the digits, 4 workers, s = 2,
    blew up within 20 steps with momentum 0.9 and trained with 0.9 - 2/3. So while stale the
    optimizer's momentum is lowered by s / (s + 1), to no less than 0 (`stale_momentum`).
    The first steps, while the learning rate ramps up and the gradients are largest, run
    synchronously (`stale_from_step`, the warm-up by default): delayed, they overshoot before
    any feedback arrives. Every rank computes the same values from the step alone, so a rank
    that joins later or a job that resumes agrees with the others.
    """

    __slots__ = ("staleness", "momentum", "stale_momentum", "stale_from_step")

    def __init__(self, staleness: int, momentum: float, stale_momentum: bool = True, stale_from_step: int = 0):
        self.staleness = staleness
        self.momentum = momentum
        self.stale_momentum = stale_momentum
        self.stale_from_step = stale_from_step

    def delay(self, step: int) -> int:
        """The staleness at `step`: 0 before `stale_from_step`, then s."""
        return self.staleness if step >= self.stale_from_step else 0

    def momentum_at(self, step: int) -> float:
        return self.momentum_for(self.momentum, step)

    def momentum_for(self, momentum: float, step: int) -> float:
        """An optimizer's momentum at `step`: SGD's or RMSprop's `momentum`, or the Adam family's
        beta1 (schedule.py). Lowering beta1 alike won back part of what a delay of 2 costs AdamW
        (benchmarks/RESULTS.md, "AdamW under staleness"), not all of it."""
        if not self.stale_momentum or self.delay(step) == 0:
            return momentum
        return max(0.0, momentum - self.staleness / (self.staleness + 1))


@dataclass(frozen=True)
class Vote:
    """What the ranks asked for at the step before (CommitVote carries it): some
    rank saw an interruption notice, or rank 0 has a host update pending (Horovod tells only
    rank 0), or rank 0's cost meter projects the job's spend at its budget (only rank 0 keeps
    the bill). Every rank reads the same vote at the same step, so all decide alike."""
    notice: bool = False
    hosts_update: bool = False
    budget: bool = False


NO_VOTE = Vote()


@dataclass(frozen=True)
class CommitDecision:
    commit: bool  # state.commit(): the rollback point, where hosts join or leave
    durable: bool  # and rank 0 snapshots it for a durable checkpoint
    first_notice: bool  # the first commit since a notice reached the ring (worth a log line)
    stop: bool = False  # the budget is reached: commit, checkpoint durably, and end the job here


class CommitPolicy:
    """When the loop commits, and which commits are made durable. No Horovod, no I/O.

    - Every `commit_every` steps and at the last step: commit. Every `checkpoint_every` steps
      (a multiple of it) and at the last step: a durable checkpoint too.
    - A host update pending: commit at the next step, so that a host joins or leaves within a
      step instead of at the next `commit_every`. Nothing else changes: a host joining is not
      an emergency.
    - An interruption notice: a server is about to go, maybe rank 0's. Commit every step until
      it has left (a removal then loses nothing, and a kill at most one step), and make the
      first of those commits durable, once per ring.
    - The budget reached: commit, make it durable, and stop (every rank at the same step), the
      way a notice checkpoints, except that the job then ends.
    """

    def __init__(self, commit_every: int, checkpoint_every: int, total_steps: int):
        self.commit_every = commit_every
        self.checkpoint_every = checkpoint_every
        self.total_steps = total_steps
        self.notice_checkpointed = False

    def ring_started(self) -> None:
        """On every (re)formed ring: a notice that comes now is news again."""
        self.notice_checkpointed = False

    def decide(self, step: int, vote: Vote = NO_VOTE) -> CommitDecision:
        last = step >= self.total_steps
        commit = last or step % self.commit_every == 0 or vote.notice or vote.hosts_update
        durable = commit and (last or step % self.checkpoint_every == 0)
        first_notice = vote.notice and not self.notice_checkpointed
        if first_notice:
            self.notice_checkpointed = True
            durable = True
        if vote.budget:
            return CommitDecision(True, True, first_notice, stop=True)
        return CommitDecision(commit, durable, first_notice)


# Rank 0 spaces the commit votes about this far apart (CommitVote): a notice or a host update
# then reaches every rank within this plus two steps. One vote a step is one more collective
# a step in Horovod's single background thread, which runs a step's collectives one at a time;
# ask less often and the exchange's own ops follow each other more closely. A notice comes
# 30 s (GCE) to 2 min (AWS) before the kill, so half a second of it is cheap. At most
# VOTE_STEPS_MAX steps apart, so that a job whose steps suddenly slow down (a straggler, a
# congested link) still hears of a notice within that many of its slow steps.
VOTE_SECONDS = 0.5
VOTE_STEPS_MAX = 8


class CommitVote:
    """"Does any rank want a commit, and why?", asked about every VOTE_SECONDS and answered
    at the next step.

    A notice seen by one rank (or a host update, which Horovod tells rank 0 alone) must make
    every rank commit at the same step, since a commit is a collective. A blocking allreduce
    cost one round trip on the ring each time; instead the flags (notice, host update) travel
    in an async allreduce (max) while the next step computes, and that step reads them as a
    `Vote`. Rank 0 also puts its budget verdict in each vote it starts (billing/budget.py's stop
    rule on its cost meter), so that every rank stops at the same step. It runs with notices off
    too (the notice flag is then always clear), so that a host joins or leaves soon after
    Horovod tells rank 0, not at the next commit_every.

    Which steps vote is decided by the votes themselves, so that every rank agrees: each vote
    also carries rank 0's proposal for the next voting step (the others send 0, and max takes
    rank 0's), from rank 0's own step time, so that votes are about `interval_seconds` apart
    but never more than VOTE_STEPS_MAX steps. A ring's first two steps vote (rank 0 has no
    step time before them), and so does every step with an interval of 0. Every rank reads
    the same answer at the same step, so all of them vote, and commit, together. After an
    answer with a notice or a host update, the ring votes every step again: a notice stays
    set, so the job then commits every step until the noticed host has left, and whether
    Horovod removes it gracefully or the cloud kills it first, nothing is lost.

    The op in flight belongs to the ring it was started on: after an elastic reset
    (HorovodInternalError or HostsUpdatedInterrupt) Horovod has shut that ring down, so
    `reset` (a reset callback) drops the handle, and `begin` makes the ring's first step vote
    on every rank (a new worker starts with none, like the rest).
    """

    __slots__ = ("_in_flight", "_name", "_next_step", "_asked", "interval_seconds", "waited_seconds", "votes")

    def __init__(self, interval_seconds: float = VOTE_SECONDS):
        self.interval_seconds = interval_seconds
        self._in_flight = None  # (step it was asked at, handle)
        self._name = "transientvod.commit_vote"
        self._next_step = 0  # the next step that votes
        self._asked = None  # rank 0: (step, time) of the last vote it started, for its step time
        self.waited_seconds = 0.0  # for the answers: ops queued ahead of a vote in Horovod delay it
        self.votes = 0  # started on this process, for the logs and tests

    def reset(self) -> None:
        self._in_flight = None
        self._asked = None

    def begin(self, ring_step: int) -> None:
        """Call where every rank starts on a (re)formed ring, with the step all of them hold.

        One name for the whole life of a ring, so that Horovod's response cache can know the
        op from the second vote on. (With a new name every step, notices on cost 13 ms a
        step on loopback; how much of that one name saves is not measured yet.) The ring's
        first step is in the name, equal on every rank, new or old, after the sync; a vote
        dropped by a reset can never share a name with one on the next ring."""
        self.reset()
        self._name = f"transientvod.commit_vote.{ring_step}"
        self._next_step = ring_step

    def exchange(self, step: int, notice: bool, hosts_update: bool, budget_reached=None) -> Vote:
        """At `step` (equal on every rank): return the answer to the vote in flight, if any
        (nothing on the first step after a start or a reset), and send this rank's flags if
        `step` is a voting step. At most one vote is in flight. `budget_reached`: a callable
        asked only when this rank starts a vote (rank 0 passes its meter's verdict), or None."""
        answer = self.finish()
        if step >= self._next_step:
            budget = budget_reached is not None and budget_reached()
            flags = torch.tensor([int(notice), int(hosts_update), int(budget), self._propose(step)])
            self._in_flight = step, hvd.allreduce_async(flags, op=hvd.Max, name=self._name)
            self.votes += 1
        return answer

    def _propose(self, step: int) -> int:
        """Rank 0's proposal for the step after `step` that votes next; 0 from the others."""
        if hvd.rank() != 0:
            return 0
        now = time.monotonic()
        asked, self._asked = self._asked, (step, now)
        if asked is None or self.interval_seconds <= 0:
            return step + 1
        step_seconds = (now - asked[1]) / max(1, step - asked[0])
        return step + min(VOTE_STEPS_MAX, max(1, round(self.interval_seconds / max(step_seconds, 1e-6))))

    def finish(self) -> Vote:
        """Wait for the vote in flight, if any, and return its answer."""
        if self._in_flight is None:
            return NO_VOTE
        (asked_at, handle), self._in_flight = self._in_flight, None
        began = time.perf_counter()
        notice, hosts_update, budget, next_step = wait([handle])[0].tolist()
        self.waited_seconds += time.perf_counter() - began
        # Every rank reads this same answer: the next voting step is the same on all of them.
        self._next_step = asked_at + 1 if notice or hosts_update or budget else next_step
        return Vote(notice=bool(notice), hosts_update=bool(hosts_update), budget=bool(budget))


# The synchronized attributes a durable checkpoint keeps besides model, optimizer and sampler.
PROGRESS = ("epoch", "step", "world_sizes", "revocations", "steps_lost", "lr_ramp",
            "started_at", "cost_ledger", "ledger_saved_at", "mlflow_run_id")


def check_same_model(model: torch.nn.Module) -> None:
    """Every rank built the same parameters (names and shapes), or TaskError on every rank.

    Horovod's sync would broadcast rank 0's parameters into tensors of other shapes: an
    error inside the ring, which elastic mode takes for a lost peer and retries without end.
    One allgather of each rank's list, before the sync, on every (re)start of the ring.
    """
    from transientvod.tasks import TaskError

    layout = [(name, tuple(p.shape)) for name, p in model.named_parameters()]
    layouts = hvd.allgather_object(layout, name="transientvod.model.layout")
    for rank, other in enumerate(layouts):
        if other == layouts[0]:
            continue
        differ = next(((a, b) for a, b in zip(layouts[0], other) if a != b), None)
        what = (f"its parameter {differ[1][0]} has shape {differ[1][1]} where rank 0's {differ[0][0]} has "
                f"{differ[0][1]}" if differ else f"it has {len(other)} parameters where rank 0 has {len(layouts[0])}")
        raise TaskError(f"rank {rank} built a different model from rank 0's ({what}); build_model must build "
                        "the same model on every rank (the same config, no rank- or host-dependent choices).")


class TransientState(TorchState):
    """`hvd.elastic.TorchState` plus what a transient cluster needs to account for.

    Extra synchronized attributes (committed and broadcast like any `ObjectState` value):
    `step`, `epoch`, `world_sizes` (every size the job has run at, in order), `revocations`
    (resets that lost a worker), `steps_lost` (steps redone after rollbacks), `lr_ramp`, and
    the job's books: `started_at` (unix time of the first start), `cost_ledger` (the cost
    meter's state, see billing/job.py), `ledger_saved_at` and `mlflow_run_id`.
    """

    def __init__(self, model, optimizer, sampler, lr_rule: LearningRateRule | None, policy: CommitPolicy, **kwargs):
        # `sampler` None: the data is the loop's own business (a library-mode script may have
        # no ElasticSampler). `lr_rule` None: the loop sets its own learning rate.
        super().__init__(model=model, optimizer=optimizer, sampler=sampler, epoch=0, step=0,
                         world_sizes=[], revocations=0, steps_lost=0, lr_ramp=(1.0, 1.0, 0),
                         started_at=0.0, cost_ledger={}, ledger_saved_at=0.0, mlflow_run_id="", **kwargs)
        # Not synchronized: the rules, and facts about this process's view of the current recovery.
        self.lr_rule = lr_rule
        self.policy = policy
        self._interrupted_at: float | None = None
        self._lost_now = 0
        self._worker_failed = False
        self.hosts_update_pending = False
        self.register_reset_callbacks([self._follow_active_workers])

    def sync(self):
        check_same_model(self.model)
        super().sync()
        # Horovod's broadcast_optimizer_state gives a *new* worker's empty optimizer its state
        # by taking one step with zero gradients, after the model was broadcast; with weight
        # decay (or any step that moves parameters) that step leaves the new rank's parameters
        # different from everyone else's for the rest of the run. Broadcast them once more
        # (waited for without spinning, horovod_wait.py).
        broadcast_parameters(self.model.state_dict(), root_rank=0)

    def on_hosts_updated(self, timestamp, update_res):
        # Called from Horovod's notification thread when discovery changed. The interrupt
        # itself waits for the next commit; this flag lets the loop commit sooner.
        self.hosts_update_pending = True
        super().on_hosts_updated(timestamp, update_res)

    # -- the two ways a recovery starts ----------------------------------------------------

    def check_host_updates(self):
        self.hosts_update_pending = False
        try:
            super().check_host_updates()
        except HostsUpdatedInterrupt:
            # Raised right after save(): nothing is lost, only the pause is counted.
            self._interrupted_at = time.monotonic()
            raise

    def restore(self):
        # A peer died mid-step (HorovodInternalError): go back to the last commit.
        steps_before = self.step
        super().restore()
        self._interrupted_at = time.monotonic()
        self._lost_now = steps_before - self.step
        self._worker_failed = True

    # -- after Horovod re-formed the ring ---------------------------------------------------

    def _follow_active_workers(self):
        """Reset callback: account for the recovery, rescale the rate, re-shard the data."""
        size = hvd.size()
        previous = self.world_sizes[-1] if self.world_sizes else size
        lost_worker = self._worker_failed or size < previous
        if lost_worker:
            self.revocations += 1
        self.steps_lost += self._lost_now
        if size != previous:
            if self.lr_rule is not None:
                self.lr_ramp = self.lr_rule.resize_ramp(self.lr_ramp, size, self.step)
            self.world_sizes = self.world_sizes + [size]
        # Re-shard now: after a removal-only update Horovod skips the sync that would do it.
        if self.sampler is not None:
            self.sampler.reset()
        # Commit the bookkeeping: Horovod's sync (which follows unless only hosts left)
        # broadcasts the *committed* values, which would undo what we just recorded. The rest
        # of the state is already the last commit (restored, or saved just before the interrupt).
        self.save()
        took = time.monotonic() - self._interrupted_at if self._interrupted_at else 0.0
        if hvd.rank() == 0:
            cause = "a worker failed" if self._worker_failed else "hosts changed"
            lr = f"; lr now {self.lr_rule.lr(self.lr_ramp, self.step):.5f}" if self.lr_rule is not None else ""
            log.info("recovered (%s): world size %d -> %d at step %d; lost %d steps; took %.1f s%s",
                     cause, previous, size, self.step, self._lost_now, took, lr)
        self._interrupted_at = None
        self._lost_now = 0
        self._worker_failed = False

    def begin(self, resumed: bool) -> None:
        """Set the first world size and ramp, unless a checkpoint or sync already did."""
        rule = self.lr_rule
        if not self.world_sizes:
            self.world_sizes = [hvd.size()]
            self.lr_ramp = rule.start_ramp(hvd.size(), self.step) if rule is not None else self.lr_ramp
        elif resumed and self.world_sizes[-1] != hvd.size():
            self.lr_ramp = rule.resize_ramp(self.lr_ramp, hvd.size(), self.step) if rule is not None else self.lr_ramp
            self.world_sizes = self.world_sizes + [hvd.size()]
        self.save()

    def current_lr(self) -> float:
        return self.lr_rule.lr(self.lr_ramp, self.step)

    # -- durable checkpoints ----------------------------------------------------------------

    def checkpoint_payload(self) -> dict:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "sampler": self.sampler.state_dict() if self.sampler is not None else None,
            "progress": {name: getattr(self, name) for name in PROGRESS},
        }

    def load_checkpoint_payload(self, payload: dict) -> None:
        self.model.load_state_dict(payload["model"])
        self.optimizer.load_state_dict(payload["optimizer"])
        if self.sampler is not None and payload["sampler"] is not None:
            self.sampler.load_state_dict(payload["sampler"])
        for name, value in payload["progress"].items():
            setattr(self, name, value)
        self.save()  # the checkpoint is now what a rollback returns to
