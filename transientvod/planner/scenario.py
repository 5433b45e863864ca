"""One cluster configuration, run many times against the study's real revocations.

A `Cluster` says what is rented (GPU type, count, spot or on-demand) and how it trains
(`system`): `study` is the study's asynchronous parameter-server training, whose master's
revocation ended the run; `elastic` is this project (Horovod elastic: a lost server costs a
recovery pause, and without a notice the steps since the last commit); `restart` is plain
synchronous training, which stops at every revocation and restarts from its checkpoint
when a replacement arrives. A `Workload` says how much training and how fast one server is.

Revocations come either from the study's traces (`trace`: run r replays run r mod 32 of the
measured K80 clusters of that size; a VM that was still alive when the study's job ended is
revoked later at a time drawn from the K80 lifetimes of VMs that lived at least that long)
or from lifetimes (`lifetimes`: each server's revocation drawn from vm_lifetimes.csv of its
GPU type; VMs that reached GCE's 24 h limit are censored, never revoked), or, for a cloud
without traces, from a monthly interruption band (`rate`: rate_band.py). Replacements, when
asked for, arrive after `replacement_delay_s` and live a lifetime drawn the same way.
A cluster may grow (`schedule`: servers added at steps) or mix GPU types (`mix`: its rate
for every set of servers up from mixed.py; trace replay covers only one type).

A server's life: provisioning (booting and starting the job, billed, no training; fitted
to the traces, provisioning.py), then training at the cluster's measured speed (the same
on-demand or transient: the study's revocation-free transient clusters trained as fast as
its on-demand ones), then revocation or the end.

Two measures of every run, because the cloud and the study count differently:
- the cloud's bill (`time_h`, `cost_usd`): wall time from renting the servers, and every
  server billed per second with a one-minute minimum from its start, provisioning included,
  at the study's GCE price for its market; plus `parameter_servers` always-on CPU servers at
  the on-demand PS price for the whole run;
- the study's measure (`training_h`, `study_cost_usd`): training time only, and each
  server's training seconds times its price (the PS for the training time), except that a
  revoked server is billed for its whole life from the cluster's start, provisioning
  included, until its revocation. That is the study's accounting: a finished job's length
  came from its training log, a revoked VM's from GCE's record of its uptime (the trace's
  `Uptime` runs from the cluster's start). With it every published revocation overhead
  (2, 4 and 8 K80s, r = 1 and 2) is reproduced within 2 points, untuned (overheads.py);
  billing revoked servers for training only made 8 K80s cheaper with each revocation.
  The study's tables are this measure, so they are compared with it.
`--system study` rents one parameter server by default, as the study did; other systems none.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from transientvod.billing.prices import GCE_ON_DEMAND_USD_PER_HOUR, GCE_SPOT_USD_PER_HOUR
from transientvod.config import MARKETS
from transientvod.planner.mixed import rate_by_set
from transientvod.planner.montecarlo import ELASTIC, RESTART, STUDY, simulate_runs
from transientvod.planner.provisioning import fit_provisioning
from transientvod.planner.rate_band import RateBand
from transientvod.planner.rentals import Rental, server_type
from transientvod.planner.speed import SpeedModel, calibrate_k80, scaled, study_speed
from transientvod.planner.study_data import GPU_TYPES, TRACE_SIZES, PlanError, load_lifetimes, trace_runs

SYSTEMS = {"study": STUDY, "elastic": ELASTIC, "restart": RESTART}
REVOCATION_MODELS = ("trace", "lifetimes", "rate")  # rate: from a monthly interruption band (rate_band.py)
# This project's measured recovery: Horovod re-formed the ring 0.7-2.7 s before each
# revocation in benchmarks/revocations.py (2 cores, Gloo). GPU clusters re-initialise NCCL
# as well, so the planner assumes 30 s; change it with --recovery-seconds.
ELASTIC_RECOVERY_S = 30.0
RESTART_RECOVERY_S = 120.0  # a fresh horovodrun: start workers, load the checkpoint
REPLACEMENT_GENERATIONS = 4  # replacements per slot the simulation follows


@dataclass(frozen=True)
class Workload:
    steps: int = 64000  # the study's ResNet-32 job
    # Steps/s of ONE server of a type, overriding the study's (K80 calibrated on its runs,
    # P100 and V100 from its single-server times).
    single_worker_steps_per_s: dict = field(default_factory=dict)
    # Steps/s for every size of a type (GPU -> SpeedModel), measured on a run of this project
    # (run_speed.py); overrides both of the above.
    speed_models: dict = field(default_factory=dict)
    commit_every: int = 50  # elastic: at most this many steps lost without a notice
    checkpoint_every: int = 500  # restart: at most this many steps lost per revocation

    def __post_init__(self):
        if not isinstance(self.steps, int) or self.steps <= 0:
            raise PlanError(f"steps is {self.steps!r}; give a positive whole number of training steps.")


@dataclass(frozen=True)
class Cluster:
    gpu: str = "k80"
    workers: int = 4
    market: str = "spot"
    system: str = "elastic"
    replacement_delay_s: float = math.inf  # inf: revoked servers are not replaced
    notices: bool = True  # a revocation notice arrives first (GCE 30 s, EC2 2 min)
    parameter_servers: int | None = None  # None: 1 for the study's system (it had one), else 0
    # Bounded-staleness training (exchange.staleness > 0) runs this much faster than
    # synchronous training when workers straggle; this project measured 1.32x at s=2 with one
    # of 2 ranks slowed by a random 0..2x of its step time (benchmarks/RESULTS.md, staleness.py).
    staleness_speedup: float = 1.0
    # A growing cluster: ((step, servers), ...): that many servers are requested when the job
    # holds `step` steps, and join after their provisioning (the study's "dynamic cluster").
    schedule: tuple = ()
    # A mixed cluster: ((gpu, count), ...), e.g. (("k80", 2), ("p100", 2)); then `gpu` and
    # `workers` are set from it (the first type's first server is the master).
    mix: tuple = ()

    def __post_init__(self):
        if self.mix:
            mix = []
            for item in self.mix:
                if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], int)):
                    raise PlanError(f"mixed-cluster entry {item!r} must be a pair (GPU type, count).")
                if item[1] < 1:
                    raise PlanError(f"mixed-cluster entry {item[0]}:{item[1]} must have 1 or more servers.")
                mix.append((server_type(item[0]), item[1]))
            if self.schedule:
                raise PlanError("a schedule adds servers of one type; use it with a single-type cluster, not a "
                                "mixed one.")
            object.__setattr__(self, "mix", tuple(mix))
            object.__setattr__(self, "gpu", mix[0][0])
            object.__setattr__(self, "workers", sum(count for _, count in mix))
        object.__setattr__(self, "gpu", server_type(self.gpu))
        if self.market not in MARKETS:
            raise PlanError(f"market {self.market!r} is not one of {', '.join(MARKETS)}.")
        if self.system not in SYSTEMS:
            raise PlanError(f"system {self.system!r} is not one of {', '.join(SYSTEMS)}.")
        if self.parameter_servers is None:
            object.__setattr__(self, "parameter_servers", 1 if self.system == "study" else 0)
        if not isinstance(self.parameter_servers, int) or self.parameter_servers < 0:
            raise PlanError(f"parameter servers is {self.parameter_servers!r}; give a whole number, 0 or more.")
        if not isinstance(self.workers, int) or self.workers < 1:
            raise PlanError(f"workers is {self.workers!r}; a cluster needs 1 or more workers.")
        if not self.staleness_speedup > 0:
            raise PlanError(f"the staleness speed-up is {self.staleness_speedup}; it must be positive (1: synchronous).")
        for item in self.schedule:
            if not (isinstance(item, tuple) and len(item) == 2 and all(isinstance(x, int) for x in item)):
                raise PlanError(f"schedule entry {item!r} must be a pair (step, servers) of whole numbers.")
            if item[0] <= 0 or item[1] <= 0:
                raise PlanError(f"schedule entry {item[0]}:{item[1]:+d} must add 1 or more servers at a step after 0; "
                                "a schedule only adds servers.")
        if self.replacement_delay_s < 0:
            raise PlanError(f"the replacement delay is {self.replacement_delay_s} s; it must be 0 or more.")

    @property
    def slot_gpus(self) -> list[str]:
        """The GPU type of every slot, the master's first (scheduled servers are of `gpu`)."""
        if self.mix:
            return [gpu for gpu, count in self.mix for _ in range(count)]
        return [self.gpu] * (self.workers + sum(count for _, count in self.schedule))

    @property
    def label(self) -> str:
        replace = "" if math.isinf(self.replacement_delay_s) else f", replaced after {self.replacement_delay_s:g} s"
        stale = "" if self.staleness_speedup == 1.0 else f", stale {self.staleness_speedup:g}x"
        ps = f", {self.parameter_servers} PS" if self.parameter_servers else ""
        grow = "".join(f", +{count} at {step}" for step, count in self.schedule)
        servers = ("+".join(f"{count} x {gpu}" for gpu, count in self.mix) if self.mix
                   else f"{self.workers} x {self.gpu}")
        return f"{servers} {self.market} ({self.system}{ps}{stale}{replace}{grow})"


