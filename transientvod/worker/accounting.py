"""The job's books, kept during training: its bill and its MLflow metrics.

The training loop calls four hooks; everything else about cost and tracking lives in
`billing/job.py` (who is billed for what) and `tracking/` (how MLflow is talked to):

- `after_sync` (every rank, after every start and reset of the ring): the workers exchange
  their host names and rank 0 moves the bill to the new membership; the ledger is then
  broadcast, so whichever rank is rank 0 after the next revocation has the same books.
- `on_log` / `on_eval` (rank 0): cost so far and its on-demand equivalent join the metrics
  row, which goes to `metrics.jsonl` and to MLflow (without waiting for it).
- `budget_reached` (rank 0, at each commit vote it starts): billing/budget.py's stop rule on
  the bill; the loop then commits, checkpoints durably and ends on every rank.
- `finish` (rank 0): the final bill into the summary, and the last metrics out to MLflow.
"""
from __future__ import annotations

import logging
import os
import socket
import time

import horovod.torch as hvd

from transientvod.billing.budget import StopVerdict, job_stop_lead_seconds, stop_verdict
from transientvod.billing.job import JobBill
from transientvod.billing.meter import usd_per_accuracy_point
from transientvod.config import Config
from transientvod.spot.hosts import USABLE, HostStateError, read_host_state
from transientvod.tracking import names
from transientvod.worker.state import TransientState

log = logging.getLogger(__name__)


def host_name() -> str:
    # Horovod gives each worker the name discovery reported for its host; two local names
    # (localhost, 127.0.0.1) are two hosts to Horovod and to the bill, one to gethostname().
    return os.environ.get("HOROVOD_HOSTNAME") or socket.gethostname()


def revocation_moments(config: Config) -> dict[str, float]:
    """Host -> the moment the provider takes it, for hosts with a notice, from the host-state
    file when this machine has one (the watcher runs beside the launcher). Read here, not in
    billing/, which knows nothing of spot/."""
    if config.spot.provider == "none":
        return {}
    try:
        state = read_host_state(config.host_state_file)
    except HostStateError:
        return {}
    return {h.name: h.terminate_at for h in state.hosts if h.state != USABLE and h.terminate_at is not None}


