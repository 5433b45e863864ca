"""transientvod.planner.montecarlo: runs computed by hand, the wrapper's errors, and a plain-Python
event simulation that the numba kernel must match exactly on a few hundred random small cases.

Most hand cases use two slots with throughput [0, 1, 2] steps/s and 400 steps: the full cluster
needs 200 s, one worker alone 400 s.
"""
from __future__ import annotations

import heapq
import math

import numpy as np
import pytest

from transientvod.planner.montecarlo import ELASTIC, RESTART, STUDY, RunResults, simulate_runs

INF = math.inf
TWO = [0.0, 1.0, 2.0]


def one_run(revoked_at, system, throughput=TWO, steps=400.0, noticed=None, lost=None, lives=(), **options):
    """Simulate a single run; lives[w] lists slot w's replacements' lives (the same count per slot)."""
    slots = len(revoked_at)
    noticed = [True] * slots if noticed is None else noticed
    lost = [0.0] * slots if lost is None else lost
    lives = np.array(lives, dtype=float).reshape(slots, -1) if len(lives) else np.zeros((slots, 0))
    results = simulate_runs(np.array([revoked_at], dtype=float), np.array([noticed]), np.array([lost], dtype=float),
                            lives[None], np.array(throughput, dtype=float), steps, system, **options)
    return {name: getattr(results, name)[0].item()
            for name in ("time_s", "failed", "revocations", "billed_seconds", "steps_done")}


def outcome(time_s, billed_seconds, steps_done=400.0, failed=False, revocations=0):
    return {"time_s": time_s, "failed": failed, "revocations": revocations, "billed_seconds": billed_seconds,
            "steps_done": steps_done}


# --- runs computed by hand ------------------------------------------------------------------

@pytest.mark.parametrize("system", [STUDY, ELASTIC, RESTART])
def test_no_revocations(system):
    # 4 workers at 4 steps/s: time = steps / throughput[4], billed = 4 x max(60, ceil(time)).
    four = [0.0, 1.0, 2.0, 3.0, 4.0]
    assert one_run([INF] * 4, system, four, steps=1000) == outcome(250.0, 1000.0, 1000.0)
    assert one_run([INF] * 4, system, four, steps=1001) == outcome(250.25, 4 * 251.0, 1001.0)  # per-second ceil
    assert one_run([INF] * 4, system, four, steps=100) == outcome(25.0, 4 * 60.0, 100.0)  # one-minute minimum


def test_study_worker_revoked_mid_run():
    # 100.5 s at 2 steps/s = 201 steps; the other 199 at 1 step/s: 299.5 s. Servers: 101 + 300 s.
    assert one_run([INF, 100.5], STUDY) == outcome(299.5, 101.0 + 300.0, revocations=1)


def test_study_master_revoked_fails_the_run():
    assert one_run([100.5, INF], STUDY) == outcome(100.5, 2 * 101.0, 201.0, failed=True, revocations=1)
    # The master slot is whichever the caller names.
    assert one_run([INF, 100.5], STUDY, master_slot=1) == outcome(100.5, 2 * 101.0, 201.0, True, 1)


def test_provisioning_is_billed_but_trains_nothing():
    # 50 s of provisioning, then 200 s of training; both servers billed 250 s, trained 200 s each.
    results = simulate_runs(np.array([[INF, INF]]), np.ones((1, 2), bool), np.zeros((1, 2)), np.zeros((1, 2, 0)),
                            np.array(TWO), 400.0, STUDY, start_s=50.0)
    assert results.time_s[0] == 250.0 and results.billed_seconds[0] == 500.0
    assert results.training_seconds[0] == 400.0
    # A worker revoked at 150 s (100 s of training at 2 steps/s = 200 steps): the other 200 at
    # 1 step/s end at 350 s. Billed 150 + 350, trained 100 + 300.
    assert one_run([INF, 150.0], STUDY, start_s=50.0) == outcome(350.0, 500.0, revocations=1)
    results = simulate_runs(np.array([[INF, 150.0]]), np.ones((1, 2), bool), np.zeros((1, 2)), np.zeros((1, 2, 0)),
                            np.array(TWO), 400.0, STUDY, start_s=50.0)
    assert results.training_seconds[0] == 400.0


