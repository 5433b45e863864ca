"""Jobs on a real cluster on this machine (`transientvod testbed`, root): what a network does.

    python benchmarks/testbed.py soak --minutes 10 --hogs 2     # no false failure, beside CPU hogs
    python benchmarks/testbed.py vanish --repeat 3 --hogs 2     # seconds from a vanish to training again
    python benchmarks/testbed.py revocations                    # Horovod's defaults vs transientvod, real trace time
    python benchmarks/testbed.py notices --repeat 3             # steps/s with notices on and off

Each case makes its own testbed (4 hosts, each host's egress shaped with tbf), runs jobs on
its head with `transientvod train` (horovodrun over SSH), and takes the testbed down. Each
step carries a sleep on every rank (TRANSIENTVOD_STEP_SECONDS), a stand-in for accelerator
time that does not compete for this machine's two cores. CPU hogs are busy Python processes
beside the job, as a loaded machine's other work would be.

- soak: the tiny job (ResNet-8, width 4, digits), no host changes at all. Any reset (a
  collective timeout, an ssh keepalive giving up) would be a false failure of the levers
  that make a vanished host cost seconds.
- vanish: one host vanishes (no notice, no FIN or RST) once the job runs, `--repeat` times on
  fresh testbeds; seconds from the vanish to the first sync at the smaller size, steps lost.
  `--victim rank0` vanishes rank 0's host; `--lag 0` has discovery drop it at once.
- revocations: benchmarks/traces/three_revocations.csv (three real revocation times of the
  study's 4-K80 trace: 634.6 s, 785.7 s, 857.0 s) replayed at real time, each revoked host
  vanishing at its revocation. Three runs of the same job: (a) as Horovod's elastic examples
  run it: no notice, commit every 50 steps, Horovod's own 30 s Gloo timeout on every
  collective; (a+) the same with transientvod's 5 s collective timeout; (b) transientvod with
  notices (the host leaves at its 30 s notice, commits every step meanwhile). All three run
  on this project's Horovod build, whose ssh keepalive lets the driver learn of a vanished
  worker at all (without it a vanish hangs the job: issue 10).
- notices: the tiny job on 4 shaped hosts, discovery from a replayed trace whose first notice
  comes after the job, with notices on (a watcher on every worker) and off (`spot.notices:
  false`: no watcher), alternating, `--repeat` times each. Goal: on within 2 % of off. (The
  ring votes either way, since the vote also carries host updates; it was measured with the
  vote on one side only, at 0.991, when it voted every step: docs/results.md, "Notices, the
  commit vote and checkpoints".)

steps/s leave out start-up: they are (last step - step 50) over the time between the two
metrics rows. Job directories are kept under --out (log, events, metrics).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from revocation_outcome import revocation_delays, why_it_failed  # noqa: E402
from transientvod.testbed import cluster  # noqa: E402
from transientvod.testbed.rehearsal import Rehearsal  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TRACE = REPO / "benchmarks" / "traces" / "three_revocations.csv"
REVOCATIONS = (634.633528, 785.749127, 857.013258)  # the trace's three workers, in trace seconds
JOB = {
    "model": {"depth": 8, "width": 4},
    "data": {"batch_size": 16},
    "optimizer": {"lr": 0.05, "warmup_steps": 0, "schedule": "constant"},
    "train": {"commit_every": 10, "checkpoint_every": 50, "log_every": 10, "threads_per_worker": 1},
    "cluster": {"min_np": 2, "max_np": 4, "network_interface": "eth0"},
    "tracking": {"enabled": False},
}
RESNET32 = {"depth": 32, "width": 16}  # benchmarks/exchange.py
MEASURED_FROM_STEP = 50  # steps/s leave out the start-up before this step
HOROVOD_GLOO_TIMEOUT = "30"  # Horovod's default (HOROVOD_GLOO_TIMEOUT_SECONDS), on every collective


def job_config(**sections) -> dict:
    config = json.loads(json.dumps(JOB))
    for section, values in sections.items():
        config.setdefault(section, {}).update(values)
    return config


def hog(stop_at: float) -> None:
    while time.time() < stop_at:
        sum(i * i for i in range(10000))


@contextlib.contextmanager
def hogs_running(count: int, seconds: float):
    procs = [multiprocessing.Process(target=hog, args=(time.time() + seconds,), daemon=True) for _ in range(count)]
    for proc in procs:
        proc.start()
    try:
        yield
    finally:
        for proc in procs:
            proc.terminate()


@contextlib.contextmanager
def testbed(name: str, hosts: int, bandwidth: str, congestion: str = ""):
    record = cluster.up(name, hosts, bandwidth, congestion=congestion)
    try:
        yield record
    finally:
        cluster.down(name)


@contextlib.contextmanager
def job_directory(out: str, case: str):
    """The job's directory: kept under --out (its log, events and metrics), else temporary."""
    if not out:
        with tempfile.TemporaryDirectory() as directory:
            yield Path(directory)
        return
    directory = Path(out) / case
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    yield directory


