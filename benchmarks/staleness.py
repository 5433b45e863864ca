"""Bounded staleness against a straggler: steps/s and accuracy for s = 0, 1, 2, 4 and each codec.

    .venv/bin/python benchmarks/staleness.py [--steps 600] [--delay 0.02]

Two ranks (localhost and 127.0.0.1) through `horovodrun`, ResNet-8 (width 16) on the digits;
rank 1 sleeps a random 0..DELAY seconds after every step (TRANSIENTVOD_STRAGGLER), about
0-2x a step's compute here. With s = 0 the fast rank waits for the slow one every step; with
s >= 1 it waits only when the slow one is more than s steps behind. Goal: s = 2 at least 1.3x
the steps/s of s = 0, and test accuracy within 1 point of synchronous fp32.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
HOSTS = f"{sys.executable} {REPO / 'launch' / 'local_hosts.py'} --hosts localhost:1,127.0.0.1:1"


def run(workdir: Path, name: str, staleness: int, codec: str, steps: int, delay: float) -> dict:
    config = {
        "run": {"name": name, "output_dir": str(workdir)},
        "model": {"depth": 8, "width": 16},
        "optimizer": {"lr": 0.05, "warmup_steps": 20},
        "train": {"steps": steps, "commit_every": 50, "checkpoint_every": steps, "log_every": 10,
                  "threads_per_worker": 1},
        "exchange": {"staleness": staleness, "codec": codec, "min_compress_elements": 0, "compress_after": 0.1},
        "cluster": {"min_np": 2, "max_np": 2},
    }
    path = workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {**os.environ, "TRANSIENTVOD_STRAGGLER": f"1:{delay}"}
    done = subprocess.run([sys.executable, "-m", "transientvod.cli", "train", "--config", str(path),
                           "--discovery", HOSTS], capture_output=True, text=True, cwd=REPO, env=env)
    if done.returncode != 0:
        sys.exit(f"run {name} failed:\n{done.stderr[-4000:]}")
    rows = [json.loads(line) for line in (workdir / name / "metrics.jsonl").read_text().splitlines()]
    timed = [r for r in rows if "time" in r]
    # Steady state: from the first logged step to the last, leaving out start-up.
    steps_per_s = (timed[-1]["step"] - timed[0]["step"]) / (timed[-1]["time"] - timed[0]["time"])
    summary = json.loads((workdir / name / "summary.json").read_text())
    return {"steps_per_s": steps_per_s, "accuracy": summary["test_accuracy"]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--delay", type=float, default=0.02, help="rank 1 sleeps 0..DELAY s after each step")
    parser.add_argument("--only", help="comma-separated s:codec cases, e.g. 0:none,2:fp16 (default: all)")
    args = parser.parse_args()
    cases = [(0, "none"), (1, "none"), (2, "none"), (4, "none"), (2, "fp16"), (2, "bf16"), (2, "int8")]
    if args.only:
        cases = [c for c in cases if f"{c[0]}:{c[1]}" in args.only.split(",")]
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for s, codec in cases:
            results[(s, codec)] = run(Path(tmp), f"s{s}-{codec}", s, codec, args.steps, args.delay)
            print(f"  done s={s} {codec}", file=sys.stderr, flush=True)
    base = results[(0, "none")]
    print(f"{args.steps} steps, 2 ranks, rank 1 sleeps 0..{args.delay * 1000:.0f} ms per step")
    print(f"{'s':>2} {'codec':<6} {'steps/s':>8} {'vs s=0':>7} {'accuracy %':>10} {'vs sync':>8}")
    for (s, codec), r in results.items():
        print(f"{s:>2} {codec:<6} {r['steps_per_s']:>8.1f} {r['steps_per_s'] / base['steps_per_s']:>6.2f}x "
              f"{100 * r['accuracy']:>10.2f} {100 * (r['accuracy'] - base['accuracy']):>+7.2f}")
    speedup = results[(2, "none")]["steps_per_s"] / base["steps_per_s"]
    print(f"goal s=2 >= 1.3x s=0: {'met' if speedup >= 1.3 else 'NOT met'} ({speedup:.2f}x)")


if __name__ == "__main__":
    main()