def test_a_revocation_during_provisioning_does_not_start_training_early():
    # ELASTIC: revoked at 10 s with a 30 s recovery; training still starts at 100 s, alone: 400 s.
    run = one_run([10.0, INF], ELASTIC, recovery_s=30.0, start_s=100.0)
    assert run == outcome(500.0, 60.0 + 500.0, revocations=1)


def test_a_scheduled_server_joins_after_its_provisioning():
    # Slot 1 is requested at step 200 (t = 200 s alone at 1 step/s) and trains from 250 s; the
    # last 150 steps at 2 steps/s: 325 s. Billed 325 + 125 (from the request), trained 325 + 75.
    results = simulate_runs(np.array([[INF, INF]]), np.ones((1, 2), bool), np.zeros((1, 2)), np.zeros((1, 2, 0)),
                            np.array(TWO), 400.0, STUDY, join_step=[0.0, 200.0], join_delay_s=50.0)
    assert (results.time_s[0], results.billed_seconds[0], results.training_seconds[0]) == (325.0, 450.0, 400.0)
    # Its life counts from the request: revoked 60 s after it, 10 s after it arrived (260 s);
    # 250 + 20 steps by then, 130 more alone: 390 s. Billed 390 + 60.
    results = simulate_runs(np.array([[INF, 60.0]]), np.ones((1, 2), bool), np.zeros((1, 2)), np.zeros((1, 2, 0)),
                            np.array(TWO), 400.0, STUDY, join_step=[0.0, 200.0], join_delay_s=50.0)
    assert (results.time_s[0], results.revocations[0], results.billed_seconds[0]) == (390.0, 1, 390.0 + 60.0)
    # Revoked while booting (life 30 s < 50 s): goes as it arrives, trains nothing.
    results = simulate_runs(np.array([[INF, 30.0]]), np.ones((1, 2), bool), np.zeros((1, 2)), np.zeros((1, 2, 0)),
                            np.array(TWO), 400.0, STUDY, join_step=[0.0, 200.0], join_delay_s=50.0)
    assert (results.time_s[0], results.revocations[0], results.training_seconds[0]) == (400.0, 1, 400.0)
    # Never reached (the master goes first at 100 s): never requested, never billed.
    results = simulate_runs(np.array([[100.0, INF]]), np.ones((1, 2), bool), np.zeros((1, 2)), np.zeros((1, 2, 0)),
                            np.array(TWO), 400.0, STUDY, join_step=[0.0, 200.0], join_delay_s=50.0)
    assert results.failed[0] and results.billed_seconds[0] == 100.0


def test_a_mixed_cluster_trains_at_the_rate_of_the_servers_left():
    # Slot 0 alone: 1 step/s, slot 1 alone: 4 steps/s, both: 2 steps/s (rate_by_set[mask]).
    rates = [0.0, 1.0, 4.0, 2.0]
    # The fast slot 1 goes at 100 s (200 steps): 200 more at 1 step/s, 300 s.
    assert one_run([INF, 100.0], STUDY, rate_by_set=rates) == outcome(300.0, 100.0 + 300.0, revocations=1)
    # The slow slot 0 goes instead (slot 1 the master): 200 more at 4 steps/s, 150 s.
    assert one_run([100.0, INF], STUDY, rate_by_set=rates, master_slot=1) == outcome(150.0, 100.0 + 150.0,
                                                                                     revocations=1)
    results = simulate_runs(np.array([[100.0, INF]]), np.ones((1, 2), bool), np.zeros((1, 2)), np.zeros((1, 2, 0)),
                            np.array(TWO), 400.0, STUDY, rate_by_set=rates, master_slot=1)
    assert results.billed_by_slot[0].tolist() == [100.0, 150.0]


