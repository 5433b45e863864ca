"""Revocations with and without notices: plain Horovod elastic versus transientvod.

    .venv/bin/python benchmarks/revocations.py [--steps 1500] [--time-scale 10]

The same replayed trace, model and steps run twice through `horovodrun` (elastic, Gloo) on
four local hosts (localhost, 127.0.0.1 and two more names /etc/hosts gives this machine):

  (a) the way Horovod's own elastic example works: `TorchState`, commit every K steps, and
      a host leaves discovery only when it dies (its worker is SIGKILLed at the revocation),
      so survivors roll back to the last commit and wait for Gloo to notice the dead peer;
  (b) transientvod: the interruption notice reaches the workers and the watcher, the job
      commits (every step while a notice is pending) and the host leaves discovery at once,
      so Horovod removes it gracefully before the revocation.

The trace is `benchmarks/traces/three_revocations.csv`, in the study's format: one 4-VM
cluster whose three workers are revoked at 634.6 s, 785.7 s and 857.0 s. Those are real
revocation times from the study's 4-K80 trace (us-central1-c-run8 worker-1, us-west1-b-run2
worker-2 and worker-0), put in one run so that one replay holds three revocations.

Printed for each: wall time, steps lost, recomputed samples (lost steps x global batch at
the time), and for each revocation the seconds from the revocation to training at the new
size (negative: the job already trained at the new size before the server died).

Each step carries --step-seconds of sleep on every rank (TRANSIENTVOD_STEP_SECONDS), a stand-in
for accelerator time: without it, four workers on this machine's two cores step slower than
one, which would reward (a) for losing its workers early; with one GPU per worker a step costs
about the same at any world size, and that is what the sleep models.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from revocation_outcome import revocation_delays, why_it_failed

REPO = Path(__file__).resolve().parents[1]
TRACE = REPO / "benchmarks" / "traces" / "three_revocations.csv"
FIRST_REVOCATION = 634.633528
BATCH = 16
RECOVERY = re.compile(r"recovered \((?P<cause>[^)]*)\): world size (?P<before>\d+) -> (?P<after>\d+) at step "
                      r"(?P<step>\d+); lost (?P<lost>\d+) steps")


def run(workdir: Path, name: str, notices: bool, steps: int, time_scale: float, commit_every: int,
        step_seconds: float) -> dict:
    config = {
        "run": {"name": name, "output_dir": str(workdir)},
        "model": {"depth": 8, "width": 8},
        "data": {"batch_size": BATCH},
        "optimizer": {"lr": 0.05, "warmup_steps": 0},
        "train": {"steps": steps, "commit_every": commit_every, "checkpoint_every": commit_every * 10,
                  "log_every": 10, "threads_per_worker": 1},
        "cluster": {"min_np": 1, "max_np": 4, "elastic_timeout": 60},
        "spot": {"provider": "trace", "trace": str(TRACE), "trace_run": "1", "time_scale": time_scale,
                 # Start 40 trace seconds before the first notice, so every run starts alike.
                 "start_at": FIRST_REVOCATION - 30 - 40, "poll_seconds": 0.25, "notices": notices},
        "notices": {"poll_seconds": 0.5},
    }
    path = workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {**os.environ, "TRANSIENTVOD_STEP_SECONDS": str(step_seconds)}
    done = subprocess.run([sys.executable, "-m", "transientvod.cli", "train", "--config", str(path)],
                          capture_output=True, text=True, cwd=REPO, env=env)
    run_dir = workdir / name
    if done.returncode != 0:
        # Plain elastic can lose the whole job when hard kills come close together (the last
        # survivor times out re-forming the ring); report it rather than stop the benchmark.
        steps = [json.loads(line).get("step", 0) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        return {"failed": True, "last_step": max(steps, default=0), "why": why_it_failed(done.stderr)}
    summary = json.loads((run_dir / "summary.json").read_text())
    recoveries = [m.groupdict() for m in RECOVERY.finditer(done.stderr)]
    delays = revocation_delays(run_dir, hosts_at_start=4)
    return {
        "wall_s": summary["wall_seconds"],
        "steps_lost": summary["steps_lost"],
        "recomputed_samples": sum(int(r["lost"]) * BATCH * int(r["before"]) for r in recoveries),
        "delays": delays,
        "world_sizes": summary["world_sizes_seen"],
        "accuracy": summary["test_accuracy"],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--time-scale", type=float, default=10.0)
    parser.add_argument("--commit-every", type=int, default=50)
    parser.add_argument("--step-seconds", type=float, default=0.03,
                        help="simulated accelerator time per step on every rank (0: none)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        results = {
            "(a) horovod elastic, no notice": run(Path(tmp), "plain", False, args.steps, args.time_scale,
                                                  args.commit_every, args.step_seconds),
            "(b) transientvod, notices": run(Path(tmp), "notices", True, args.steps, args.time_scale,
                                                args.commit_every, args.step_seconds),
        }
    print(f"{args.steps} steps, ResNet-8 (width 8) on digits, batch {BATCH}/worker, commit every "
          f"{args.commit_every}, trace x{args.time_scale:g} (notice {30 / args.time_scale:.1f} s), "
          f"{1000 * args.step_seconds:.0f} ms simulated accelerator time per step")
    print(f"{'run':<32} {'wall s':>7} {'lost steps':>10} {'recomputed':>10}  {'revocation -> new size (s)':<28} sizes")
    for name, r in results.items():
        if r.get("failed"):
            print(f"{name:<32} FAILED at step {r['last_step']}: {r['why']}")
            continue
        delays = ", ".join(f"{d:+.1f}" for d in r["delays"])
        print(f"{name:<32} {r['wall_s']:>7.1f} {r['steps_lost']:>10} {r['recomputed_samples']:>10}  {delays:<28} "
              f"{'>'.join(map(str, r['world_sizes']))}")
    a, b = results.values()
    if a.get("failed") or b.get("failed"):
        return
    stalled = [sum(d for d in r["delays"] if d > 0) for r in (a, b)]
    print(f"(b) / (a) wall time: {b['wall_s'] / a['wall_s']:.2f}; seconds stalled after revocations: "
          f"(a) {stalled[0]:.1f}, (b) {stalled[1]:.1f}")
    if not args.step_seconds:
        print("note: without simulated accelerator time, 4 workers on 2 cores step slower than 1, so "
              "wall time favours the run that loses workers sooner.")


if __name__ == "__main__":
    main()
