"""`transientvod.ElasticState`: `hvd.elastic.TorchState` for a script's own loop, with what the
task loop (train.py) gives its state: durable checkpoints, the interruption notice, the bill
and the MLflow run.

    state = transientvod.ElasticState(model, optimizer, sampler=sampler, epoch=0, batch=0)

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            for state.batch, (x, y) in enumerate(loader, ...):
                ...
                optimizer.step()
                if state.batch % batches_per_commit == 0 or state.commit_requested():
                    state.commit()          # in memory; durable every checkpoint.checkpoint_every steps
        return evaluate(model)

    accuracy = train(state)
    state.finish(test_accuracy=accuracy)    # the final checkpoint, the summary, the bill

Construction (after hvd.init()) reads the job's config (library/job.py), and rank 0 resumes
from the newest durable checkpoint in `checkpoint.dir` if there is one: model, optimizer,
sampler and every plain attribute given (epoch, batch, ...). Once a step, called by
`transientvod.DistributedOptimizer.step()` (or by the loop's `state.step_done()` with another
optimizer), the state counts the step, asks the ring whether any rank saw an interruption
notice or rank 0 a host update (commit.CommitVote, about every half second, answered a step
later), and rank 0 writes a progress row (`metrics.jsonl`, which `launch/local_hosts.py
--progress` reads) with the cost so far every `train.log_every` steps.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import time

import horovod.torch as hvd
from horovod.common.exceptions import HostsUpdatedInterrupt
from horovod.torch.elastic import ElasticSampler

from transientvod.checkpoint import open_store
from transientvod.checkpoint.writer import BackgroundCheckpointWriter
from transientvod.config import to_yaml
from transientvod.library.job import job_config
from transientvod.library.optimizer import DistributedOptimizer
from transientvod.worker.accounting import JobAccounting
from transientvod.worker.commit import CommitPolicy, CommitVote
from transientvod.worker.setup import (benchmark_delay, parameter_checksum, report_uncaught_errors,
                                       start_notice_watcher)
from transientvod.worker.state import TransientState

log = logging.getLogger(__name__)

OWN_HANDLERS = ("model", "optimizer", "sampler")  # TransientState's checkpoint keeps these already


def speak_for_the_job() -> None:
    """Show transientvod's INFO lines (recoveries, checkpoints, notices) on stderr, as the task
    loop's workers do, unless the script set up logging itself."""
    ours = logging.getLogger("transientvod")
    if not ours.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s: %(message)s"))
        ours.addHandler(handler)
        ours.setLevel(logging.INFO)


