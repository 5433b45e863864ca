"""Goodput under a real revocation trace: how much of a job's training time an oracle would need.

    python benchmarks/goodput.py                          # root: a 4-host testbed, about 30 min
    python benchmarks/goodput.py --runs a,b --step-seconds 0.1 --steps 2600

The job and the trace are benchmarks/testbed.py's `revocations` case: ResNet-8 (width 4) on the
digits, 4 namespaced hosts, benchmarks/traces/three_revocations.csv (three real revocation
times of the study's 4-K80 trace) replayed at real time, each revoked host vanishing at its
revocation, a sleep per step standing in for accelerator time (0.2 s by default, a K80's step
of the study's ResNet-32 is longer still: the larger the sleep, the less the four workers'
contention for this machine's two cores moves a rate between jobs). --steps is sized so that
the job ends soon after the trace's third revocation (292 s in). Its runs: (a) Horovod's
defaults (no notice, commit every 50 steps, Horovod's 30 s Gloo timeout), (a+) transientvod
without notices (the same with its 5 s collective timeout), (b) transientvod with notices; each
on a fresh testbed.

In the same run of this script, on a testbed of the same shape, the job also runs without revocations
at every world size the trace passes through (4, 3, 2, 1): its steady steps/s r(w), from step
50 on; the 4-host one runs the whole job, so its final accuracy is the revocation-free one.

    oracle time = sum over the steps the job kept of 1 / r(w), w its world size at that step
    goodput     = oracle time / the job's training time

The job's training time runs from rank 0's first sync to its last step, so neither side pays
the start-up; steps lost to a roll-back are not in the oracle's sum (they were done twice). A
world size comes from rank 0's metrics rows (every 10 steps), so a change inside those 10 steps
counts at the later size. r(w) leaves out the first 50 steps, which are slower everywhere: the
oracle is a little fast, so goodput is a little low. Goal (issue 53): >= 95 % with notices.

Not modelled yet: replacement servers joining after a revocation (the study's trace has none;
a cloud's replacement would need the trace provider to bring hosts back).
Each run appends itself to benchmarks/results/goodput.json (`render_results.py` puts it on
docs/results.md).
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from revocation_outcome import why_it_failed  # noqa: E402
from testbed import (REVOCATION_RUNS, REVOCATIONS, TRACE, job_config, job_directory, job_env, run_job,  # noqa: E402
                     steps_per_second, testbed)
from transientvod.testbed import cluster  # noqa: E402
from transientvod.testbed.rehearsal import Rehearsal  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results" / "goodput.json"
HOSTS = len(REVOCATIONS) + 1
GOAL = 0.95  # with notices
CALIBRATION_STEPS = 400  # at the smaller sizes: enough steady steps after the first 50


def kept_sizes(rows: list[dict]) -> list[tuple[int, int, int]]:
    """(first step, last step, world size) for each stretch of the steps the job kept, from
    rank 0's metrics rows in the order written: a row at step s says the steps since the row
    before it ran at its world size. A row below an earlier one's step comes after a roll-back:
    the steps above it were lost, and the steps up to it were trained again, at its size."""
    kept: dict[int, tuple[int, int]] = {}  # last step of a stretch -> (its first step, world size)
    for row in rows:
        if "world_size" not in row:
            continue  # the evaluation's row
        step = row["step"]
        for lost in [end for end in kept if end > step]:
            del kept[lost]
        before = max((end for end in kept if end < step), default=0)
        kept[step] = (before + 1, row["world_size"])
    return [(first, last, size) for last, (first, size) in sorted(kept.items())]


def oracle_seconds(rows: list[dict], rates: dict[int, float]) -> float:
    """The time the kept steps take, each at the revocation-free steps/s of its world size."""
    return sum((last - first + 1) / rates[size] for first, last, size in kept_sizes(rows))


def training_seconds(job: Rehearsal) -> float:
    """From rank 0's first sync to its last step's metrics row."""
    started = min(e["time"] for e in job.synced() if e["rank"] == 0)
    return max(r["time"] for r in job.rows("metrics.jsonl") if "time" in r and "world_size" in r) - started


@contextlib.contextmanager
def run_case(record, out: str, case: str, config: dict, env: dict, timeout: float):
    """One job on the testbed, run to its end: (the job, why it failed or None), to be read
    inside the block (without --out its directory goes at the block's end)."""
    with job_directory(out, f"goodput-{case}") as directory:
        job = Rehearsal(record, directory, "goodput", config)
        code, wall = run_job(job, None if config.get("spot") else job.cloud_hosts(), env, timeout)
        failed = None if code == 0 else (f"FAILED at step {job.last_step()} after {wall:.0f} s: "
                                         f"{why_it_failed(job.log_path.read_text(errors='replace'))}")
        yield job, failed


def calibrate(record, args) -> tuple[dict[int, float], float]:
    """r(w) for w = HOSTS .. 1, and the final accuracy of the whole job on HOSTS hosts."""
    rates, accuracy = {}, float("nan")
    for size in range(HOSTS, 0, -1):
        steps = args.steps if size == HOSTS else CALIBRATION_STEPS
        config = job_config(train={"steps": steps, "commit_every": args.commit_every,
                                   "checkpoint_every": args.commit_every * 10},
                            cluster={"min_np": size, "max_np": size})
        with run_case(record, args.out, f"calibrate-{size}", config, job_env(args.step_seconds), 3600) as (job, failed):
            if failed:
                raise SystemExit(f"goodput: the revocation-free job on {size} hosts {failed}")
            rates[size] = steps_per_second(job)
            if size == HOSTS:
                accuracy = job.summary()["test_accuracy"]
        print(f"revocation-free, {size} hosts: {rates[size]:.2f} steps/s", flush=True)
    return rates, accuracy


def revoked_run(args, key: str, rates: dict[int, float]) -> dict:
    """One run of the job under the trace, on a testbed of its own (its hosts vanish)."""
    label, notices, extra_env = REVOCATION_RUNS[key]
    # A testbed's name is at most 8 letters or digits.
    with testbed(f"tvdgp{key.replace('+', 'p')}", HOSTS, args.bandwidth) as record:
        hosts = ",".join(h.name for h in record.layout.hosts)
        config = job_config(
            train={"steps": args.steps, "commit_every": args.commit_every,
                   "checkpoint_every": args.commit_every * 10},
            cluster={"min_np": 1, "max_np": HOSTS, "elastic_timeout": 120},
            spot={"provider": "trace", "trace": str(TRACE), "trace_run": "1", "time_scale": 1.0,
                  # 40 trace seconds before the first notice: every run starts alike.
                  "start_at": REVOCATIONS[0] - 30 - 40, "poll_seconds": 0.25, "notices": notices,
                  "hosts": hosts, "revoke": f"vanish:{record.name}"},
            notices={"poll_seconds": 0.5})
        with run_case(record, args.out, key, config, job_env(args.step_seconds, **extra_env), 3600) as (job, failed):
            if failed:
                return {"run": label, "failed": failed}
            summary = job.summary()
            oracle, training = oracle_seconds(job.rows("metrics.jsonl"), rates), training_seconds(job)
    return {"run": label, "training_s": round(training, 1), "oracle_s": round(oracle, 1),
            "goodput": round(oracle / training, 3), "steps_lost": summary["steps_lost"],
            "sizes": ">".join(map(str, summary["world_sizes_seen"])), "accuracy": round(summary["test_accuracy"], 4)}


def write_results(rows: list[dict], rates: dict[int, float], accuracy: float, args) -> None:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    document = json.loads(RESULTS.read_text()) if RESULTS.exists() else {"benchmark": "benchmarks/goodput.py", "runs": []}
    columns = ["run", "training_s", "oracle_s", "goodput", "steps_lost", "sizes", "accuracy"]
    document["runs"].append({
        "id": f"{args.steps}-steps",
        "title": "Goodput under three real revocations (testbed, trace at real time)",
        "command": "python " + " ".join([Path(sys.argv[0]).as_posix()] + sys.argv[1:]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": commit,
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
        "columns": columns,
        # A failed run's row says why in its second column.
        "rows": [[row["run"], row["failed"]] + [""] * (len(columns) - 2) if "failed" in row
                 else [row[c] for c in columns] for row in rows],
        "summary": ["revocation-free steps/s by world size: "
                    + ", ".join(f"{w}: {r:.2f}" for w, r in sorted(rates.items(), reverse=True)),
                    f"revocation-free accuracy on {HOSTS} hosts: {accuracy:.4f}",
                    f"goal: goodput >= {GOAL:.0%} with notices"],
    })
    RESULTS.write_text(json.dumps(document, indent=2) + "\n")
    print(f"added this run to {RESULTS.relative_to(REPO)} ({len(document['runs'])} runs)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", default="a,b", help=f"which of {', '.join(REVOCATION_RUNS)}, in order")
    parser.add_argument("--steps", type=int, default=1300)
    parser.add_argument("--commit-every", type=int, default=50)
    parser.add_argument("--step-seconds", type=float, default=0.2, help="sleep per step, a stand-in for accelerator time")
    parser.add_argument("--bandwidth", default="1gbit")
    parser.add_argument("--out", default="runs/goodput-bench", help="keep each job's directory here ('' to not)")
    parser.add_argument("--no-record", action="store_true", help="do not append the run to benchmarks/results/")
    args = parser.parse_args()
    if not set(args.runs.split(",")) <= set(REVOCATION_RUNS):
        parser.error(f"--runs takes {', '.join(REVOCATION_RUNS)} (comma-separated), not {args.runs!r}")
    cluster.preflight()
    with testbed("tvdgood", HOSTS, args.bandwidth) as record:
        rates, accuracy = calibrate(record, args)
    rows = []
    for key in args.runs.split(","):
        rows.append(revoked_run(args, key, rates))
        print(json.dumps(rows[-1]), flush=True)
    print(f"{'run':<34} {'training s':>10} {'oracle s':>9} {'goodput':>8} {'lost':>5} {'accuracy':>8}  sizes")
    for row in rows:
        if "failed" in row:
            print(f"{row['run']:<34} {row['failed']}")
            continue
        print(f"{row['run']:<34} {row['training_s']:>10.1f} {row['oracle_s']:>9.1f} {row['goodput']:>8.1%} "
              f"{row['steps_lost']:>5} {row['accuracy']:>8.4f}  {row['sizes']}")
    print(f"revocation-free on {HOSTS} hosts: accuracy {accuracy:.4f}; goal: goodput >= {GOAL:.0%} with notices")
    if not args.no_record:
        write_results(rows, rates, accuracy, args)


if __name__ == "__main__":
    main()