def test_finishing_at_the_moment_of_a_revocation_finishes_first():
    assert one_run([200.0, INF], STUDY) == outcome(200.0, 400.0)


def test_elastic_master_revoked_with_notice_survives_after_a_pause():
    # 200 steps by t = 100, 30 s re-forming, the other 200 at 1 step/s: 330 s.
    assert one_run([100.0, INF], ELASTIC, recovery_s=30.0) == outcome(330.0, 100.0 + 330.0, revocations=1)


def test_elastic_without_notice_rolls_back():
    # 25 steps lost: 175 held, 225 to go at 1 step/s after the pause.
    run = one_run([100.0, INF], ELASTIC, noticed=[False, True], lost=[25.0, 0.0], recovery_s=30.0)
    assert run == outcome(355.0, 100.0 + 355.0, revocations=1)
    # A rollback never goes below the start: 1000 lost steps cost the 200 done.
    run = one_run([100.0, INF], ELASTIC, noticed=[False, True], lost=[1000.0, 0.0], recovery_s=30.0)
    assert run == outcome(530.0, 100.0 + 530.0, revocations=1)
    # A notice saves the work whatever lost_steps says.
    run = one_run([100.0, INF], ELASTIC, noticed=[True, True], lost=[25.0, 0.0], recovery_s=30.0)
    assert run == outcome(330.0, 430.0, revocations=1)


def test_restart_without_replacement_fails_at_the_revocation():
    run = one_run([INF, 100.0], RESTART, lost=[0.0, 50.0], recovery_s=30.0)
    assert run == outcome(100.0, 2 * 100.0, 150.0, failed=True, revocations=1)


@pytest.mark.parametrize("noticed", [False, True])
def test_restart_with_replacement(noticed):
    # Revoked at 100 (200 done, 50 lost: 150); the replacement arrives at 160, the job restarts
    # at 190, 250 steps at 2 steps/s: 315 s. Notices do not help plain synchronous training.
    run = one_run([INF, 100.0], RESTART, noticed=[True, noticed], lost=[0.0, 50.0], lives=[[INF], [INF]],
                  recovery_s=30.0, replacement_delay_s=60.0)
    assert run == outcome(315.0, 315.0 + 100.0 + 155.0, revocations=1)


def test_restart_waits_for_every_slot():
    # Both revoked (at 100, then 120 while stopped: nothing more to lose); replacements arrive at
    # 160 and 180, the job restarts at 210 and does 250 steps in 125 s.
    run = one_run([100.0, 120.0], RESTART, lost=[50.0, 50.0], lives=[[INF], [INF]], recovery_s=30.0,
                  replacement_delay_s=60.0)
    assert run == outcome(335.0, 100.0 + 120.0 + 175.0 + 155.0, revocations=2)


def test_elastic_replacement_joins_and_is_revoked_itself():
    # 0-100 s at 2: 200. Pause to 110; 110-150 at 1: 240. The replacement arrives at 150, pause to
    # 160; 160-250 at 2: 420. It is revoked at 250 (life 100 s), no generation left; pause to 260;
    # the last 580 at 1 step/s: 840 s. Servers: 840 + 100 + 100.
    run = one_run([INF, 100.0], ELASTIC, steps=1000, lives=[[INF], [100.0]], recovery_s=10.0,
                  replacement_delay_s=50.0)
    assert run == outcome(840.0, 1040.0, 1000.0, revocations=2)


def test_each_replacement_has_its_own_notice_and_lost_steps():
    # As above, but the replacement's own revocation comes without notice and loses 30 steps
    # (index 2 = the slot's second server).
    noticed = np.array([[[True, True], [True, False]]])
    lost = np.array([[[0.0, 0.0], [0.0, 30.0]]])
    results = simulate_runs(np.array([[INF, 100.0]]), noticed, lost, np.array([[[INF], [100.0]]]),
                            np.array(TWO), 1000, ELASTIC, recovery_s=10.0, replacement_delay_s=50.0)
    assert results.time_s[0] == 870.0 and results.billed_seconds[0] == 870.0 + 200.0


