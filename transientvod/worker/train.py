"""The worker program that `horovodrun` starts on every slot.

Run it through the launcher, which resolves the config and builds the horovodrun command::

    transientvod train --config configs/demo.yaml --discovery "python launch/local_hosts.py ..."

or by hand, with a resolved config::

    horovodrun --elastic -np 2 --min-np 1 --max-np 2 \\
        --host-discovery-script "python launch/local_hosts.py --hosts localhost:1,127.0.0.1:1" \\
        python -m transientvod.worker.train --config runs/demo/config.yaml

One loop with named phases: set up (data, model, optimizer, durable checkpoint), then
`hvd.elastic.run` trains until `train.steps`, committing every `commit_every` steps (the
point survivors roll back to, and where hosts may join or leave) and writing a durable
checkpoint every `checkpoint_every` steps. With `cost.budget_usd` set, rank 0's cost meter
votes to stop once the projected spend reaches it (billing/budget.py): every rank then
commits at the same step, rank 0 writes a durable checkpoint, and the job ends there (a later
`train` with a larger budget resumes from it; docs/budget.md). Rank 0 speaks for the job: it writes
`metrics.jsonl`, `events.jsonl` and, at the end, `summary.json` in the run directory (on the
launcher's disk through its channel, channel/, when the hosts share no disk with it).

Nothing on the step path waits for one rank alone: every rank evaluates its slice of the
test split (one allreduce of the counts); rank 0 only snapshots the state for a durable
checkpoint, and a thread writes it (checkpoint/writer.py); the commit vote, about every
half second, is an async allreduce read one step later (`commit.CommitVote`).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import sys
import time

import torch
from torch.utils.data import DataLoader

import horovod.torch as hvd
from horovod.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt

from transientvod.billing.prices import PriceError
from transientvod.channel.protocol import ChannelError, is_channel_url
from transientvod.channel.records import ChannelRecord, LocalRecord, fetch_config
from transientvod.channel.token import read_token
from transientvod.checkpoint import CheckpointError, open_store
from transientvod.checkpoint.shared_disk import SharedDiskError, check_marker_seen
from transientvod.checkpoint.writer import BackgroundCheckpointWriter
from transientvod.config import Config, ConfigError, config_from_yaml, load_config, to_yaml
from transientvod.gradients.bucket_tuning import BucketTuner, FixedCut, cuts
from transientvod.gradients.exchange import GradientExchange
from transientvod.gradients.synchronous import SynchronousStep
from transientvod.tasks import Task, TaskError, TaskFailed, load_task
from transientvod.tasks.resnet.data import DataError
from transientvod.tracking.store import TrackingError
from transientvod.worker.accounting import JobAccounting
from transientvod.worker.batches import batch_length, to_device
from transientvod.worker.commit import CommitPolicy, CommitVote
from transientvod.worker.evaluation import evaluate
from transientvod.worker.schedule import OptimizerSchedule
from transientvod.worker.setup import (benchmark_delay, parameter_checksum, pick_device, report_job_error,
                                       start_notice_watcher)
from transientvod.worker.state import ShardSampler, TransientState, bound_collective_waits, network_address

# The whole job stops (report_job_error): the task is wrong or its code raised, the checkpoint
# does not fit. 2: a setting for this host to fix.
STOPPED_EXIT = 3

log = logging.getLogger("transientvod.worker.train")


def build_exchange(config: Config, optimizer: torch.optim.Optimizer, model: torch.nn.Module,
                   schedule: OptimizerSchedule):
    """How gradients cross the ring (the stepper) and how its buckets are cut (the tuner)."""
    ex = config.exchange
    if ex.staleness == 0 and ex.codec == "none":
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
        return optimizer, SynchronousStep(optimizer), FixedCut()
    stepper = GradientExchange(optimizer, model.parameters(), staleness=ex.staleness, codec=ex.codec,
                               block=ex.block, min_compress_elements=ex.min_compress_elements,
                               bucket_elements=ex.bucket_elements,
                               compress_from_step=int(ex.compress_after * config.train.steps),
                               stale_from_step=schedule.staleness_rule.stale_from_step)
    # Unless the config sets the bucket size, each ring times the cuts and keeps the faster.
    sizes = cuts(stepper.params, ex.staleness)
    tuned_from = max(stepper.compress_from_step, stepper.stale_from_step)  # compressed and stale from here
    tuner = (FixedCut() if ex.bucket_elements is not None or len(sizes) == 1 else
             BucketTuner(stepper, sizes, tuned_from, config.train.steps))
    if hvd.rank() == 0:
        log.info("gradient exchange: codec %s, staleness %d, %d bucket(s) of %s elements%s", ex.codec,
                 ex.staleness, len(stepper.buckets), ", ".join(f"{b.grad.numel():,}" for b in stepper.buckets),
                 "" if isinstance(tuner, FixedCut) else "; each ring times the other cut too and keeps the faster")
    return optimizer, stepper, tuner


def task_code(what: str, task: Task):
    """Run the task's own code: anything it raises (but Horovod's two recoveries) stops the
    job as TaskFailed, with the task's traceback."""
    return _TaskCode(what, task)


