"""How fast the planner's Monte Carlo kernel plays runs of a job on a revocable cluster.

    .venv/bin/python benchmarks/simulate.py                  # first call loads the cached kernel
    .venv/bin/python benchmarks/simulate.py --cold           # compile from scratch (empty numba cache)
    .venv/bin/python benchmarks/simulate.py --runs 100000 --reps 9

Goal: 10,000 runs of a 64,000-step job in well under 2 s (after the compile), growing and
mixed clusters included (the end-to-end part).

The first call of `simulate_runs` in a process compiles the numba kernel, or with a warm
`__pycache__` loads it; --cold points numba at an empty cache directory so that the first call
is a real compile. Then for each cluster size and system, `simulate_runs` (validation
included) is timed on the same drawn inputs, best of --reps. The inputs: every server lives
an exponential time (mean --mean-life-h), 4 replacements per slot arriving after 120 s, ELASTIC
pauses 30 s per membership change, 90% of revocations come with a notice, a lost commit
interval is uniform in [0, 100) steps (RESTART: [0, 1000), a checkpoint every 1000 steps),
and 4 K80-like workers do about 2 steps/s each with 3% lost per extra worker.
"""
from __future__ import annotations

import argparse
import atexit
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

GOAL_RUNS = 10_000
GOAL_SECONDS = 2.0
GENERATIONS = 4


def draw(rng, runs: int, workers: int, mean_life_s: float, lost_high: float):
    import numpy as np

    revoked_at = rng.exponential(mean_life_s, (runs, workers))
    noticed = rng.random((runs, workers, GENERATIONS + 1)) < 0.9
    lost_steps = rng.uniform(0.0, lost_high, (runs, workers, GENERATIONS + 1))
    replacement_life = rng.exponential(mean_life_s, (runs, workers, GENERATIONS))
    k = np.arange(workers + 1, dtype=float)
    throughput = 2.0 * k * (1.0 - 0.03 * np.maximum(k - 1.0, 0.0))
    return revoked_at, noticed, lost_steps, replacement_life, throughput


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=GOAL_RUNS)
    parser.add_argument("--steps", type=float, default=64_000)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--mean-life-h", type=float, default=6.0)
    parser.add_argument("--cold", action="store_true", help="compile into an empty numba cache")
    args = parser.parse_args()

    if args.cold:
        # Must be set before numba is imported: it reads the cache location once.
        os.environ["NUMBA_CACHE_DIR"] = tempfile.mkdtemp(prefix="numba-cold-")
        atexit.register(shutil.rmtree, os.environ["NUMBA_CACHE_DIR"], ignore_errors=True)
    import numba
    import numpy as np

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from transientvod.planner.montecarlo import ELASTIC, RESTART, STUDY, SYSTEM_NAMES, simulate_runs

    rng = np.random.default_rng(0)
    options = {"recovery_s": 30.0, "replacement_delay_s": 120.0}

    inputs = draw(rng, 16, 4, args.mean_life_h * 3600.0, 100.0)
    start = time.perf_counter()
    simulate_runs(*inputs, args.steps, ELASTIC, **options)
    first = time.perf_counter() - start
    print(f"first call ({'compile, empty cache' if args.cold else 'compile or cache load'}): {first:.2f} s   "
          f"[numba {numba.__version__}, {numba.get_num_threads()} threads, {os.cpu_count()} cpus]")
    print(f"{args.runs} runs of a {args.steps:.0f}-step job, best of {args.reps}:")
    print(f"{'workers':>7} {'system':>8} {'s/call':>9} {'runs/s':>11} {'of goal':>8} "
          f"{'fail':>6} {'revs':>5} {'p50 h':>6} {'p50 billed h':>12}")
    for workers in (4, 8):
        for system in (STUDY, ELASTIC, RESTART):
            lost_high = 1000.0 if system == RESTART else 100.0
            inputs = draw(rng, args.runs, workers, args.mean_life_h * 3600.0, lost_high)
            best = float("inf")
            for _ in range(args.reps):
                start = time.perf_counter()
                results = simulate_runs(*inputs, args.steps, system, **options)
                best = min(best, time.perf_counter() - start)
            summary = results.summary()
            # of goal: the time for the goal's 10,000 runs as a fraction of its 2 s.
            of_goal = best * GOAL_RUNS / args.runs / GOAL_SECONDS
            print(f"{workers:>7} {SYSTEM_NAMES[system]:>8} {best:>9.4f} {args.runs / best:>11,.0f} {of_goal:>8.2%} "
                  f"{summary['failure_probability']:>6.3f} {summary['mean_revocations']:>5.2f} "
                  f"{summary['time_s_p50'] / 3600:>6.2f} {summary['billed_seconds_p50'] / 3600:>12.2f}")
    end_to_end(args.runs, args.reps)


def end_to_end(runs: int, reps: int) -> None:
    """What `transientvod simulate` does per configuration: replay the study's 4-K80 trace
    (sampling the later lives of the VMs that outlived it), draw losses and replacements,
    run the kernel, price the bill."""
    from transientvod.planner.scenario import Cluster, Simulator, Workload

    simulator = Simulator(Workload(), seed=0)
    print(f"end to end (Simulator.run: inputs from the shipped study data, kernel, prices), {runs} runs, best of {reps}:")
    for cluster, model in ((Cluster("k80", 4, "spot", "study"), "trace"),
                           (Cluster("k80", 8, "spot", "elastic", replacement_delay_s=300.0), "trace"),
                           (Cluster("k80", 8, "spot", "elastic", replacement_delay_s=300.0), "lifetimes"),
                           (Cluster("k80", 1, "spot", "study", schedule=((16000, 1), (32000, 1), (48000, 1))),
                            "lifetimes"),
                           (Cluster(mix=(("k80", 4), ("p100", 2), ("v100", 2)), market="spot", system="elastic",
                                    replacement_delay_s=300.0), "lifetimes")):
        best = float("inf")
        for _ in range(reps):
            start = time.perf_counter()
            outcome = simulator.run(cluster, runs, model)
            best = min(best, time.perf_counter() - start)
        stats = outcome.stats()
        print(f"  {cluster.label:<60} {model:<9} {best:.4f} s  ({best * GOAL_RUNS / runs / GOAL_SECONDS:.2%} of the "
              f"2 s goal)  mean {stats['time_h_mean']:.3f} h, ${stats['cost_usd_mean']:.3f}")


if __name__ == "__main__":
    main()