class ElasticState(TransientState):
    """Horovod's TorchState arguments: a model, an optimizer, and keyword attributes (an
    ElasticSampler, epoch, batch, ...), committed and synchronized as Horovod does.

    Besides `state.commit()`, the loop calls two things:

    - `state.commit_requested()`, once a step on every rank: True when the ring should commit
      now, because a server got its interruption notice (then the first such commit is also a
      durable checkpoint, and every step commits until the server has left, so its removal
      loses nothing) or hosts are joining or leaving (they do so at the commit).
    - `state.finish(**test_metrics)` after `train(state)` returned, on every rank: applies the
      gradients still in flight, writes the final durable checkpoint and, on rank 0, the
      summary (`summary.json`), the bill and the MLflow run's final metrics.

    `step` is the state's own: the number of optimizer steps (pass an attribute of your own
    under another name). The learning rate is the script's (a reset callback that scales it
    with hvd.size(), as Horovod's examples do).
    """

    def __init__(self, model=None, optimizer=None, **kwargs):
        if "step" in kwargs:
            raise ValueError("step is ElasticState's own count of optimizer steps; give your attribute another "
                             "name (batch, for example).")
        speak_for_the_job()
        config, record = job_config()
        report_uncaught_errors(record, os.path.abspath(sys.argv[0]))
        sampler_name = next((name for name, value in kwargs.items() if isinstance(value, ElasticSampler)), None)
        sampler = kwargs.pop(sampler_name) if sampler_name else None
        epoch = kwargs.pop("epoch", 0)
        t = config.train
        super().__init__(model, optimizer, sampler, None, CommitPolicy(t.commit_every, t.checkpoint_every, t.steps),
                         **kwargs)
        if sampler_name not in (None, "sampler"):
            setattr(self, sampler_name, sampler)  # the script's name for it; one handler, under "sampler"
        self.epoch = epoch
        self.config, self.record = config, record
        self.script_attributes = [name for name in kwargs if name not in self._handlers]
        self.commit_vote = CommitVote()
        self.register_reset_callbacks([self.commit_vote.reset, self._ring_ended])
        if isinstance(optimizer, DistributedOptimizer):
            optimizer.count_steps_in(self)
            self.register_reset_callbacks([optimizer.reset])
        self.store = open_store(config.checkpoint_dir, keep_last=config.checkpoint.keep_last)
        self.checkpoint_writer = BackgroundCheckpointWriter(self.store)
        self.books = JobAccounting(config, record)
        self._config_yaml = to_yaml(config)
        self._ring_began = False
        self._commit_requested = False
        self._durable_due = False
        self._notice_seen = False  # on this ring
        self._last_durable_step = 0
        self._resume()
        self.watcher = start_notice_watcher(config)
        self._delay = benchmark_delay()

    def _resume(self) -> None:
        """Rank 0 loads the newest durable checkpoint; Horovod's first sync hands it to the rest."""
        resumed = False
        if hvd.rank() == 0:
            checkpoint = self.store.load_latest()
            if checkpoint is not None:
                self.load_checkpoint_payload(checkpoint.state)
                resumed = True
                self._last_durable_step = self.step
                log.info("resumed from the durable checkpoint %s at step %d", checkpoint.location, self.step)
            self.books.begin(self, resumed)
        self.begin(resumed)

    # -- once a step --------------------------------------------------------------------------

    def step_done(self) -> None:
        """Count one optimizer step. transientvod.DistributedOptimizer calls this itself; a loop
        with another optimizer calls it after every optimizer.step(), on every rank."""
        self.step += 1
        self.after_step()

    def after_step(self) -> None:
        """The once-a-step work, after `step` counted this one (DistributedOptimizer.step)."""
        if not self._ring_began:
            self._begin_ring()
        if self._delay is not None:
            self._delay()
        noticed = self.watcher is not None and self.watcher.event.is_set()
        vote = self.commit_vote.exchange(self.step, noticed, self.hosts_update_pending)
        self._commit_requested = self._commit_requested or vote.notice or vote.hosts_update
        if vote.notice and not self._notice_seen:
            self._notice_seen = True
            self._durable_due = True
            if hvd.rank() == 0:
                log.info("interruption notice in the job at step %d: checkpointing now and committing every step "
                         "until the host has left", self.step)
        if hvd.rank() == 0 and self.step % self.config.train.log_every == 0:
            row = {"step": self.step, "world_size": hvd.size(), "epoch": self.epoch, "time": time.time()}
            self.books.on_log(self, row)
            self.record.append("metrics.jsonl", row)

    def commit_requested(self) -> bool:
        """True when the ring asks for a commit now (a notice, hosts joining or leaving); the
        same answer on every rank at the same step."""
        return self._commit_requested

    def _begin_ring(self) -> None:
        """The first step on a (re)formed ring, where every rank holds the same step."""
        self._ring_began = True
        self._notice_seen = False
        self.commit_vote.begin(self.step - 1)
        self.record.append("events.jsonl", {
            "event": "synced", "rank": hvd.rank(), "size": hvd.size(), "step": self.step - 1,
            "checksum": parameter_checksum(self.model), "pid": os.getpid(), "time": time.time(),
            "host": os.environ.get("HOROVOD_HOSTNAME", "")})
        self.books.after_sync(self)  # the bill follows the hosts now in the ring (a collective)

    def _ring_ended(self) -> None:
        self._ring_began = False
        self._commit_requested = False

    # -- commits --------------------------------------------------------------------------------

    def commit(self) -> None:
        """Commit in memory (Horovod's), first snapshotting a durable checkpoint when one is due:
        every `checkpoint.checkpoint_every` steps since the last, or the first commit after a
        notice. Raises HostsUpdatedInterrupt when hosts join or leave, as Horovod's does."""
        if self._durable_due or self.step - self._last_durable_step >= self.config.train.checkpoint_every:
            self._write_durable()
        self._commit_requested = False
        try:
            super().commit()
        except HostsUpdatedInterrupt:
            if isinstance(self.optimizer, DistributedOptimizer):
                self.optimizer.drain()  # every rank raises here, so the old ring is still whole
            raise

    def _write_durable(self) -> None:
        if hvd.rank() == 0:
            self.books.before_checkpoint(self)
            self.checkpoint_writer.submit(self.step, self.checkpoint_payload(), self._config_yaml)
        self._last_durable_step = self.step
        self._durable_due = False

    def sync(self) -> None:
        local = self.optimizer.local_steps() if isinstance(self.optimizer, DistributedOptimizer) else \
            contextlib.nullcontext()
        with local:
            super().sync()

    def checkpoint_payload(self) -> dict:
        payload = super().checkpoint_payload()
        payload["script"] = {name: getattr(self, name) for name in self.script_attributes}
        payload["handlers"] = {name: handler.value.state_dict() for name, handler in self._handlers.items()
                               if name not in OWN_HANDLERS}
        return payload

    def load_checkpoint_payload(self, payload: dict) -> None:
        for name, value in payload.get("script", {}).items():
            setattr(self, name, value)
        for name, state_dict in payload.get("handlers", {}).items():
            if name in self._handlers:
                self._handlers[name].value.load_state_dict(state_dict)
        super().load_checkpoint_payload(payload)  # and save(): a rollback returns here

    # -- the end --------------------------------------------------------------------------------

    def finish(self, **test_metrics: float) -> dict | None:
        """After the elastic run returned, on every rank: apply what is in flight, write the last
        durable checkpoint, and on rank 0 the summary with `test_metrics` (test_accuracy=0.97,
        for example), the bill and MLflow's final metrics. Returns the summary on rank 0."""
        if isinstance(self.optimizer, DistributedOptimizer):
            self.optimizer.drain()  # at staleness s, the last s steps' averages
        self.commit_vote.finish()  # every rank has the same vote in flight, or none
        if self.watcher is not None:
            self.watcher.stop()
        self._write_durable()
        # Every process: one that was rank 0 before a reset may still be writing.
        self.checkpoint_writer.wait()
        summary = None
        if hvd.rank() == 0:
            metrics = {name: float(value) for name, value in test_metrics.items()}
            summary = {"steps": self.step, "world_sizes_seen": self.world_sizes,
                       "revocations_survived": self.revocations, "steps_lost": self.steps_lost,
                       **({"test_accuracy": metrics["test_accuracy"]} if "test_accuracy" in metrics else {}),
                       "test_metrics": metrics, "checkpoint": self.store.location,
                       "parameter_checksum": parameter_checksum(self.model)}
            self.books.finish(self, summary)
            self.record.append("metrics.jsonl", {"step": self.step, **metrics, "cost_usd": summary["cost"]["cost_usd"]})
            self.record.write_summary(json.dumps(summary, indent=2) + "\n")
            log.info("finished %d steps; %s; cost $%.4f (on-demand $%.4f)", self.step,
                     ", ".join(f"{name} {value:.4f}" for name, value in metrics.items()) or "no test metrics",
                     summary["cost"]["cost_usd"], summary["cost"]["on_demand_usd"])
        self.record.close()
        return summary