def test_study_replacement_joins_without_pause():
    # 0-100 at 2: 200; 100-150 at 1: 250; the replacement joins at 150 at once: 750 more in 375 s.
    run = one_run([INF, 100.0], STUDY, steps=1000, lives=[[INF], [INF]], recovery_s=30.0, replacement_delay_s=50.0)
    assert run == outcome(525.0, 525.0 + 100.0 + 375.0, 1000.0, revocations=1)


def test_study_master_is_never_replaced():
    run = one_run([100.0, INF], STUDY, lives=[[INF], [INF]], replacement_delay_s=10.0)
    assert run["failed"] and run["time_s"] == 100.0


def test_generations_run_out():
    # Slot 1's servers live 10 s each: revoked at 10, replaced at 15, revoked at 25, replaced at 30,
    # revoked at 40, then no replacement is left. STUDY loses no time to any of it.
    run = one_run([INF, 10.0], STUDY, steps=1000, lives=[[INF, INF], [10.0, 10.0]], replacement_delay_s=5.0)
    # Steps: 0-10 at 2, 10-15 at 1, 15-25 at 2, 25-30 at 1, 30-40 at 2 = 70; then 930 at 1.
    assert run == outcome(970.0, 970.0 + 3 * 60.0, 1000.0, revocations=3)


def test_all_workers_revoked_without_replacement_fails():
    # 0-50 at 2: 100 steps; pause to 80; the last worker is revoked at 80 with a notice.
    run = one_run([50.0, 80.0], ELASTIC, recovery_s=30.0)
    assert run == outcome(80.0, 60.0 + 80.0, 100.0, failed=True, revocations=2)


def test_elastic_with_no_worker_waits_for_a_replacement():
    # One slot: 100 steps by 50, a replacement at 150, joining until 160, 300 steps at 2: 310 s.
    run = one_run([50.0], ELASTIC, [0.0, 2.0], lives=[[INF]], recovery_s=10.0, replacement_delay_s=100.0)
    assert run == outcome(310.0, 60.0 + 160.0, revocations=1)


def test_horizon_reached_fails():
    run = one_run([INF], ELASTIC, [0.0, 1.0], steps=1000, horizon_s=600.0)
    assert run == outcome(600.0, 600.0, 600.0, failed=True)
    # A revocation at the horizon is not played.
    run = one_run([600.0], ELASTIC, [0.0, 1.0], steps=1000, horizon_s=600.0)
    assert run == outcome(600.0, 600.0, 600.0, failed=True)


def test_a_server_revoked_at_once_still_bills_a_minute():
    run = one_run([INF, 0.5], STUDY, steps=200)
    assert run == outcome(199.5, 200.0 + 60.0, 200.0, revocations=1)  # 1 step, then 199 at 1 step/s


def test_summary_over_successful_runs():
    results = simulate_runs(np.array([[INF], [INF], [INF], [5.0]]), np.ones((4, 1), bool), np.zeros((4, 1)),
                            np.zeros((4, 1, 0)), np.array([0.0, 1.0]), 100, ELASTIC)
    assert results.failed.tolist() == [False, False, False, True]
    assert results.summary() == {"runs": 4, "failure_probability": 0.25, "mean_revocations": 0.25,
                                 "time_s_mean": 100.0, "time_s_p50": 100.0, "time_s_p90": 100.0,
                                 "billed_seconds_mean": 100.0, "billed_seconds_p50": 100.0,
                                 "billed_seconds_p90": 100.0}
    with pytest.raises(ValueError):
        results.time_s[0] = 1.0  # results are read-only
    assert isinstance(results, RunResults)


# --- the wrapper's errors -------------------------------------------------------------------

def arguments(**changes):
    args = {"revoked_at": np.full((3, 2), INF), "noticed": np.ones((3, 2), bool), "lost_steps": np.zeros((3, 2)),
            "replacement_life": np.zeros((3, 2, 1)), "throughput": np.array(TWO), "steps": 100, "system": ELASTIC}
    args.update(changes)
    return args