def job_env(step_seconds: float, **extra: str) -> dict:
    return {**os.environ, "TRANSIENTVOD_STEP_SECONDS": f"{step_seconds:g}", "MLFLOW_DISABLE_TELEMETRY": "true",
            **extra}


def run_job(job: Rehearsal, discovery: str | None, env: dict, timeout: float) -> tuple[int, float]:
    """Start the job and wait for it: its exit code and wall time."""
    started = time.monotonic()
    job.start(discovery, env=env)
    code = job.wait(timeout=timeout)
    return code, time.monotonic() - started


def run_to_end(job: Rehearsal, discovery: str | None, env: dict, timeout: float) -> float:
    """The job's wall time; a failed job ends the benchmark with its log."""
    code, wall = run_job(job, discovery, env, timeout)
    if code != 0:
        print(job.log())
        raise SystemExit(f"{job.run_dir.name}: the job failed (exit {code})")
    return wall


class MachineLoad:
    """This machine's CPU use while a job runs, sampled from /proc/stat by a thread: on cores
    that all the testbed's workers share, a step that waits may be waiting for CPU, not for
    the link. `busy_share(t0, t1)` is the share of all cores busy between two wall times."""

    SAMPLE_SECONDS = 0.5

    def __init__(self):
        self.samples: list[tuple[float, int, int]] = []  # (time.time(), busy jiffies, all jiffies)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="machine-load", daemon=True)

    def __enter__(self) -> "MachineLoad":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        while True:
            fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
            idle = fields[3] + fields[4]  # idle and iowait
            self.samples.append((time.time(), sum(fields) - idle, sum(fields)))
            if self._stop.wait(self.SAMPLE_SECONDS):
                return

    def busy_share(self, start: float, end: float) -> float:
        inside = [s for s in self.samples if start <= s[0] <= end]
        if len(inside) < 2:
            return float("nan")
        (_, busy_0, all_0), (_, busy_1, all_1) = inside[0], inside[-1]
        return (busy_1 - busy_0) / max(1, all_1 - all_0)


def busy_share(job: Rehearsal, load: MachineLoad, from_step: int = MEASURED_FROM_STEP) -> float:
    """The machine's busy share over the same steps as steps_per_second."""
    first, last = _first_and_last(job, "time", from_step)
    return load.busy_share(first["time"], last["time"])


def _first_and_last(job: Rehearsal, key: str, from_step: int) -> tuple[dict, dict]:
    """Rank 0's first and last metrics rows that carry `key`, from `from_step` on."""
    rows = [r for r in job.rows("metrics.jsonl") if key in r and r["step"] >= from_step]
    return rows[0], rows[-1]


def steps_per_second(job: Rehearsal, from_step: int = MEASURED_FROM_STEP) -> float:
    first, last = _first_and_last(job, "time", from_step)
    return (last["step"] - first["step"]) / (last["time"] - first["time"])


def cpu_ms_per_step(job: Rehearsal, from_step: int = MEASURED_FROM_STEP) -> float:
    """Rank 0's CPU time per step (all its threads), over the same steps as steps_per_second:
    on cores that 4 workers share, it shows what a step costs where the wall time swings."""
    return ms_per_step(job, "cpu_s", from_step)


def ms_per_step(job: Rehearsal, key: str, from_step: int = MEASURED_FROM_STEP) -> float:
    """What a cumulative seconds counter of rank 0's metrics rows (cpu_s, exchange_wait_s,
    vote_wait_s) grew by per step, in ms, over the same steps as steps_per_second."""
    first, last = _first_and_last(job, key, from_step)
    return 1000 * (last[key] - first[key]) / (last["step"] - first["step"])


# -- soak and vanish ---------------------------------------------------------------------------

def soak(args) -> None:
    steps = int(args.minutes * 60 * args.steps_per_second)  # about the soak's length, at the rate measured here
    with testbed("tvdsoak", args.hosts, args.bandwidth) as record, job_directory(args.out, "soak") as directory, \
            hogs_running(args.hogs, args.minutes * 60 * 3):
        job = Rehearsal(record, directory, "soak", job_config(train={"steps": steps}))
        wall = run_to_end(job, job.cloud_hosts(), job_env(args.step_seconds), timeout=args.minutes * 60 * 3)
        summary = job.summary()
        resets = sum(1 for e in job.synced() if e["rank"] == 0) - 1  # every (re)start syncs
        checkpoints = job.log_path.read_text().count("saved checkpoint")
        print(f"soak: {args.hosts} hosts at {args.bandwidth}, {args.hogs} CPU hogs, wall {wall:.0f} s, "
              f"{summary['steps']} steps ({summary['steps'] / wall:.1f} steps/s incl. start-up), "
              f"{checkpoints} durable checkpoints, world sizes {summary['world_sizes_seen']}, "
              f"resets {resets}, revocations {summary['revocations_survived']}, "
              f"steps lost {summary['steps_lost']}")


