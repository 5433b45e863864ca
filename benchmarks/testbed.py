"""Jobs on a real cluster on this machine (`transientvod testbed`, root): what a network does.

    python benchmarks/testbed.py soak --minutes 10 --hogs 2     # no false failure, beside CPU hogs
    python benchmarks/testbed.py vanish --repeat 3 --hogs 2     # seconds from a vanish to training again

Each case makes its own testbed (4 hosts, each host's egress shaped with tbf), runs a job on
its head with `transientvod train` (horovodrun over SSH), and takes the testbed down. The job
is conftest's tiny one, ResNet-8 on the digits, with a 10 ms sleep per step as a stand-in for
accelerator time; durable checkpoints every 50 steps. CPU hogs are busy Python processes that
run beside the job for its whole length, as a loaded machine's other work would.

- soak: no host changes at all. Any reset (a collective timeout, an ssh keepalive giving up)
  would be a false failure of the levers that make a vanished host cost seconds.
- vanish: one host vanishes (no notice, no FIN or RST) once the job runs, `--repeat` times
  on fresh testbeds; reports seconds from the vanish to the first sync at the smaller size
  and the steps lost (at most `commit_every`).
"""
from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from transientvod.testbed import cluster  # noqa: E402
from transientvod.testbed.rehearsal import Rehearsal  # noqa: E402

JOB = {
    "model": {"depth": 8, "width": 4},
    "data": {"batch_size": 16},
    "optimizer": {"lr": 0.05, "warmup_steps": 0, "schedule": "constant"},
    "train": {"commit_every": 10, "checkpoint_every": 50, "log_every": 10, "threads_per_worker": 1},
    "cluster": {"min_np": 2, "max_np": 4, "network_interface": "eth0"},
    "tracking": {"enabled": False},
}
STEP_SECONDS = "0.01"


def hog(stop_at: float) -> None:
    while time.time() < stop_at:
        sum(i * i for i in range(10000))


def start_hogs(count: int, seconds: float) -> list[multiprocessing.Process]:
    procs = [multiprocessing.Process(target=hog, args=(time.time() + seconds,), daemon=True) for _ in range(count)]
    for proc in procs:
        proc.start()
    return procs


@contextlib.contextmanager
def keep_or_temporary(out: str, case: str):
    """The job's directory: kept under --out (its log, events and metrics), else temporary."""
    if not out:
        with tempfile.TemporaryDirectory() as directory:
            yield directory
        return
    directory = Path(out) / case
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    yield directory


def job_env() -> dict:
    import os
    return {**os.environ, "TRANSIENTVOD_STEP_SECONDS": STEP_SECONDS, "MLFLOW_DISABLE_TELEMETRY": "true"}


def soak(args) -> None:
    name = "tvdsoak"
    record = cluster.up(name, args.hosts, args.bandwidth)
    hogs = []
    try:
        with keep_or_temporary(args.out, "soak") as directory:
            # Steps for about the soak's length, at the rate measured here beside two hogs.
            config = {**JOB, "train": {**JOB["train"], "steps": int(args.minutes * 60 * args.steps_per_second)}}
            job = Rehearsal(record, Path(directory), "soak", config)
            hogs = start_hogs(args.hogs, args.minutes * 60 * 3)
            started = time.monotonic()
            job.start(job.cloud_hosts(), env=job_env())
            code = job.wait(timeout=args.minutes * 60 * 3)
            wall = time.monotonic() - started
            if code != 0:
                print(job.log())
                raise SystemExit(f"soak: the job failed (exit {code}) after {wall:.0f} s")
            summary = job.summary()
            resets = sum(1 for e in job.synced() if e["rank"] == 0) - 1  # every (re)start syncs
            checkpoints = job.log_path.read_text().count("saved checkpoint")
            print(f"soak: {args.hosts} hosts at {args.bandwidth}, {args.hogs} CPU hogs, wall {wall:.0f} s, "
                  f"{summary['steps']} steps ({summary['steps'] / wall:.1f} steps/s incl. start-up), "
                  f"{checkpoints} durable checkpoints, world sizes {summary['world_sizes_seen']}, "
                  f"resets {resets}, revocations {summary['revocations_survived']}, "
                  f"steps lost {summary['steps_lost']}")
    finally:
        for proc in hogs:
            proc.terminate()
        cluster.down(name)


def vanish(args) -> None:
    rows = []
    for attempt in range(args.repeat):
        name = f"tvdvan{attempt}"
        record = cluster.up(name, args.hosts, args.bandwidth)
        hogs = []
        try:
            with keep_or_temporary(args.out, f"vanish-{attempt + 1}") as directory:
                config = {**JOB, "train": {**JOB["train"], "steps": 600}}
                job = Rehearsal(record, Path(directory), "vanish", config)
                hogs = start_hogs(args.hogs, 600)
                job.start(job.cloud_hosts(), env=job_env())
                job.wait_for_step(100, timeout=300)
                victim = record.layout.hosts[-1].name
                vanished_at = time.time()
                cluster.vanish(name, victim)
                code = job.wait(timeout=600)
                if code != 0:
                    print(job.log())
                    raise SystemExit(f"vanish: the job failed (exit {code})")
                summary = job.summary()
                resumed = job.first_sync_at_size(args.hosts - 1, vanished_at)
                rows.append((attempt + 1, resumed["time"] - vanished_at if resumed else float("nan"),
                             summary["steps_lost"], summary["world_sizes_seen"]))
                print(f"vanish {attempt + 1}: training at size {args.hosts - 1} after "
                      f"{rows[-1][1]:.1f} s; {rows[-1][2]} steps lost; sizes {rows[-1][3]}", flush=True)
        finally:
            for proc in hogs:
                proc.terminate()
            cluster.down(name)
    seconds = sorted(r[1] for r in rows)
    print(f"vanish: {args.hosts} hosts at {args.bandwidth}, {args.hogs} CPU hogs: recovery "
          f"{', '.join(f'{s:.1f}' for s in seconds)} s (median {seconds[len(seconds) // 2]:.1f}); "
          f"steps lost {[r[2] for r in rows]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="case", required=True)
    for case in ("soak", "vanish"):
        p = sub.add_parser(case)
        p.add_argument("--hosts", type=int, default=4)
        p.add_argument("--bandwidth", default="100mbit")
        p.add_argument("--hogs", type=int, default=2, help="busy CPU processes beside the job")
        p.add_argument("--out", default="runs/testbed-bench", help="keep each job's directory here ('' to not)")
        if case == "soak":
            p.add_argument("--minutes", type=float, default=10.0)
            p.add_argument("--steps-per-second", type=float, default=12.0,
                           help="to size the job to --minutes (measured beside 2 hogs here)")
        else:
            p.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    cluster.preflight()
    {"soak": soak, "vanish": vanish}[args.case](args)


if __name__ == "__main__":
    main()