@pytest.mark.parametrize("changes, message", [
    ({"noticed": np.ones((3, 3), bool)}, r"noticed has shape \(3, 3\)"),
    ({"lost_steps": np.zeros((2, 2))}, r"lost_steps has shape \(2, 2\)"),
    ({"lost_steps": np.zeros((3, 2, 3))}, r"\[runs, workers, generations \+ 1\] = \(3, 2, 2\)"),
    ({"replacement_life": np.zeros((3, 1, 1))}, r"replacement_life has shape \(3, 1, 1\)"),
    ({"replacement_life": np.zeros((3, 2))}, "replacement_life has 2 dimensions; it must have 3"),
    ({"revoked_at": np.full(3, INF)}, "revoked_at has 1 dimensions"),
    ({"throughput": np.array([0.0, 1.0])}, "at least 3"),
    ({"throughput": np.array([1.0, 1.0, 2.0])}, r"throughput\[0\] = 0"),
    ({"noticed": np.ones((3, 2))}, "noticed has dtype float64; it must be bool"),
    ({"revoked_at": np.full((3, 2), "x")}, "revoked_at has dtype <U1"),
    ({"revoked_at": np.full((3, 2), np.nan)}, "revoked_at has a NaN or negative time"),
    ({"lost_steps": np.full((3, 2), -1.0)}, "lost_steps must be finite and >= 0"),
    ({"system": 3}, "system is 3; use STUDY"),
    ({"steps": 0}, "steps is 0.0; it must be a finite number > 0"),
    ({"horizon_s": INF}, "horizon_s is inf"),
    ({"master_slot": 2}, "master_slot is 2; it must be a slot index 0..1"),
    ({"replacement_delay_s": -1}, "replacement_delay_s is -1.0"),
    ({"recovery_s": INF}, "recovery_s is inf"),
    ({"start_s": -1.0}, "start_s is -1.0"),
    ({"join_step": [0.0, 100.0]}, r"join_step must be steps from 0 .* to below steps \(100\)"),
    ({"join_step": [0.0]}, "join_step has 1 entries; it needs one per slot"),
    ({"join_step": [10.0, 0.0]}, "the master slot 0 must be in the cluster from the start"),
    ({"rate_by_set": [0.0, 1.0, 2.0]}, r"rate_by_set has 3 entries; it needs one per set of active slots, 2\*\*2"),
    ({"rate_by_set": [1.0, 1.0, 2.0, 2.0]}, r"rate_by_set\[0\] = 0"),
    ({"join_delay_s": -1.0}, r"join_delay_s is \[-1.0, -1.0\]"),
    ({"join_delay_s": [1.0, 2.0, 3.0]}, r"join_delay_s needs one value, or one per slot \(2\)"),
    ({"start_s": 7 * 24 * 3600.0}, "start_s is 604800.0; it must be seconds >= 0 before horizon_s"),
])
def test_wrapper_errors(changes, message):
    with pytest.raises(ValueError, match=message):
        simulate_runs(**arguments(**changes))


def test_wrapper_accepts_integer_arrays_and_no_runs():
    results = simulate_runs(**arguments(revoked_at=np.full((3, 2), 10**6), throughput=np.array([0, 1, 2])))
    assert results.time_s.tolist() == [50.0, 50.0, 50.0]
    empty = simulate_runs(**arguments(revoked_at=np.zeros((0, 2)), noticed=np.ones((0, 2), bool),
                                      lost_steps=np.zeros((0, 2)), replacement_life=np.zeros((0, 2, 1))))
    assert empty.time_s.size == 0 and math.isnan(empty.summary()["time_s_mean"])


# --- a plain-Python event simulation, matched exactly -----------------------------------------