def vanish(args) -> None:
    rows = []
    for attempt in range(args.repeat):
        with testbed(f"tvdvan{attempt}", args.hosts, args.bandwidth) as record, \
                job_directory(args.out, f"vanish-{attempt + 1}") as directory, hogs_running(args.hogs, 600):
            job = Rehearsal(record, directory, "vanish", job_config(train={"steps": 600}))
            job.start(job.cloud_hosts(args.lag), env=job_env(args.step_seconds))
            job.wait_for_step(100, timeout=300)
            victim = job.rank0_host() if args.victim == "rank0" else \
                next(h.name for h in reversed(record.layout.hosts) if h.name != job.rank0_host())
            vanished_at = time.time()
            cluster.vanish(record.name, victim)
            if (code := job.wait(timeout=600)) != 0:
                print(job.log())
                raise SystemExit(f"vanish: the job failed (exit {code})")
            summary = job.summary()
            resumed = job.first_sync_at_size(args.hosts - 1, vanished_at)
            rows.append((resumed["time"] - vanished_at if resumed else float("nan"), summary["steps_lost"]))
            print(f"vanish {attempt + 1} ({args.victim}'s host): training at size {args.hosts - 1} after {rows[-1][0]:.1f} s; "
                  f"{rows[-1][1]} steps lost; sizes {summary['world_sizes_seen']}", flush=True)
    seconds = sorted(r[0] for r in rows)
    print(f"vanish: {args.hosts} hosts at {args.bandwidth}, {args.hogs} CPU hogs, {args.victim}'s host, discovery "
          f"{args.lag:g} s late: recovery "
          f"{', '.join(f'{s:.1f}' for s in seconds)} s (median {seconds[len(seconds) // 2]:.1f}); "
          f"steps lost {[r[1] for r in rows]}")


# -- revocations: Horovod's defaults against transientvod, at the trace's own time ---------------

REVOCATION_RUNS = {
    # name: (label, notices, extra environment)
    "a": ("(a) horovod defaults, no notice", False, {"HOROVOD_GLOO_OP_TIMEOUT_SECONDS": HOROVOD_GLOO_TIMEOUT}),
    "a+": ("(a+) 5 s collectives, no notice", False, {}),
    "b": ("(b) transientvod, notices", True, {}),
}


def revocations(args) -> None:
    print(f"revocations: {len(REVOCATIONS) + 1} hosts at {args.bandwidth}, trace at real time (x1), "
          f"{args.steps} steps, commit every {args.commit_every}, {1000 * args.step_seconds:.0f} ms per step", flush=True)
    results, failures = {}, {}
    for key in args.runs.split(","):
        label, notices, extra_env = REVOCATION_RUNS[key]
        with testbed("tvdrev", len(REVOCATIONS) + 1, args.bandwidth) as record, \
                job_directory(args.out, f"revocations-{key}") as directory:
            hosts = ",".join(h.name for h in record.layout.hosts)
            config = job_config(
                train={"steps": args.steps, "commit_every": args.commit_every,
                       "checkpoint_every": args.commit_every * 10},
                cluster={"min_np": 1, "max_np": 4, "elastic_timeout": 120},
                spot={"provider": "trace", "trace": str(TRACE), "trace_run": "1", "time_scale": 1.0,
                      # 40 trace seconds before the first notice: every run starts alike.
                      "start_at": REVOCATIONS[0] - 30 - 40, "poll_seconds": 0.25, "notices": notices,
                      "hosts": hosts, "revoke": f"vanish:{record.name}"},
                notices={"poll_seconds": 0.5})
            job = Rehearsal(record, directory, "revocations", config)
            code, wall = run_job(job, None, job_env(args.step_seconds, **extra_env), timeout=3600)
            if code != 0:
                why = why_it_failed(job.log_path.read_text(errors="replace"))
                failures[key] = f"{label:<34} FAILED at step {job.last_step()} after {wall:.0f} s: {why}"
                print(failures[key], flush=True)
                continue
            summary = job.summary()
            results[key] = (label, wall, summary, revocation_delays(job.run_dir, len(REVOCATIONS) + 1))
            print(f"{label}: wall {wall:.0f} s, lost {summary['steps_lost']}, sizes {summary['world_sizes_seen']}",
                  flush=True)
    print(f"{'run':<34} {'wall s':>7} {'lost steps':>10}  {'revocation -> new size (s)':<28} sizes")
    for line in failures.values():
        print(line)
    for label, wall, summary, delays in results.values():
        shown = ", ".join(f"{d:+.1f}" for d in delays)
        print(f"{label:<34} {wall:>7.0f} {summary['steps_lost']:>10}  {shown:<28} "
              f"{'>'.join(map(str, summary['world_sizes_seen']))}")
    if "a" in results and "b" in results:
        stalled = {k: sum(d for d in r[3] if d > 0) for k, r in results.items()}
        print(f"(b)/(a) wall time {results['b'][1] / results['a'][1]:.2f}; seconds stalled after revocations: "
              + ", ".join(f"({k}) {s:.1f}" for k, s in stalled.items()))


