"""When the loop commits, and how every rank comes to decide alike.

`CommitPolicy` says when to commit and which commits become durable checkpoints (every
`commit_every` steps; at once for a pending host update; every step after an interruption
notice; a stop when the budget is reached). No Horovod, no I/O. `CommitVote` carries what the
ranks ask for (a notice, rank 0's pending host update, rank 0's budget) to every rank, on a
collective spaced about VOTE_SECONDS apart, so that every rank reads the same vote at the same
step.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

import horovod.torch as hvd

from transientvod.gradients.horovod_wait import wait

log = logging.getLogger(__name__)


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