def reference_run(revoked_at, noticed, lost, lives, throughput, steps, system, recovery_s, delay_s, master, horizon_s,
                  start_s=0.0, join_step=None, join_delay_s=0.0, rate_by_set=None):
    """One run, with a heap of (time, slot, what) events and a list of servers' (billed from,
    trained from, end): other bookkeeping than the kernel's, the same rules and the same float
    arithmetic."""
    slots, generations = lives.shape
    join_step = [0.0] * slots if join_step is None else list(join_step)
    join_delay_s = np.broadcast_to(join_delay_s, (slots,))
    pending = {w for w in range(slots) if join_step[w] > 0}  # scheduled slots whose step has not come
    requested = {}  # scheduled slots booting: requested when
    events = [(revoked_at[w], w, "revoked") for w in range(slots) if revoked_at[w] < INF and w not in pending]
    heapq.heapify(events)
    server = [0] * slots  # which server of the slot is up or coming
    start = {w: (0.0, start_s) for w in range(slots) if w not in pending}  # up: (billed from, trains from)
    members = len(start)
    ended = []  # (billed from, trains from, end) of servers already revoked
    t = done = held = 0.0
    resume_at = start_s
    revocations, failed = 0, False
    while True:
        t_next = events[0][0] if events else INF
        next_join = min((join_step[w] for w in pending), default=INF)
        rate = throughput[len(start)] if rate_by_set is None else rate_by_set[sum(1 << v for v in start)]
        if system == RESTART and len(start) < members:
            rate = 0.0
        resume = max(t, resume_at)
        if rate > 0:
            t_join = resume + max(next_join - done, 0.0) / rate
            if t_join <= t_next and t_join < horizon_s:
                t, done = t_join, max(done, next_join)
                for w in sorted(pending):
                    if join_step[w] <= done:
                        pending.discard(w)
                        requested[w] = t
                        heapq.heappush(events, (t + join_delay_s[w], w, "arrives"))
                continue
            t_finish = resume + max(steps - done, 0.0) / rate
            if t_finish <= t_next and t_finish <= horizon_s:
                t, done = t_finish, steps
                break
            if min(t_next, horizon_s) > resume:
                done += (min(t_next, horizon_s) - resume) * rate
        if t_next >= horizon_s:
            t, failed = horizon_s, True
            break
        t, w, what = heapq.heappop(events)
        if what == "arrives":
            if w in requested:
                start[w] = (requested.pop(w), t)
                members += 1
                heapq.heappush(events, (t + max(0.0, revoked_at[w] - join_delay_s[w]), w, "revoked"))
            else:
                start[w] = (t, t)
                heapq.heappush(events, (t + lives[w, server[w] - 1], w, "revoked"))
            if system == ELASTIC or (system == RESTART and len(start) == members):
                resume_at = max(resume_at, t + recovery_s)
            continue
        g = server[w]
        revocations += 1
        ended.append((w, *start.pop(w), t))
        replaced = g < generations and delay_s < INF and not (system == STUDY and w == master)
        if replaced:
            server[w] += 1
            heapq.heappush(events, (t + delay_s, w, "arrives"))
        if system == STUDY and w == master:
            failed = True
            break
        if system == ELASTIC or system == RESTART:
            if system == RESTART or not noticed[w, g]:
                done -= min(lost[w, g], done - held)
            held = done
        if system == ELASTIC:
            resume_at = max(resume_at, t + recovery_s)
            if not start and not events:
                failed = True
                break
        if system == RESTART and not replaced:
            failed = True
            break
    servers = ended + [(w, billed_from, trains_from, t) for w, (billed_from, trains_from) in start.items()]
    servers += [(w, begin, INF, t) for w, begin in requested.items()]  # booting at the end: billed, no training
    # The bill's rule (billing.meter): whole seconds rounded up after rounding to microseconds.
    billed = [0.0] * slots
    for w, begin, _, end in servers:
        billed[w] += max(60.0, math.ceil(round(end - begin, 6)))
    training = sum(max(0.0, end - max(trains, start_s)) for _, _, trains, end in servers)
    return t, failed, revocations, float(sum(billed)), done, training, billed


