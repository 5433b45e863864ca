"""What a durable checkpoint costs the training step that takes it: synchronous save vs the
background writer, side by side in one process.

    .venv/bin/python benchmarks/checkpoint_step.py                    # ResNet-32 and a ~100 MB MLP
    .venv/bin/python benchmarks/checkpoint_step.py --models resnet32 --reps 3 --dir /mnt/disk/bench

For each model it times (wall clock, median of --reps): a normal training step (forward,
backward, SGD with momentum); a step followed by `store.save` of the state, as rank 0 did
before (the ring waits this long); and a step followed by `BackgroundCheckpointWriter.submit`
(the snapshot only, also shown alone; the write goes on in a thread). The write then overlaps the next steps,
which share the machine's cores with it: "while writing" is their mean, and "n" how many there
were. Ratios are to the normal step. The store is a LocalCheckpointStore under --dir (a real
disk with fsync; default a temporary directory under runs/). Goal: the checkpoint step with
the background writer costs under 1.5 normal steps.
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from transientvod.checkpoint import LocalCheckpointStore  # noqa: E402
from transientvod.checkpoint.writer import BackgroundCheckpointWriter  # noqa: E402
from transientvod.config import ModelConfig  # noqa: E402
from transientvod.tasks.resnet.models import build_model, count_parameters  # noqa: E402

GOAL_RATIO = 1.5
CONFIG_YAML = "benchmark: checkpoint_step\n"


def resnet32(batch: int):
    model = build_model(ModelConfig(name="resnet", depth=32, width=16), in_channels=3, num_classes=10)
    return model, torch.randn(batch, 3, 32, 32), torch.randint(0, 10, (batch,))


def mlp100(batch: int):
    # 6 layers of 2048 x 2048 (+ bias): 25.2 M parameters, 100.7 MB of fp32 weights.
    layers = []
    for _ in range(6):
        layers += [torch.nn.Linear(2048, 2048), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers[:-1])
    return model, torch.randn(batch, 2048), torch.randint(0, 2048, (batch,))


MODELS = {"resnet32": resnet32, "mlp100": mlp100}


def measure(name: str, batch: int, reps: int, root: Path) -> dict:
    torch.manual_seed(0)
    model, x, y = MODELS[name](batch)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)

    def step() -> None:
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()

    def payload() -> dict:  # the shape of TransientState.checkpoint_payload()
        return {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "sampler": {"epoch": 0, "processed_num": 0}, "progress": {"step": 0, "world_sizes": [1]}}

    def timed(fn) -> float:
        started = time.perf_counter()
        fn()
        return time.perf_counter() - started

    for _ in range(3):  # warm-up: allocator, momentum buffers, first-call overheads
        step()
    store = LocalCheckpointStore(root / name, keep_last=2)
    writer = BackgroundCheckpointWriter(store)
    normal, sync, background, snapshot, during, write_seconds = [], [], [], [], [], []
    for rep in range(reps):
        # Interleaved, so that a noisy neighbour on the machine slows every variant alike.
        normal += [timed(step) for _ in range(3)]
        sync.append(timed(lambda: (step(), store.save(2 * rep, payload(), CONFIG_YAML))))
        started = time.perf_counter()
        background.append(timed(lambda: (step(), snapshot.append(writer.submit(2 * rep + 1, payload(), CONFIG_YAML)))))
        while writer.busy():
            during.append(timed(step))
        writer.wait()
        write_seconds.append(time.perf_counter() - started)
    normal_s = statistics.median(normal)
    state_mb = sum(len(p.read_bytes()) for p in (root / name).glob("step-*/*")) / 1e6 / len(store.steps())
    return {"model": name, "params": count_parameters(model), "checkpoint_mb": state_mb,
            "normal_ms": 1e3 * normal_s,
            "sync_ms": 1e3 * statistics.median(sync), "sync_x": statistics.median(sync) / normal_s,
            "background_ms": 1e3 * statistics.median(background),
            "background_x": statistics.median(background) / normal_s,
            "snapshot_ms": 1e3 * statistics.median(snapshot),
            "during_ms": 1e3 * statistics.mean(during) if during else float("nan"),
            "during_x": statistics.mean(during) / normal_s if during else float("nan"),
            "during_n": len(during) / reps, "write_s": statistics.median(write_seconds)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="resnet32,mlp100", help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument("--batch", type=int, default=32, help="samples per step")
    parser.add_argument("--reps", type=int, default=5, help="checkpoint steps per variant (the median is shown)")
    parser.add_argument("--dir", default="", help="where the store writes (default: a temporary directory under runs/)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        parser.error(f"unknown model {unknown[0]!r}; choose from {', '.join(MODELS)}.")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.dir:
        root, made = Path(args.dir), False
        root.mkdir(parents=True, exist_ok=True)
    else:
        Path("runs").mkdir(exist_ok=True)
        root, made = Path(tempfile.mkdtemp(prefix="bench-checkpoint-", dir="runs")), True
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, batch {args.batch}, "
          f"{args.reps} reps, store {root}")
    header = (f"{'model':<9} {'params':>10} {'ckpt MB':>8} {'step ms':>8} {'sync ckpt ms':>13} {'x':>5} "
              f"{'bg ckpt ms':>11} {'x':>5} {'snapshot ms':>12} {'while writing ms':>17} {'x':>5} {'n':>5} {'write s':>8}")
    print(header)
    ok = True
    try:
        for name in names:
            r = measure(name, args.batch, args.reps, root)
            print(f"{r['model']:<9} {r['params']:>10,} {r['checkpoint_mb']:>8.1f} {r['normal_ms']:>8.1f} "
                  f"{r['sync_ms']:>13.1f} {r['sync_x']:>5.2f} {r['background_ms']:>11.1f} {r['background_x']:>5.2f} {r['snapshot_ms']:>12.1f} "
                  f"{r['during_ms']:>17.1f} {r['during_x']:>5.2f} {r['during_n']:>5.1f} {r['write_s']:>8.2f}",
                  flush=True)
            ok = ok and r["background_x"] < GOAL_RATIO
    finally:
        if made:
            shutil.rmtree(root, ignore_errors=True)
    print(f"goal: background checkpoint step < {GOAL_RATIO} normal steps: {'met' if ok else 'NOT met'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