@dataclass(frozen=True)
class Outcome:
    """The distribution of one configuration's simulated runs."""

    cluster: Cluster
    runs: int
    time_h: np.ndarray  # every run's wall time to finish or fail, provisioning included
    cost_usd: np.ndarray  # every run's cloud bill, failed ones up to the failure
    on_demand_usd: np.ndarray  # the same server-seconds at on-demand prices
    failed: np.ndarray
    revocations: np.ndarray
    training_h: np.ndarray  # the study's measure: training time only
    study_cost_usd: np.ndarray  # the study's measure: training server-seconds x prices

    def stats(self) -> dict:
        ok = ~self.failed
        row = {"configuration": self.cluster.label, "runs": self.runs,
               "failure_pct": 100.0 * float(np.mean(self.failed)),
               "revocations_mean": float(np.mean(self.revocations))}
        for name, values in (("time_h", self.time_h[ok]), ("cost_usd", self.cost_usd[ok]),
                             ("training_h", self.training_h[ok]), ("study_cost_usd", self.study_cost_usd[ok])):
            for stat, fn in (("mean", np.mean), ("p50", np.median), ("p90", lambda v: np.percentile(v, 90))):
                row[f"{name}_{stat}"] = float(fn(values)) if values.size else math.nan
        return row


class Simulator:
    """Holds what every configuration shares (the calibrated speed, lifetimes, traces)."""

    def __init__(self, workload: Workload, seed: int = 0, recovery_s: float | None = None,
                 trace_path: str | None = None, revocation_rate: RateBand | None = None,
                 rentals: dict[str, Rental] | None = None):
        self.revocation_rate = revocation_rate  # the band the "rate" revocation model draws from
        # Today's rented types (rentals.py): their prices and GPUs per instance; the study's
        # K80, P100 and V100 are priced from its GCE table.
        self.rentals = dict(rentals or {})
        self.workload = workload
        self.trace_path = trace_path  # your own trace (transientvod.spot.providers.trace format) instead of the study's
        self.seed = seed
        self.recovery_s = recovery_s
        self._k80 = calibrate_k80()
        self.provisioning = fit_provisioning()
        self._lifetimes = {}
        self._speeds = {}

    def speed(self, gpu: str) -> SpeedModel:
        """A run's measured speeds (--speed-from-run) or the override (--speed) if given, else the
        study's speed of that type."""
        if gpu in self.workload.speed_models:
            return self._per_instance(gpu, self.workload.speed_models[gpu])
        if gpu in self.workload.single_worker_steps_per_s:
            return scaled(self._k80, gpu, self.workload.single_worker_steps_per_s[gpu])
        if gpu not in GPU_TYPES:
            raise PlanError(f"no speed is known for {gpu} (the study measured only K80, P100 and V100); give "
                            f"--speed {gpu}=STEPS_PER_S (one instance) or --speed-from-run {gpu}=runs/NAME.")
        if gpu not in self._speeds:
            self._speeds[gpu] = study_speed(gpu, self._k80)
        return self._speeds[gpu]

    def _per_instance(self, gpu: str, model: SpeedModel) -> SpeedModel:
        """A run's speeds count ranks, one per GPU; an instance of g GPUs is g of them, so k
        instances train at the run's speed with k x g ranks."""
        gpus = self.rentals[gpu].gpus if gpu in self.rentals else 1
        if gpus == 1:
            return model
        top = model.max_workers // gpus
        speeds = model.steps_per_second[[k * gpus for k in range(top + 1)]]
        return SpeedModel(gpu=gpu, steps_per_second=speeds,
                          source=f"{gpu}: {gpus} GPUs an instance, so k instances = {gpus}k ranks of:\n" + model.source)

    def prices(self, gpu: str) -> tuple[float, float]:
        """(spot, on-demand) $/hour of one server of a type."""
        if gpu in self.rentals:
            return self.rentals[gpu].spot.usd_per_hour, self.rentals[gpu].on_demand.usd_per_hour
        if gpu not in GPU_TYPES:
            raise PlanError(f"{gpu} has no price; the planner prices it from EC2 or its table (rentals.py).")
        return GCE_SPOT_USD_PER_HOUR[gpu], GCE_ON_DEMAND_USD_PER_HOUR[gpu]

    def lifetimes(self, gpu: str):
        if gpu not in self._lifetimes:
            self._lifetimes[gpu] = load_lifetimes(gpu)
        return self._lifetimes[gpu]

    def run(self, cluster: Cluster, runs: int = 10000, revocations: str = "trace") -> Outcome:
        if revocations not in REVOCATION_MODELS:
            raise PlanError(f"revocation model {revocations!r} is not one of {', '.join(REVOCATION_MODELS)}.")
        if not isinstance(runs, int) or runs < 1:
            raise PlanError(f"runs is {runs!r}; simulate at least 1 run.")
        if revocations == "rate" and self.revocation_rate is None:
            raise PlanError("the rate revocation model needs a band: --revocation-rate 5-10 (percent a month).")
        rented = sorted({g for g in cluster.slot_gpus if g not in GPU_TYPES})
        if rented and cluster.market == "spot" and revocations != "rate":
            raise PlanError(f"{rented[0]} has no revocation traces or lifetimes (the study's are GCE 2019 K80, P100 "
                            "and V100); give --revocation-rate BAND, the Spot Instance Advisor's band for it.")
        if rented and cluster.parameter_servers:
            raise PlanError(f"a parameter server beside {rented[0]} has no price here; use --parameter-servers 0.")
        rng = np.random.default_rng(self.seed)
        first, gpu = cluster.workers, cluster.gpu
        join_step, join_delay = self._schedule(cluster)
        n = join_step.size  # every slot, the scheduled ones included
        speed = self.speed(gpu)
        if n > speed.max_workers:
            raise PlanError(f"{n} workers is more than the speed model's {speed.max_workers}.")
        throughput = np.array(speed.steps_per_second[:n + 1]) * cluster.staleness_speedup
        gpus = cluster.slot_gpus
        rates = self._mixed_rates(cluster, speed) if cluster.mix else None
        start_s = self.provisioning.seconds(first)
        if cluster.market == "spot":
            revoked_at = self._revocations(cluster, runs, revocations, rng)
            if n > first:  # scheduled servers: lives from the lifetimes of their type, counted from the request
                revoked_at = np.hstack([revoked_at, self._lives([gpu] * (n - first), rng, (runs, n - first),
                                                                revocations)])
            replacement_life = self._lives(gpus, rng, (runs, n, REPLACEMENT_GENERATIONS), revocations)
        else:
            revoked_at = np.full((runs, n), np.inf)
            replacement_life = np.full((runs, n, REPLACEMENT_GENERATIONS), np.inf)
        most_lost = self.workload.checkpoint_every if cluster.system == "restart" else self.workload.commit_every
        lost_steps = rng.uniform(0, most_lost, size=(runs, n))
        noticed = np.full((runs, n), cluster.notices)
        recovery = self.recovery_s
        if recovery is None:
            recovery = {"study": 0.0, "elastic": ELASTIC_RECOVERY_S, "restart": RESTART_RECOVERY_S}[cluster.system]
        result = simulate_runs(revoked_at, noticed, lost_steps, replacement_life, throughput, self.workload.steps,
                               SYSTEMS[cluster.system], recovery_s=recovery,
                               replacement_delay_s=cluster.replacement_delay_s, start_s=start_s,
                               join_step=join_step, join_delay_s=join_delay, rate_by_set=rates)
        spot_or_on_demand = [self.prices(g) for g in gpus]  # per slot
        price = np.array([p[0] if cluster.market == "spot" else p[1] for p in spot_or_on_demand])
        on_demand_price = np.array([p[1] for p in spot_or_on_demand])
        ps_price = GCE_ON_DEMAND_USD_PER_HOUR["ps"]
        time_s = np.asarray(result.time_s)
        ps_seconds = np.maximum(60.0, np.ceil(time_s)) * cluster.parameter_servers
        cost = (result.billed_by_slot @ price + ps_seconds * ps_price) / 3600.0
        on_demand = (result.billed_by_slot @ on_demand_price + ps_seconds * ps_price) / 3600.0
        training_s = np.maximum(time_s - start_s, 0.0)
        study_cost = (result.training_by_slot @ price + training_s * cluster.parameter_servers * ps_price) / 3600.0
        # The study's accounting bills a revoked server from the cluster's start: its
        # provisioning too (the first servers' only; replacements and scheduled servers were
        # never in its traces). A server revoked when the run ended is the master that ended it.
        first_revoked = revoked_at[:, :first] <= time_s[:, None]
        study_cost = study_cost + (first_revoked * start_s) @ price[:first] / 3600.0
        return Outcome(cluster, runs, time_s / 3600.0, cost, on_demand, np.asarray(result.failed),
                       np.asarray(result.revocations), training_s / 3600.0, study_cost)

    def _lives(self, gpus: list[str], rng, shape, model: str = "lifetimes") -> np.ndarray:
        """Lifetimes drawn for slots of the given types ([runs, slots, ...]); one draw for one type.
        The trace model's later servers (replacements, scheduled ones) live like its lifetimes."""
        if model == "rate":
            return self.revocation_rate.sample(rng, shape)
        if len(set(gpus)) == 1:
            return self.lifetimes(gpus[0]).sample(rng, shape)
        return np.stack([self.lifetimes(g).sample(rng, (shape[0],) + tuple(shape[2:])) for g in gpus], axis=1)

    def _mixed_rates(self, cluster: Cluster, k80_shape: SpeedModel) -> np.ndarray:
        """Steps/s for every set of up servers (mixed.py): the study's asynchronous PS adds the
        servers' speeds, synchronous training (elastic, restart) waits for the slowest."""
        shape = np.asarray(self._k80.steps_per_second) / self._k80.steps_per_second[1]
        single = [self.speed(g).throughput(1) for g in cluster.slot_gpus]
        rule = "sum" if cluster.system == "study" else "slowest"
        return rate_by_set(single, shape, rule) * cluster.staleness_speedup

    def _schedule(self, cluster: Cluster) -> tuple[np.ndarray, np.ndarray]:
        """Per slot: the step at which it is requested (0: from the start), and its provisioning
        (that of the servers requested with it; 0 for the first ones, whose start_s covers it)."""
        join_step, join_delay = [0.0] * cluster.workers, [0.0] * cluster.workers
        for step, count in sorted(cluster.schedule):
            if step >= self.workload.steps:
                raise PlanError(f"the schedule adds servers at step {step}, but the job has only "
                                f"{self.workload.steps} steps (--steps); give steps below it.")
            join_step += [float(step)] * count
            join_delay += [self.provisioning.seconds(count)] * count
        return np.array(join_step), np.array(join_delay)

    def _revocations(self, cluster: Cluster, runs: int, model: str, rng) -> np.ndarray:
        n = cluster.workers
        if model in ("lifetimes", "rate"):
            return self._lives(cluster.slot_gpus[:n], rng, (runs, n), model)
        if cluster.mix:
            raise PlanError("the study's traces are of K80 clusters of one type; simulate a mixed cluster with "
                            "--revocations lifetimes.")
        if self.trace_path is None and (cluster.gpu != "k80" or n not in TRACE_SIZES):
            raise PlanError(f"the study's traces are of {', '.join(map(str, TRACE_SIZES))} K80 servers, not {n} x "
                            f"{cluster.gpu}; use the lifetimes revocation model (--revocations lifetimes).")
        measured = trace_runs(n, self.trace_path)
        uptime = np.array([[vm.uptime_s for vm in run.vms] for run in measured])
        revoked = np.array([[vm.revoked for vm in run.vms] for run in measured])
        pick = np.arange(runs) % len(measured)  # every measured run replayed equally often
        uptime, revoked = uptime[pick], revoked[pick]
        # A VM alive when the study's job ended lives on: its revocation is drawn from the VMs
        # that lived at least as long.
        later = self.lifetimes("k80").sample_beyond(rng, uptime)
        return np.where(revoked, uptime, later)


def simulate(clusters: list[Cluster], workload: Workload, runs: int = 10000, revocations: str = "trace",
             seed: int = 0, recovery_s: float | None = None) -> list[Outcome]:
    simulator = Simulator(workload, seed=seed, recovery_s=recovery_s)
    return [simulator.run(cluster, runs, revocations) for cluster in clusters]