def test_kernel_matches_a_plain_python_simulation():
    rng = np.random.default_rng(20240301)
    for case in range(300):
        runs, slots, generations = 4, int(rng.integers(1, 5)), int(rng.integers(0, 3))
        system = int(rng.integers(0, 3))
        # Times on a 10 s grid half the time, so that ties between events (and with the finish) occur.
        grid = rng.random() < 0.5
        scale = float(rng.choice([50.0, 300.0, 3000.0]))

        def times(shape):
            values = rng.exponential(scale, shape)
            values = np.round(values, -1) if grid else values
            return np.where(rng.random(shape) < 0.2, INF, values)

        revoked_at, lives = times((runs, slots)), times((runs, slots, generations))
        per_server = rng.random() < 0.5
        shape = (runs, slots, generations + 1) if per_server else (runs, slots)
        noticed = rng.random(shape) < 0.5
        lost = np.round(rng.uniform(0, 200, shape)) if grid else rng.uniform(0, 200, shape)
        throughput = np.concatenate([[0.0], rng.uniform(0.5, 3.0, slots)])
        if rng.random() < 0.1:
            throughput[rng.integers(1, slots + 1)] = 0.0
        options = {"recovery_s": float(rng.choice([0.0, 10.0, 45.5])),
                   "replacement_delay_s": float(rng.choice([INF, 0.0, 20.0, 120.0])),
                   "master_slot": int(rng.integers(0, slots)),
                   "horizon_s": float(rng.choice([2000.0, 7 * 24 * 3600.0])),
                   "start_s": float(rng.choice([0.0, 0.0, 30.0, 155.5]))}
        steps = float(rng.choice([100.0, 1000.0, 2345.5]))
        # A growing cluster in half the cases: slots other than the master join at a step.
        join_step = np.zeros(slots)
        if rng.random() < 0.5:
            joins = np.round(rng.uniform(0, steps, slots), -1 if grid else 3)
            join_step = np.where(rng.random(slots) < 0.6, np.minimum(joins, steps - 1), 0.0)
            join_step[options["master_slot"]] = 0.0
        options["join_step"] = join_step
        # A mixed cluster in a third of the cases: a rate for every set of active slots.
        if rng.random() < 0.33:
            options["rate_by_set"] = np.concatenate([[0.0], rng.uniform(0.2, 3.0, 2 ** slots - 1)])
        options["join_delay_s"] = (float(rng.choice([0.0, 25.0, 140.0])) if rng.random() < 0.5
                                   else rng.choice([0.0, 25.0, 140.0], slots))
        results = simulate_runs(revoked_at, noticed, lost, lives, throughput, steps, system, **options)

        noticed3 = noticed if per_server else np.repeat(noticed[:, :, None], generations + 1, axis=2)
        lost3 = lost if per_server else np.repeat(lost[:, :, None], generations + 1, axis=2)
        for r in range(runs):
            expected = reference_run(revoked_at[r], noticed3[r], lost3[r], lives[r], throughput, steps, system,
                                     options["recovery_s"], options["replacement_delay_s"], options["master_slot"],
                                     options["horizon_s"], options["start_s"], join_step, options["join_delay_s"],
                                     options.get("rate_by_set"))
            got = (results.time_s[r], results.failed[r], results.revocations[r], results.billed_seconds[r],
                   results.steps_done[r])
            assert tuple(x.item() for x in got) == expected[:5], f"case {case} run {r}: {options}, system {system}"
            # Summed in another order: equal up to rounding.
            assert results.training_seconds[r] == pytest.approx(expected[5], rel=1e-12, abs=1e-9)
            assert results.billed_by_slot[r].tolist() == expected[6]


def test_servers_are_billed_by_the_bills_own_rule():
    """The kernel calls a numba compilation of billing.meter.billed_seconds, not a copy."""
    from transientvod.billing.meter import billed_seconds
    from transientvod.planner.montecarlo import _billed

    for seconds in (0.0, 59.5, 60.2, 90.4, 1090.1 - 1000.1, 3600.0001):
        assert _billed(seconds) == billed_seconds(seconds)
