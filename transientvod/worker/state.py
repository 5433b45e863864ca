"""Elastic state for transient servers: what survives a lost worker, and what follows the
number of *active* workers after Horovod resets the job.

Horovod's elastic mode (`hvd.elastic.run`) recovers from two events, and this module
only adds bookkeeping and policy on top of its machinery:

- `HostsUpdatedInterrupt`: discovery added or removed hosts. Raised at the next
  `state.commit()`, right after the state was saved, so a graceful removal loses no steps.
- `HorovodInternalError`: a peer died mid-collective (revoked without notice, SIGKILL).
  Survivors `restore()` the last commit, so they lose the steps since that commit.

When to commit, and which commits become durable checkpoints, is `CommitPolicy`'s to say (commit.py)
(every `commit_every` steps; at once for a pending host update; every step after an
interruption notice). After either event, Horovod re-forms the ring and calls our reset callbacks; `TransientState`
records what was lost and how long recovery took, the learning rate is rescaled to the new
world size, and the sampler re-shards the rest of the epoch among the active workers.
"""
from __future__ import annotations

import logging
import os
import random
import time
from typing import TYPE_CHECKING

import torch

import horovod.torch as hvd
from horovod.common.exceptions import HostsUpdatedInterrupt
from horovod.torch.elastic import ElasticSampler, TorchState

from transientvod.gradients.horovod_wait import broadcast_parameters

if TYPE_CHECKING:
    from transientvod.worker.commit import CommitPolicy
    from transientvod.worker.schedule import LearningRateRule

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