class _TaskCode:
    __slots__ = ("what", "task")

    def __init__(self, what: str, task: Task):
        self.what, self.task = what, task

    def __enter__(self):
        return self

    def __exit__(self, kind, error, tb):
        if error is None or isinstance(error, (HorovodInternalError, HostsUpdatedInterrupt, TaskError, TaskFailed,
                                               DataError)):
            return False
        if isinstance(error, Exception):
            raise TaskFailed(self.what, self.task.source, error) from error
        return False


def task_batches(loader: DataLoader, task: Task):
    """The loader's batches; an error reading the task's data set is the task's (TaskFailed)."""
    batches = iter(loader)
    while True:
        with task_code("reading the training set", task):
            try:
                batch = next(batches)
            except StopIteration:
                return
        yield batch


def train(config: Config, record) -> None:
    """`record` takes the run's records: files in the run directory (channel/records.py's LocalRecord),
    or the launcher's channel on hosts that share no disk with it (ChannelRecord)."""
    # -- phase 1: set up ------------------------------------------------------------------
    bound_collective_waits()  # a vanished peer costs seconds, not Gloo's 30 s
    task = load_task(config)
    hvd.init()
    device = pick_device(config)
    torch.manual_seed(config.train.seed)
    with task_code("build_datasets", task):
        train_set, test_set = task.build_datasets(config)
    with task_code("build_model", task):
        model = task.build_model(config).to(device)
    with task_code("build_optimizer", task):
        optimizer = task.optimizer(model, config)
    schedule = OptimizerSchedule(optimizer, config, task.source)
    optimizer, stepper, tuner = build_exchange(config, optimizer, model, schedule)
    loader_workers = task.loader_workers(config)
    bf16 = config.train.precision == "bf16"
    sampler = ShardSampler(train_set, shuffle=True, seed=config.train.seed)
    policy = CommitPolicy(config.train.commit_every, config.train.checkpoint_every, config.train.steps)
    state = TransientState(model, optimizer, sampler, schedule.lr_rule, policy)
    state.register_reset_callbacks([stepper.reset])
    commit_vote = CommitVote()
    state.register_reset_callbacks([commit_vote.reset])
    store = open_store(config.checkpoint_dir, keep_last=config.checkpoint.keep_last)
    # Rank 0 snapshots the state at a durable step; a thread writes it while the ring trains on.
    checkpoint_writer = BackgroundCheckpointWriter(store)
    config_yaml = to_yaml(config)
    books = JobAccounting(config, record)

    def scored(model: torch.nn.Module) -> dict[str, float]:
        with task_code("evaluating", task):
            return evaluate(model, test_set, device, task.evaluate_batch, config.data.batch_size, loader_workers)

    resumed = False
    if hvd.rank() == 0:
        checkpoint = store.load_latest()
        if checkpoint is not None:
            try:
                state.load_checkpoint_payload(checkpoint.state)
            except (KeyError, RuntimeError, ValueError) as e:  # torch's load_state_dict says why in its first line
                raise CheckpointError(
                    f"the durable checkpoint {checkpoint.location} does not fit this job's model or optimizer "
                    f"({str(e).strip().splitlines()[0].rstrip(':.')}); resume it with the task and settings that "
                    "wrote it, or start afresh under another run.name or checkpoint.dir.") from None
            resumed = True
            log.info("resumed from the durable checkpoint %s at step %d", checkpoint.location, state.step)
        books.begin(state, resumed)
    state.begin(resumed)

    watcher = start_notice_watcher(config)
    straggle = benchmark_delay()
    address = network_address()
    log.info("rank %d of %d on %s (%s via %s)", hvd.rank(), hvd.size(), os.environ.get("HOROVOD_HOSTNAME", "?"),
             address, os.environ.get("HOROVOD_GLOO_IFACE", "?"))

    # -- phase 2: train, elastically --------------------------------------------------------
    @hvd.elastic.run
    def run(state: TransientState) -> dict[str, float]:
        state.policy.ring_started()
        # Here after every (re)start and sync: all ranks hold the same parameters.
        record.append("events.jsonl", {"event": "synced", "rank": hvd.rank(), "size": hvd.size(),
                                       "step": state.step, "checksum": parameter_checksum(state.model),
                                       "lr": state.current_lr(), "pid": os.getpid(), "time": time.time(),
                                       "host": os.environ.get("HOROVOD_HOSTNAME", ""), "address": address})
        books.after_sync(state)  # the bill follows the hosts now in the ring
        commit_vote.begin(state.step)
        tuner.begin(state.step)
        last_log = time.monotonic()
        samples_since_log = 0
        # One loader for the ring, its worker processes kept from epoch to epoch; a reset makes
        # a new one, reading what the sampler re-sharded among the workers now in the ring.
        loader = DataLoader(train_set, batch_size=config.data.batch_size, sampler=state.sampler,
                            num_workers=loader_workers, persistent_workers=loader_workers > 0)
        stopped = False  # on budget: every rank leaves the loop at the same step
        while state.step < config.train.steps and not stopped:
            for batch_index, (inputs, target) in enumerate(task_batches(loader, task)):
                lr = state.current_lr()
                momentum = schedule.apply(lr, state.step)
                inputs, target = to_device(inputs, device), to_device(target, device)
                stepper.zero_grad()  # the exchange's: its .grad tensors are views into its buckets
                with task_code("a training step", task):
                    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                        loss = task.loss_fn(state.model(inputs), target)
                    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
                        raise TaskError(f"loss_fn in the task {task.source} returned "
                                        f"{tuple(getattr(loss, 'shape', ())) or type(loss).__name__}, not a scalar "
                                        "tensor; reduce it to one number (for example with .mean()).")
                    loss.backward()
                stepper.step(state.step)
                if straggle is not None:
                    straggle()
                samples = batch_length(target)
                state.sampler.record_batch(batch_index, samples)
                state.step += 1
                tuner.after_step(state.step)  # may drain and cut the buckets afresh, on every rank
                if state.step >= config.train.steps:
                    stepper.drain()  # the last s steps' gradients, before the final commit
                samples_since_log += samples * hvd.size()

                if hvd.rank() == 0 and state.step % config.train.log_every == 0:
                    now = time.monotonic()
                    row = {"step": state.step, "loss": round(loss.item(), 5), "lr": lr, "momentum": momentum,
                           "world_size": hvd.size(),
                           "samples_per_s": round(samples_since_log / max(now - last_log, 1e-9), 1),
                           # This process's CPU seconds so far, all its threads (Horovod's and
                           # Gloo's too): what a step costs on a CPU-bound host, which wall
                           # time on shared cores hides.
                           "cpu_s": round(time.process_time(), 3),
                           # Seconds so far that this rank waited for the gradient exchange and
                           # for the commit vote: the communication that compute did not hide.
                           "exchange_wait_s": round(stepper.waited_seconds, 3),
                           "vote_wait_s": round(commit_vote.waited_seconds, 3),
                           "votes": commit_vote.votes,  # started so far by this process
                           "time": time.time()}
                    books.on_log(state, row)
                    record.append("metrics.jsonl", row)
                    log.info("step %d/%d loss %.4f lr %.4f workers %d", state.step, config.train.steps,
                             row["loss"], lr, hvd.size())
                    last_log, samples_since_log = now, 0
                if config.train.eval_every and state.step % config.train.eval_every == 0:
                    metrics = scored(state.model)  # every rank, its slice
                    tuner.other_work()  # not a step's time
                    if hvd.rank() == 0:
                        row = {"step": state.step, **metrics}
                        books.on_eval(state, row)
                        record.append("metrics.jsonl", row)

                # A vote about every half second, answered one step later, with notices on or off:
                # Horovod tells rank 0 alone of a host update, and every rank must commit at the
                # same step.
                noticed = watcher is not None and watcher.event.is_set()
                vote = commit_vote.exchange(state.step, noticed, state.hosts_update_pending,
                                            books.budget_reached if hvd.rank() == 0 else None)
                decision = state.policy.decide(state.step, vote)
                if decision.first_notice and hvd.rank() == 0:
                    log.info("interruption notice in the job at step %d: checkpointing now and "
                             "committing every step until the host has left", state.step)
                if decision.stop:
                    stepper.drain()  # the stale steps' gradients belong in the last checkpoint
                    if hvd.rank() == 0:
                        log.info("budget reached at step %d: committing, checkpointing and ending the job",
                                 state.step)
                if decision.durable and hvd.rank() == 0:
                    books.before_checkpoint(state)
                    checkpoint_writer.submit(state.step, state.checkpoint_payload(), config_yaml)
                if decision.commit:
                    tuner.other_work()  # not a step's time, on every rank alike
                    try:
                        state.commit()  # may raise HostsUpdatedInterrupt: the state is saved first
                    except HostsUpdatedInterrupt:
                        stepper.drain()  # every rank raises here, so the old ring is still whole
                        raise
                if decision.stop:
                    stopped = True
                    break
                if state.step >= config.train.steps:
                    break
            else:
                # The epoch ran out (on every rank at once: shards have equal length).
                state.epoch += 1
                state.sampler.set_epoch(state.epoch)
        commit_vote.finish()  # every rank has the same vote in flight, or none: no op outlives the loop
        if stopped:
            return None  # no final evaluation: it would spend past the budget
        # The final scores, by every rank, inside the elastic run: a peer lost here rolls
        # back to the last commit (the last step) and the survivors evaluate again.
        return scored(state.model)

    metrics = run(state)
    stopped_on_budget = metrics is None
    metrics = metrics or {}
    if watcher is not None:
        watcher.stop()
    # Every process, not only today's rank 0: a process that was rank 0 before a reset may
    # still be writing. A write that failed raises its CheckpointError here.
    checkpoint_writer.wait()

    # -- phase 3: report ------------------------------------------------------------------
    if hvd.rank() == 0:
        summary = {
            "steps": state.step,
            "world_sizes_seen": state.world_sizes,
            "revocations_survived": state.revocations,
            "steps_lost": state.steps_lost,
            # by this process, rank 0 now (every rank skips the same): a NaN or Inf in the average
            "steps_skipped_not_finite": getattr(stepper, "skipped_steps", 0),
            **({"test_accuracy": metrics["test_accuracy"]} if "test_accuracy" in metrics else {}),
            "test_metrics": metrics,
            "task": task.source,
            "checkpoint": store.location,
            "parameter_checksum": parameter_checksum(state.model),
        }
        books.finish(state, summary, stopped_on_budget)
        record.append("metrics.jsonl", {"step": state.step, **metrics, "cost_usd": summary["cost"]["cost_usd"]})
        record.write_summary(json.dumps(summary, indent=2) + "\n")
        if stopped_on_budget:
            log.info("%s", summary["budget_stop"]["sentence"])
        else:
            log.info("finished %d steps; %s; cost $%.4f (on-demand $%.4f)", state.step,
                     ", ".join(f"{name} {value:.4f}" for name, value in metrics.items()),
                     summary["cost"]["cost_usd"], summary["cost"]["on_demand_usd"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="transientvod worker (started by horovodrun on every slot)")
    parser.add_argument("--config", required=True, help="a resolved config YAML written by the launcher")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)
    record = None
    try:
        if is_channel_url(args.config):
            # A host that shares no disk with the launcher: the config and the records travel
            # through the launcher's channel (channel/).
            token = read_token()
            config = config_from_yaml(fetch_config(args.config, token), args.config)
            check_marker_seen(config, os.environ.get("HOROVOD_HOSTNAME") or socket.gethostname())
            record = ChannelRecord(args.config.rsplit("/", 1)[0], token, config.run_dir)
        else:
            config = load_config(args.config)
            record = LocalRecord(config.run_dir)
        train(config, record)
    except (CheckpointError, TaskError, TaskFailed) as error:
        report_job_error(record, error)
        return STOPPED_EXIT
    except (ChannelError, ConfigError, DataError, PriceError, SharedDiskError, TrackingError) as e:
        log.error("%s", e)
        return 2
    finally:
        if record is not None:
            record.close()
    return 0


if __name__ == "__main__":
    # Not process_exit.exit_now, for now: with it, 2 of 10 job tests failed in one of three runs
    # (tasks/test_task_jobs.py, examples/; not looked into). A guess: a worker that stops the
    # job (exit 3) and is gone at once may be restarted by Horovod before the launcher has read
    # its job error and stopped horovodrun.
    sys.exit(main())