class JobAccounting:
    def __init__(self, config: Config, record=None):
        self.config = config
        self.record = record  # the run's records, where rank 0's unsent metrics go
        self.bill: JobBill | None = None  # rank 0's meter, rebuilt from the ledger after each sync
        self.catalog = None  # rank 0's prices, kept across syncs (and its spot price cache with them)
        self.sender = None  # rank 0's MetricSender, started when this process first is rank 0
        # The launcher opens the MLflow run and closes it after horovodrun; a job started by
        # hand has no launcher, so rank 0 opens the run at the start and closes it at the end.
        self.launcher_owns_run = bool(config.tracking.run_id)
        self.lead_seconds = job_stop_lead_seconds()
        self.budget_stop: StopVerdict | None = None  # rank 0's verdict that stopped the job

    # -- before training ---------------------------------------------------------------------

    def begin(self, state: TransientState, resumed: bool) -> None:
        """Rank 0, before the first sync: the clock, the bill of a restarted job, the MLflow run."""
        now = time.time()
        if not state.started_at:
            state.started_at = now
        if resumed and state.cost_ledger:
            # The job was down between its last checkpoint and now; nobody was billed for it.
            bill = JobBill(self.config, state.cost_ledger, now, self.catalog)
            self.catalog = bill.catalog
            bill.restart(state.ledger_saved_at or now, now)
            state.cost_ledger = bill.ledger()
        tracking = self.config.tracking
        if tracking.enabled and not (tracking.run_id or state.mlflow_run_id):
            # Started by hand with horovodrun, not by the launcher: open the run here.
            from transientvod.tracking.run import open_run
            open_run(self.config)
        if tracking.enabled:
            state.mlflow_run_id = tracking.run_id or state.mlflow_run_id

    # -- after every (re)start of the ring ---------------------------------------------------

    def after_sync(self, state: TransientState) -> None:
        hosts = hvd.allgather_object(host_name())
        ledger = None
        if hvd.rank() == 0:
            now = time.time()
            self.bill = JobBill(self.config, state.cost_ledger, now, self.catalog)
            self.catalog = self.bill.catalog
            joined, left = self.bill.follow_ring(hosts, now, revocation_moments(self.config))
            if joined or left:
                log.info("billing %d hosts from now (joined: %s; left: %s)", len(set(hosts)),
                         ", ".join(joined) or "none", ", ".join(left) or "none")
            ledger = self.bill.ledger()
            self._start_sender(state)  # MLflow loads in its thread while the first steps run
        state.cost_ledger = hvd.broadcast_object(ledger, root_rank=0, name="transientvod.cost_ledger")

    # -- while training (rank 0) -------------------------------------------------------------

    def on_log(self, state: TransientState, row: dict) -> None:
        """Adds the cost so far to the metrics row and sends it to MLflow."""
        bill = self._cost_into(row)
        # A library-mode script's progress rows have no loss or throughput (the loop is the script's).
        measured = {metric: row[key] for metric, key in ((names.METRIC_LOSS, "loss"),
                                                         (names.METRIC_THROUGHPUT, "samples_per_s")) if key in row}
        self._send(state, {**measured, names.METRIC_WORKERS: row["world_size"], names.METRIC_COST: bill.cost_usd,
                           names.METRIC_ON_DEMAND_COST: bill.on_demand_usd,
                           names.METRIC_REVOCATIONS: state.revocations, names.METRIC_STEPS_LOST: state.steps_lost})

    def on_eval(self, state: TransientState, row: dict) -> None:
        # Cost at the same step as the accuracy: the cost-versus-accuracy figure pairs them by step.
        bill = self._cost_into(row)
        scores = {name: value for name, value in row.items() if name.startswith("test_")}
        self._send(state, {**scores, names.METRIC_COST: bill.cost_usd, names.METRIC_ON_DEMAND_COST: bill.on_demand_usd})

    def budget_reached(self) -> bool:
        """Rank 0: the projected spend (the bill now plus `lead_seconds` of the servers in the
        ring) has reached cost.budget_usd; the verdict is kept for the summary."""
        budget = self.config.cost.budget_usd
        if budget is None or self.bill is None:
            return False
        now = time.time()
        verdict = stop_verdict(self.bill.bill(now).cost_usd, self.bill.running_usd_per_hour(now), self.lead_seconds,
                               budget)
        if verdict.stop and self.budget_stop is None:
            self.budget_stop = verdict
        return verdict.stop

    def _cost_into(self, row: dict):
        bill = self.bill.bill(time.time())
        row["cost_usd"] = round(bill.cost_usd, 6)
        row["on_demand_cost_usd"] = round(bill.on_demand_usd, 6)
        return bill

    def before_checkpoint(self, state: TransientState) -> None:
        # A restart bills the old servers up to here (the last moment known alive).
        state.ledger_saved_at = time.time()

    def _start_sender(self, state: TransientState) -> None:
        if self.config.tracking.enabled and self.sender is None:
            from transientvod.tracking.run import tracking_uri
            from transientvod.tracking.sender import UNSENT_FILE, MetricSender
            self.sender = MetricSender(tracking_uri(self.config), state.mlflow_run_id,
                                       self.config.run_dir / UNSENT_FILE, record=self.record)

    def _send(self, state: TransientState, metrics: dict) -> None:
        if not self.config.tracking.enabled:
            return
        self._start_sender(state)
        self.sender.log(metrics, state.step)

    # -- at the end (rank 0) -----------------------------------------------------------------

    def finish(self, state: TransientState, summary: dict, stopped_on_budget: bool = False) -> None:
        """The final bill into `summary` (and `budget_stop` when the budget ended the job); the
        last metrics to MLflow; the run closed unless the launcher does that."""
        now = time.time()
        bill = self.bill.finish(now)
        state.cost_ledger = self.bill.ledger()
        accuracy = summary.get("test_accuracy", 0.0)  # a task may score itself otherwise (test_metrics)
        summary["cost"] = {
            "cost_usd": round(bill.cost_usd, 6),
            "on_demand_usd": round(bill.on_demand_usd, 6),
            "savings_pct": round(bill.savings_pct, 3),
            "host_seconds": bill.host_seconds,
            "usd_per_accuracy_point": round(usd_per_accuracy_point(bill.cost_usd, accuracy), 6) if accuracy > 0 else None,
            "servers": [{"host": line.host, "instance_type": line.instance_type, "market": line.market,
                         "billed_seconds": line.billed_seconds, "usd": round(line.usd, 6)} for line in bill.lines],
        }
        if stopped_on_budget:
            summary["budget_stop"] = self._budget_stop_entry(summary)
        scores = summary.get("test_metrics", {names.METRIC_ACCURACY: accuracy})
        self._send(state, {**scores, names.METRIC_COST: bill.cost_usd, names.METRIC_ON_DEMAND_COST: bill.on_demand_usd,
                           names.METRIC_REVOCATIONS: state.revocations, names.METRIC_STEPS_LOST: state.steps_lost})
        if self.sender is not None:
            self.sender.close()
        if self.config.tracking.enabled and not self.launcher_owns_run:
            from transientvod.tracking.run import close_run
            self.config.tracking.run_id = state.mlflow_run_id
            close_run(self.config, {**summary, "wall_seconds": round(now - state.started_at, 1)}, succeeded=True)

    def _budget_stop_entry(self, summary: dict) -> dict:
        """summary.json's `budget_stop`: the verdict, and the one sentence the launcher prints."""
        verdict, step, checkpoint = self.budget_stop, summary["steps"], summary["checkpoint"]
        spent = summary["cost"]["cost_usd"]
        sentence = (f"the job stopped at step {step} of {self.config.train.steps} because its projected spend "
                    f"${verdict.projected_usd:.2f} reached its budget (cost.budget_usd) of ${verdict.budget_usd:.2f}: "
                    f"it spent ${spent:.2f}, and its durable checkpoint of step {step} is in {checkpoint}; run train "
                    "again with a larger cost.budget_usd to resume.")
        return {"step": step, "spent_usd": round(spent, 6), "budget_usd": verdict.budget_usd,
                "projected_usd": round(verdict.projected_usd, 6), "lead_seconds": verdict.lead_seconds,
                "checkpoint": checkpoint, "sentence": sentence}