# -- notices ----------------------------------------------------------------------------------

def notices(args) -> None:
    rates = {"off": [], "on": []}
    with testbed("tvdnote", args.hosts, args.bandwidth) as record:
        hosts = ",".join(h.name for h in record.layout.hosts)
        for attempt in range(args.repeat):
            for mode in ("off", "on"):
                with job_directory(args.out, f"notices-{mode}-{attempt + 1}") as directory:
                    # Both modes replay the same trace (same discovery, same head); only the
                    # notices differ. Its first notice comes at 604 s, after this job.
                    config = job_config(train={"steps": args.steps, "commit_every": 50, "checkpoint_every": 500},
                                        spot={"provider": "trace", "trace": str(TRACE), "trace_run": "1",
                                              "time_scale": 1.0, "hosts": hosts, "notices": mode == "on"},
                                        cluster={"min_np": args.hosts, "max_np": args.hosts})
                    job = Rehearsal(record, directory, "notices", config)
                    run_to_end(job, None, job_env(args.step_seconds), timeout=1800)
                    if "hosts changed" in job.log_path.read_text():
                        raise SystemExit("notices: the replay changed the hosts during the job; shorten --steps")
                    rates[mode].append(steps_per_second(job))
                    print(f"notices {mode} {attempt + 1}: {rates[mode][-1]:.2f} steps/s", flush=True)
    off, on = statistics.median(rates["off"]), statistics.median(rates["on"])
    print(f"notices: {args.hosts} hosts at {args.bandwidth}, {args.steps} steps, {1000 * args.step_seconds:.0f} ms "
          f"per step: off {', '.join(f'{r:.2f}' for r in rates['off'])} steps/s (median {off:.2f}); "
          f"on {', '.join(f'{r:.2f}' for r in rates['on'])} (median {on:.2f}); on/off {on / off:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="case", required=True)
    cases = {"soak": soak, "vanish": vanish, "revocations": revocations, "notices": notices}
    for case in cases:
        p = sub.add_parser(case)
        p.add_argument("--hosts", type=int, default=4)
        p.add_argument("--hogs", type=int, default=2 if case in ("soak", "vanish") else 0,
                       help="busy CPU processes beside the job")
        p.add_argument("--out", default="runs/testbed-bench", help="keep each job's directory here ('' to not)")
        p.add_argument("--step-seconds", type=float, default=0.03 if case == "revocations" else 0.01,
                       help="sleep per step on every rank, a stand-in for accelerator time")
        p.add_argument("--bandwidth", default="1gbit" if case == "revocations" else "100mbit")
        if case == "soak":
            p.add_argument("--minutes", type=float, default=10.0)
            p.add_argument("--steps-per-second", type=float, default=12.0,
                           help="to size the job to --minutes (measured beside 2 hogs here)")
        elif case == "vanish":
            p.add_argument("--repeat", type=int, default=3)
            p.add_argument("--victim", choices=("worker", "rank0"), default="worker",
                           help="whose host vanishes: a worker's, or rank 0's (the driver's coordinator)")
            p.add_argument("--lag", type=float, default=5.0, help="seconds discovery lags behind the vanish")
        elif case == "revocations":
            p.add_argument("--runs", default="a,a+,b", help=f"which of {', '.join(REVOCATION_RUNS)}, in order")
            p.add_argument("--steps", type=int, default=6000)
            p.add_argument("--commit-every", type=int, default=50)
        elif case == "notices":
            p.add_argument("--repeat", type=int, default=3)
            p.add_argument("--steps", type=int, default=1500)
    args = parser.parse_args()
    if args.case == "revocations" and not set(args.runs.split(",")) <= set(REVOCATION_RUNS):
        parser.error(f"--runs takes {', '.join(REVOCATION_RUNS)} (comma-separated), not {args.runs!r}")
    cluster.preflight()
    cases[args.case](args)


if __name__ == "__main__":
    main()
