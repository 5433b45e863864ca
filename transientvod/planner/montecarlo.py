"""Monte Carlo runs of one training job on a cluster whose servers may be revoked.

    from transientvod.planner.montecarlo import ELASTIC, simulate_runs
    results = simulate_runs(revoked_at, noticed, lost_steps, replacement_life, throughput,
                            steps=64_000, system=ELASTIC, recovery_s=30.0, replacement_delay_s=120.0)
    results.summary()

The caller draws the randomness (when each server dies, whether it got a notice, how much
work it took with it); this module plays each run's events in time order and counts what
the run took: time, billed server-seconds, failure, revocations, steps done.

The model
---------
A job needs `steps` optimizer steps. A cluster has W worker slots, all started at t = 0.
Slot w's first server is revoked at `revoked_at[r, w]` seconds (np.inf: never within the
run). `throughput[k]` is steps/s with k active workers (throughput[0] = 0). Between events
steps accrue at the current rate; a run ends when `steps` are done (success), when it fails,
or at `horizon_s` (a failure: it never finished).

Provisioning: servers are rented (and billed) from t = 0, but no step is taken before
`start_s`: the time the cloud takes to boot the VMs and the job to start on them (the
planner fits it to the study's traces, planner/provisioning.py). A revocation during
provisioning is a revocation like any other. `training_seconds` counts each server's
seconds after `start_s` (unrounded): the study's measure of a run's cost, which leaves
provisioning out.

A growing cluster: slot w with `join_step[w] > 0` is empty until the job holds that many
steps; then its server is requested (billed from then) and joins `join_delay_s` (one value,
or one per slot) later (its provisioning), as an arrival: at once in STUDY, with a `recovery_s` pause in ELASTIC, and in
RESTART once every slot in the cluster is up. Its `revoked_at` counts from its request (a
VM's life includes its boot), and a server revoked while booting goes as it arrives. Its
training seconds count from its arrival. Slots with join_step 0 (the default) are there
from the start; the master slot must be one of them.

Revocation of slot w at t (counted in `revocations`). Then, by `system`:
- STUDY (the study's TensorFlow asynchronous parameter-server training): the others keep
  going at once, nothing lost, except that losing the master (`master_slot`) FAILS the run
  at t (the master held the checkpoints). A master is never replaced.
- ELASTIC (transientvod: Horovod elastic ring): no slot is special. The ring pauses
  `recovery_s` to re-form. Without a notice the survivors roll back `lost_steps` (the work
  since the last commit); with one the job commits first and loses nothing. With no worker
  left the run waits for a coming replacement, or FAILS at t if none is coming.
- RESTART (plain synchronous training): every revocation stops the whole job, notice or
  not, and rolls it back `lost_steps` (to the last durable checkpoint). It runs again only
  with all W slots filled, `recovery_s` after the last replacement arrives; a slot that gets
  no replacement FAILS the run at t.

Replacement: if `replacement_delay_s` is finite, a revoked slot gets a new server at
t + replacement_delay_s, up to G = replacement_life.shape[2] replacements per slot. The g-th
replacement (g = 0..G-1) is revoked `replacement_life[r, w, g]` seconds after it arrives
(np.inf: never). An arrival joins at once in STUDY and costs the ELASTIC ring a `recovery_s`
pause; in RESTART it restarts the job (after `recovery_s`) once every slot is filled.

Mixed clusters: `rate_by_set[mask]` (2**W entries), when given, replaces `throughput`: the
steps/s of the set of active slots whose bits are set in `mask` (slot w is bit w), for
clusters whose servers differ in speed, so that which server was revoked matters.

Billing (GCE and EC2 alike: per second, one-minute minimum per server): each server, the
original and every replacement, is billed from its start (t = 0, or its arrival: a server
waiting for the ring to accept it is already paid for) until min(its revocation, run end),
by billing.meter.billed_seconds (max(60, ceil(seconds))). A failed run is billed up to its
failure time.

Decisions beyond the rules above, so that every run is well defined:
- A rollback never goes below the last point the job is known to hold: the last rollback or
  notice-driven commit. So a revocation loses min(lost_steps, steps done since then); a
  second revocation while RESTART is stopped loses nothing more.
- Every membership change (ELASTIC: a revocation or an arrival; RESTART: the arrival that
  fills the last slot) restarts the pause: training resumes `recovery_s` after the latest one.
- Ties: finishing at the moment of an event finishes first; simultaneous events run in slot
  order; an event at or after `horizon_s` is not played (the run has already failed).
- `noticed` and `lost_steps` are [R, W] (every server of a slot shares its slot's draw) or
  [R, W, G + 1] (one per server: index 0 the original, g + 1 the g-th replacement).
- `steps_done` is what the run holds when it ends, after any rollback (= steps on success).

The kernel is compiled by numba on first call (seconds); cache=True keeps the machine code in
`__pycache__` next to this file, so later processes load it instead (about 0.3 s). Runs are
independent, so blocks of them are spread over the cores with prange: on a 2-core machine that
measured 0.7 ms per 10,000 runs against 2.3 ms for a plain loop, for a longer first compile
(about 3.5 s against 1.5 s). benchmarks/simulate.py measures it.

Never imports torch or horovod: the planner runs where neither is installed."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numba import njit, prange

from transientvod.billing.meter import billed_seconds
from transientvod.planner.montecarlo_inputs import per_server, positive_number, real_array


STUDY, ELASTIC, RESTART = 0, 1, 2
SYSTEM_NAMES = ("STUDY", "ELASTIC", "RESTART")
DAY_S = 24 * 3600.0


@dataclass(frozen=True, eq=False)
class RunResults:
    """One entry per run, read-only: when it ended, whether it failed, how many servers were
    revoked, what its worker servers billed (seconds, summed), and the steps it held at the end."""

    time_s: np.ndarray
    failed: np.ndarray
    revocations: np.ndarray
    billed_seconds: np.ndarray
    steps_done: np.ndarray
    training_seconds: np.ndarray  # server-seconds from start_s on: what the study's measure bills
    billed_by_slot: np.ndarray  # [runs, slots]: billed_seconds per slot (its servers), for mixed prices
    training_by_slot: np.ndarray  # [runs, slots]: training_seconds per slot

    def __post_init__(self):
        for array in (self.time_s, self.failed, self.revocations, self.billed_seconds, self.steps_done,
                      self.training_seconds, self.billed_by_slot, self.training_by_slot):
            array.setflags(write=False)

    def summary(self) -> dict:
        """Time and billed seconds over the successful runs (nan when none succeeded),
        with the failure probability and the mean revocations over all runs."""
        ok = ~self.failed
        out = {"runs": int(self.failed.size),
               "failure_probability": float(self.failed.mean()) if self.failed.size else math.nan,
               "mean_revocations": float(self.revocations.mean()) if self.revocations.size else math.nan}
        for name, values in (("time_s", self.time_s[ok]), ("billed_seconds", self.billed_seconds[ok])):
            if values.size:
                p50, p90 = np.percentile(values, [50, 90])
                out.update({f"{name}_mean": float(values.mean()), f"{name}_p50": float(p50), f"{name}_p90": float(p90)})
            else:
                out.update({f"{name}_mean": math.nan, f"{name}_p50": math.nan, f"{name}_p90": math.nan})
        return out


def simulate_runs(revoked_at, noticed, lost_steps, replacement_life, throughput, steps, system,
                  recovery_s=0.0, replacement_delay_s=np.inf, master_slot=0, horizon_s=7 * DAY_S,
                  start_s=0.0, join_step=None, join_delay_s=0.0, rate_by_set=None) -> RunResults:
    """Play R runs of a `steps`-step job on W slots (see the module docstring for the model).

    revoked_at: float [R, W], seconds after the start at which each slot's first server is
    revoked (np.inf: never). noticed: bool [R, W] or [R, W, G + 1]. lost_steps: float, the
    same shape. replacement_life: float [R, W, G]. throughput: float [>= W + 1], steps/s by
    the number of active workers, throughput[0] = 0. system: STUDY, ELASTIC or RESTART.
    """
    revoked_at = real_array("revoked_at", revoked_at, 2)
    runs, slots = revoked_at.shape
    if slots < 1:
        raise ValueError("revoked_at has no slots: give it shape [runs, workers] with at least one worker.")
    replacement_life = real_array("replacement_life", replacement_life, 3)
    if replacement_life.shape[:2] != (runs, slots):
        raise ValueError(f"replacement_life has shape {replacement_life.shape}; it must be [runs, workers, "
                         f"generations] = [{runs}, {slots}, G] like revoked_at {revoked_at.shape}.")
    servers = replacement_life.shape[2] + 1
    noticed = per_server("noticed", noticed, runs, slots, servers)
    lost_steps = per_server("lost_steps", real_array("lost_steps", lost_steps, None), runs, slots, servers)
    throughput = real_array("throughput", throughput, 1)

    if np.isnan(revoked_at).any() or (revoked_at < 0).any():
        raise ValueError("revoked_at has a NaN or negative time: use seconds >= 0, or np.inf for never.")
    if np.isnan(replacement_life).any() or (replacement_life < 0).any():
        raise ValueError("replacement_life has a NaN or negative life: use seconds >= 0, or np.inf for never.")
    if not np.isfinite(lost_steps).all() or (lost_steps < 0).any():
        raise ValueError("lost_steps must be finite and >= 0 (steps rolled back at a revocation).")
    if throughput.size < slots + 1:
        raise ValueError(f"throughput has {throughput.size} entries; it needs one per number of active "
                         f"workers 0..{slots}, that is at least {slots + 1}.")
    if not np.isfinite(throughput).all() or (throughput < 0).any() or throughput[0] != 0:
        raise ValueError("throughput must be finite steps/s >= 0 with throughput[0] = 0 (no workers, no steps).")
    if system not in (STUDY, ELASTIC, RESTART):
        raise ValueError(f"system is {system!r}; use STUDY ({STUDY}), ELASTIC ({ELASTIC}) or RESTART ({RESTART}).")
    steps = positive_number("steps", steps)
    recovery_s = float(recovery_s)
    if not (math.isfinite(recovery_s) and recovery_s >= 0):
        raise ValueError(f"recovery_s is {recovery_s}; it must be a finite number of seconds >= 0.")
    replacement_delay_s = float(replacement_delay_s)
    if math.isnan(replacement_delay_s) or replacement_delay_s < 0:
        raise ValueError(f"replacement_delay_s is {replacement_delay_s}; use seconds >= 0, "
                         "or np.inf for no replacements.")
    if not (isinstance(master_slot, (int, np.integer)) and 0 <= master_slot < slots):
        raise ValueError(f"master_slot is {master_slot!r}; it must be a slot index 0..{slots - 1}.")
    horizon_s = positive_number("horizon_s", horizon_s)
    start_s = float(start_s)
    if not (math.isfinite(start_s) and 0 <= start_s < horizon_s):
        raise ValueError(f"start_s is {start_s}; it must be seconds >= 0 before horizon_s (the servers' provisioning).")
    join_step = np.zeros(slots) if join_step is None else real_array("join_step", join_step, 1)
    if join_step.shape != (slots,):
        raise ValueError(f"join_step has {join_step.size} entries; it needs one per slot ({slots}).")
    if not (np.isfinite(join_step).all() and (join_step >= 0).all() and (join_step < steps).all()):
        raise ValueError(f"join_step must be steps from 0 (in the cluster from the start) to below steps ({steps:g}).")
    if join_step[master_slot] != 0:
        raise ValueError(f"the master slot {master_slot} must be in the cluster from the start (join_step 0).")
    join_delay_s = np.broadcast_to(real_array("join_delay_s", join_delay_s, None), (slots,)).copy() \
        if np.size(join_delay_s) in (1, slots) else None
    if join_delay_s is None:
        raise ValueError(f"join_delay_s needs one value, or one per slot ({slots}).")
    if not (np.isfinite(join_delay_s).all() and (join_delay_s >= 0).all()):
        raise ValueError(f"join_delay_s is {join_delay_s.tolist()}; it must be finite seconds >= 0.")

    if rate_by_set is None:
        rate_by_set = np.zeros(0)
    else:
        rate_by_set = real_array("rate_by_set", rate_by_set, 1)
        if slots > MAX_SET_SLOTS or rate_by_set.size != 2 ** slots:
            raise ValueError(f"rate_by_set has {rate_by_set.size} entries; it needs one per set of active slots, "
                             f"2**{slots}, and at most {MAX_SET_SLOTS} slots.")
        if not (np.isfinite(rate_by_set).all() and (rate_by_set >= 0).all() and rate_by_set[0] == 0):
            raise ValueError("rate_by_set must be finite steps/s >= 0 with rate_by_set[0] = 0 (no workers, no steps).")

    time_s = np.empty(runs)
    failed = np.empty(runs, dtype=np.bool_)
    revocations = np.empty(runs, dtype=np.int64)
    steps_done = np.empty(runs)
    billed_by_slot = np.zeros((runs, slots))
    training_by_slot = np.zeros((runs, slots))
    _simulate(revoked_at, noticed, lost_steps, replacement_life, throughput, steps, int(system), recovery_s,
              replacement_delay_s, int(master_slot), horizon_s, start_s, join_step, join_delay_s, rate_by_set,
              time_s, failed, revocations, steps_done, billed_by_slot, training_by_slot)
    return RunResults(time_s, failed, revocations, billed_by_slot.sum(axis=1), steps_done,
                      training_by_slot.sum(axis=1), billed_by_slot, training_by_slot)


# The bill's own rule (per second, rounded up, one minute at least), compiled for the kernel.
_billed = njit(cache=True)(billed_seconds)
# rate_by_set is indexed by a bit mask of the active slots: 2**20 entries (8 MiB) at most.
MAX_SET_SLOTS = 20
# Runs are handed out in blocks, so each thread allocates its per-slot state once per block
# rather than once per run.
RUNS_PER_BLOCK = 256


@njit(cache=True, parallel=True)
def _simulate(revoked_at, noticed, lost_steps, replacement_life, throughput, steps, system, recovery_s,
              replacement_delay_s, master_slot, horizon_s, start_s, join_step, join_delay_s, rate_by_set, time_s,
              failed, revocations, steps_done, billed_by_slot, training_by_slot):
    runs, slots = revoked_at.shape
    for block in prange((runs + RUNS_PER_BLOCK - 1) // RUNS_PER_BLOCK):
        # Per slot: is a server up, which server it is (0 = original), when it started (billing),
        # when it began to train, and the slot's one next event: its server's revocation if up,
        # else its replacement's (or scheduled server's) arrival. `pending`: a scheduled slot
        # whose step has not come; `provisioning`: its server is requested (billed), not arrived.
        up = np.empty(slots, dtype=np.bool_)
        server = np.empty(slots, dtype=np.int64)
        started = np.empty(slots)
        joined = np.empty(slots)
        event_at = np.empty(slots)
        pending = np.empty(slots, dtype=np.bool_)
        provisioning = np.empty(slots, dtype=np.bool_)
        for r in range(block * RUNS_PER_BLOCK, min(runs, (block + 1) * RUNS_PER_BLOCK)):
            _simulate_run(r, revoked_at, noticed, lost_steps, replacement_life, throughput, steps, system,
                          recovery_s, replacement_delay_s, master_slot, horizon_s, start_s, join_step, join_delay_s,
                          rate_by_set, up, server, started, joined, event_at, pending, provisioning,
                          time_s, failed, revocations, steps_done, billed_by_slot, training_by_slot)


@njit(cache=True)
def _simulate_run(r, revoked_at, noticed, lost_steps, replacement_life, throughput, steps, system, recovery_s,
                  replacement_delay_s, master_slot, horizon_s, start_s, join_step, join_delay_s, rate_by_set, up,
                  server, started, joined, event_at, pending, provisioning, time_s, failed, revocations, steps_done,
                  billed_by_slot, training_by_slot):
    slots = revoked_at.shape[1]
    generations = replacement_life.shape[2]
    server[:] = 0
    started[:] = 0.0
    joined[:] = start_s
    provisioning[:] = False
    active = 0
    mask = 0  # bit v set: slot v's server is up (rate_by_set's index)
    for v in range(slots):
        pending[v] = join_step[v] > 0.0
        up[v] = not pending[v]
        event_at[v] = np.inf if pending[v] else revoked_at[r, v]
        if up[v]:
            active += 1
            mask |= 1 << v
    members = active  # slots in the cluster (up or waiting for a replacement): RESTART runs with all of them

    t = 0.0
    done = 0.0
    held = 0.0  # steps the job is known to hold (last rollback or commit): no rollback goes below
    # No steps before then: the first servers are being provisioned until start_s, later the ring
    # re-forms (ELASTIC) or the job restarts (RESTART). Events only push it later (max), so a
    # revocation during provisioning cannot start training early.
    resume_at = start_s
    revoked = 0
    fail = False
    while True:
        w = 0
        for v in range(1, slots):
            if event_at[v] < event_at[w]:
                w = v
        t_next = event_at[w]
        next_join = np.inf
        for v in range(slots):
            if pending[v] and join_step[v] < next_join:
                next_join = join_step[v]

        # Progress until the next event, unless the job finishes (or the horizon comes) first.
        rate = throughput[active] if rate_by_set.size == 0 else rate_by_set[mask]
        if system == RESTART and active < members:
            rate = 0.0
        resume = max(t, resume_at)
        if rate > 0.0:
            # A scheduled step before the next event: request its servers (join steps are
            # below `steps`, so it comes before the finish).
            t_join = resume + max(next_join - done, 0.0) / rate
            if t_join <= t_next and t_join < horizon_s:
                t = t_join
                done = max(done, next_join)
                for v in range(slots):
                    if pending[v] and join_step[v] <= done:
                        pending[v] = False
                        provisioning[v] = True
                        started[v] = t
                        event_at[v] = t + join_delay_s[v]
                continue
            t_finish = resume + max(steps - done, 0.0) / rate
            if t_finish <= t_next and t_finish <= horizon_s:
                t = t_finish
                done = steps
                break
            t_stop = min(t_next, horizon_s)
            if t_stop > resume:
                done += (t_stop - resume) * rate
        if t_next >= horizon_s:
            t = horizon_s
            fail = True
            break
        t = t_next

        if not up[w]:
            up[w] = True
            active += 1
            mask |= 1 << w
            joined[w] = t
            if provisioning[w]:
                # A scheduled server arrives, billed since its request; its life (revoked_at) counts
                # from the request too, so one revoked while provisioning goes at once.
                provisioning[w] = False
                members += 1
                event_at[w] = t + max(0.0, revoked_at[r, w] - join_delay_s[w])
            else:
                # A replacement arrives; it is billed from now, joining or not.
                started[w] = t
                event_at[w] = t + replacement_life[r, w, server[w] - 1]
            if system == ELASTIC or (system == RESTART and active == members):
                resume_at = max(resume_at, t + recovery_s)
            continue

        # A revocation.
        g = server[w]
        revoked += 1
        billed_by_slot[r, w] += _billed(t - started[w])
        training_by_slot[r, w] += max(0.0, t - max(joined[w], start_s))
        up[w] = False
        active -= 1
        mask &= ~(1 << w)
        if g < generations and replacement_delay_s < np.inf and not (system == STUDY and w == master_slot):
            event_at[w] = t + replacement_delay_s
            server[w] = g + 1
        else:
            event_at[w] = np.inf

        if system == STUDY:
            if w == master_slot:
                fail = True
                break
        elif system == ELASTIC:
            if not noticed[r, w, g]:
                done -= min(lost_steps[r, w, g], done - held)
            held = done
            resume_at = max(resume_at, t + recovery_s)
            if active == 0:
                coming = False
                for v in range(slots):
                    if not up[v] and event_at[v] < np.inf:
                        coming = True
                if not coming:
                    fail = True
                    break
        else:  # RESTART
            done -= min(lost_steps[r, w, g], done - held)
            held = done
            if event_at[w] == np.inf:
                fail = True
                break

    for v in range(slots):
        if up[v]:
            billed_by_slot[r, v] += _billed(t - started[v])
            training_by_slot[r, v] += max(0.0, t - max(joined[v], start_s))
        elif provisioning[v]:
            billed_by_slot[r, v] += _billed(t - started[v])  # requested, still booting: billed, never trained
    time_s[r] = t
    failed[r] = fail
    revocations[r] = revoked
    steps_done[r] = done
