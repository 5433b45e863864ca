"""What staleness costs in accuracy, and whether a change to the rule wins it back: delayed SGD in one process.

    .venv/bin/python benchmarks/delayed_sgd.py                               # 6 seeds, every variant
    .venv/bin/python benchmarks/delayed_sgd.py --variants sync,rule --seeds 0,1 --steps 300

The testbed's seeds (benchmarks/RESULTS.md, "What staleness costs in accuracy") put s = 2
about 0.6-0.8 points below synchronous training on the digits at 1,000 steps. A testbed run costs minutes per seed; this
replays the same arithmetic in one process, 1-3 minutes per run on one core: ResNet-32, 4
workers of 16 images, each worker's forward on its own batch (its own BatchNorm statistics;
rank 0's running statistics are kept, as the job's evaluation uses rank 0's), the gradients
averaged, and the product's defaults and rules (`OptimizerConfig`, `LearningRateRule`,
`StalenessRule`: lr 0.1 per worker x 4 after 100 warm-up steps, cosine to 0, momentum 0.9,
weight decay 5e-4, the first 100 steps synchronous). The batches are drawn in another order
than the job's sampler draws them, so seed N here is not the testbed's seed N. A step's gradient is applied s steps later, as `GradientExchange` does with codec
`none`, and the last s at the end. The variants change only what happens while stale:

- sync: staleness 0 throughout (the baseline);
- rule: the product's rule (momentum lowered by s / (s + 1): 0.23 at s = 2);
- tail: rule, and the last 10 % of the steps synchronous again (the steps in flight applied first);
- dc: rule plus delay compensation (DC-ASGD, Zheng et al. 2017): g + 0.5 g * g * (w_now - w_then);
- lrx2: rule with twice the learning rate;
- m=0.5: momentum 0.5 instead of the rule's 0.23.

Each (variant, seed) runs in its own process, `--jobs` at a time. Prints each run's test
accuracy (360 images: one image is 0.28 points) and rank 0's mean training loss over its last
50 steps, then each variant's mean and its difference from sync on the same seeds.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from transientvod.config.schema import ModelConfig, OptimizerConfig  # noqa: E402
from transientvod.tasks.resnet.data import load_digits_dataset  # noqa: E402
from transientvod.tasks.resnet.models import build_model  # noqa: E402
from transientvod.worker.evaluation import count_correct  # noqa: E402
from transientvod.worker.schedule import LearningRateRule, StalenessRule  # noqa: E402

VARIANTS = ("sync", "rule", "tail", "dc", "lrx2", "m=0.5")
WORKERS, BATCH = 4, 16  # benchmarks/exchange.py's job
DEFAULTS = OptimizerConfig()  # the product's: lr, momentum, weight decay, warm-up, schedule
TAIL_FRACTION, DC_LAMBDA = 0.1, 0.5


def train_one(variant: str, seed: int, steps: int, staleness: int) -> dict:
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    data = load_digits_dataset()
    model = build_model(ModelConfig(), data.in_channels, data.num_classes)
    params = list(model.parameters())
    optimizer = torch.optim.SGD(params, lr=DEFAULTS.lr, momentum=DEFAULTS.momentum,
                                weight_decay=DEFAULTS.weight_decay)
    lr_rule = LearningRateRule(DEFAULTS.lr, DEFAULTS.lr_scaling, DEFAULTS.warmup_steps, DEFAULTS.schedule, steps)
    ramp = lr_rule.start_ramp(WORKERS, 0)
    rule = StalenessRule(0 if variant == "sync" else staleness, DEFAULTS.momentum, True, DEFAULTS.warmup_steps)
    sync_from = steps - int(TAIL_FRACTION * steps) if variant == "tail" else steps

    def stale(step: int) -> bool:
        return rule.delay(step) > 0 and step < sync_from

    def apply(grads: list, then: list | None, step: int) -> None:
        lr, momentum = lr_rule.lr(ramp, step), DEFAULTS.momentum
        if stale(step):
            momentum = rule.momentum_at(step)
            if variant == "lrx2":
                lr *= 2
            elif variant == "m=0.5":
                momentum = 0.5
        for group in optimizer.param_groups:
            group["lr"], group["momentum"] = lr, momentum
        for param, grad, old in zip(params, grads, then or [None] * len(params)):
            if old is not None:  # compensate for how far the parameters moved since
                grad = grad + DC_LAMBDA * grad * grad * (param.detach() - old)
            param.grad = grad
        optimizer.step()

    generator = torch.Generator().manual_seed(seed)
    samples, per_step = len(data.train_y), WORKERS * BATCH
    order, position = torch.randperm(samples, generator=generator), 0
    in_flight: deque = deque()
    rank0_losses = []
    for step in range(steps):
        if position + per_step > samples:  # a new epoch; the remainder (under 64 images) is dropped
            order, position = torch.randperm(samples, generator=generator), 0
        batch = order[position:position + per_step]
        position += per_step
        grads = [torch.zeros_like(p) for p in params]
        rank0_buffers = None
        for worker in range(WORKERS):
            mine = batch[worker * BATCH:(worker + 1) * BATCH]
            model.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(data.train_x[mine]), data.train_y[mine])
            loss.backward()
            if worker == 0:
                rank0_buffers = [b.clone() for b in model.buffers()]
                rank0_losses.append(loss.item())
            for total, param in zip(grads, params):
                total.add_(param.grad, alpha=1.0 / WORKERS)
        with torch.no_grad():
            for buffer, kept in zip(model.buffers(), rank0_buffers):
                buffer.copy_(kept)
        in_flight.append((grads, [p.detach().clone() for p in params] if variant == "dc" else None))
        # Back to synchronous at sync_from (tail): everything in flight, oldest first.
        while len(in_flight) > (staleness if stale(step) else 0):
            apply(*in_flight.popleft(), step)
    while in_flight:  # the end: the last s steps, at the last step's rate (GradientExchange.drain)
        apply(*in_flight.popleft(), steps - 1)
    with torch.no_grad():
        accuracy = count_correct(model, data.test_x, data.test_y, torch.device("cpu")) / len(data.test_y)
    return {"variant": variant, "seed": seed, "accuracy": 100 * accuracy,
            "last_loss": sum(rank0_losses[-50:]) / len(rank0_losses[-50:])}


def run_in_process(variant: str, seed: int, args) -> dict:
    done = subprocess.run([sys.executable, __file__, "--one", variant, "--seeds", str(seed), "--steps",
                           str(args.steps), "--staleness", str(args.staleness)], capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{variant} seed {seed} failed:\n{done.stderr[-2000:]}")
    result = json.loads(done.stdout.splitlines()[-1])
    print(f"{variant:6} seed {seed}: {result['accuracy']:.2f} %, last loss {result['last_loss']:.4f}", flush=True)
    return result


def report(results: list[dict], variants: list[str], seeds: list[int], staleness: int) -> None:
    by = {(r["variant"], r["seed"]): r for r in results}
    print(f"\nResNet-32 on the digits, 4 x 16 images, s = {staleness}, accuracy % on 360 test images")
    print("seed  " + "".join(f"{v:>8}" for v in variants))
    for seed in seeds:
        print(f"{seed:<6}" + "".join(f"{by[(v, seed)]['accuracy']:8.2f}" for v in variants))
    means = {v: sum(by[(v, s)]["accuracy"] for s in seeds) / len(seeds) for v in variants}
    print("mean  " + "".join(f"{means[v]:8.2f}" for v in variants))
    if "sync" in variants:
        print("-sync " + "".join(f"{means[v] - means['sync']:+8.2f}" for v in variants))
    losses = {v: sum(by[(v, s)]["last_loss"] for s in seeds) / len(seeds) for v in variants}
    print("loss  " + "".join(f"{losses[v]:8.4f}" for v in variants) + "   (rank 0, mean of the last 50 steps)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--seeds", default="0,1,2,3,4,5")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--staleness", type=int, default=2)
    parser.add_argument("--jobs", type=int, default=2, help="runs at once (each uses one core)")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a child process: one variant, the first seed
    args = parser.parse_args()
    if args.steps <= DEFAULTS.warmup_steps or args.staleness < 1 or args.jobs < 1:
        sys.exit(f"--steps must exceed the {DEFAULTS.warmup_steps} synchronous warm-up steps, --staleness and --jobs be at least 1.")
    try:
        seeds = [int(part) for part in args.seeds.split(",") if part]
    except ValueError:
        sys.exit(f"--seeds is {args.seeds!r}; give a comma-separated list of whole numbers.")
    if args.one:
        print(json.dumps(train_one(args.one, seeds[0], args.steps, args.staleness)))
        return
    variants = [part for part in args.variants.split(",") if part]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        sys.exit(f"--variants has {', '.join(unknown)}; the variants are {', '.join(VARIANTS)}.")
    cases = [(v, s) for s in seeds for v in variants]
    with ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(lambda case: run_in_process(*case, args), cases))
    report(results, variants, seeds, args.staleness)


if __name__ == "__main__":
    main()
