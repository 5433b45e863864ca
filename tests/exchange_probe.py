"""Run by tests/test_exchange.py under `horovodrun -np N`: prints one JSON line per check.

    horovodrun -np 2 -H localhost:2 --gloo python tests/exchange_probe.py
"""
from __future__ import annotations

import json
import sys
import zlib

import torch

import horovod.torch as hvd

from transientvod.exchange import GradientExchange

SIZE = 70_000  # above the 64K-element floor, so every codec really compresses


def checksum(model: torch.nn.Module) -> str:
    crc = 0
    for t in model.state_dict().values():
        crc = zlib.crc32(t.detach().contiguous().numpy().tobytes(), crc)
    return f"{crc:08x}"


def train_tiny(use_exchange: bool) -> str:
    """20 SGD steps of a small MLP with momentum and weight decay; per-rank data."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    if use_exchange:
        exchange = GradientExchange(sgd, model.parameters(), staleness=0, codec="none")
    else:
        optimizer = hvd.DistributedOptimizer(sgd, named_parameters=model.named_parameters())
    data = torch.Generator().manual_seed(100 + hvd.rank())
    for step in range(20):
        x, y = torch.randn(8, 16, generator=data), torch.randint(0, 4, (8,), generator=data)
        (exchange.zero_grad() if use_exchange else optimizer.zero_grad())
        torch.nn.functional.cross_entropy(model(x), y).backward()
        exchange.step(step) if use_exchange else optimizer.step()
    return checksum(model)


def average_error(codec: str) -> dict:
    """One exchange of known per-rank gradients: how far is the average from the float64 mean?"""
    grads = [torch.randn(SIZE, generator=torch.Generator().manual_seed(7 + r)) * (1 + r) for r in range(hvd.size())]
    param = torch.nn.Parameter(torch.zeros(SIZE))
    exchange = GradientExchange(torch.optim.SGD([param], lr=1.0), [param], staleness=0, codec=codec)
    exchange.zero_grad()
    param.grad.copy_(grads[hvd.rank()])
    exchange.step(0)
    exact = torch.stack([g.double() for g in grads]).mean(0)
    error = (-param.detach().double() - exact).abs().max().item()
    return {"codec": codec, "max_error": error, "max_abs_grad": max(g.abs().max().item() for g in grads)}


def stale_sum(staleness: int, steps: int = 6) -> dict:
    """Gradient t is t+1 everywhere; with lr 1 the parameter ends at -(sum of those applied)."""
    param = torch.nn.Parameter(torch.zeros(4))
    exchange = GradientExchange(torch.optim.SGD([param], lr=1.0), [param], staleness=staleness)
    applied = []
    for step in range(steps):
        exchange.zero_grad()
        param.grad.fill_(step + 1.0)
        applied.append(exchange.step(step))
    # Leave nothing in flight: the next exchange in this process reuses the op names, and a
    # name still being processed is an error (seen on a loaded CI machine).
    for step_work in exchange.queue:
        for work in step_work:
            for handle in work.handles:
                hvd.synchronize(handle)
    return {"staleness": staleness, "param": param[0].item(), "applied": applied}


def main() -> int:
    hvd.init()
    torch.set_num_threads(1)
    checks = sys.argv[1:] or ["bitident", "average", "stale"]
    if "bitident" in checks:
        print(json.dumps({"check": "bitident", "rank": hvd.rank(), "exchange": train_tiny(True),
                          "distributed_optimizer": train_tiny(False)}), flush=True)
    if "average" in checks:
        for codec in ("none", "fp16", "bf16", "int8"):
            print(json.dumps({"check": "average", "rank": hvd.rank(), "world": hvd.size(), **average_error(codec)}),
                  flush=True)
    if "stale" in checks:
        for s in (0, 1, 2):
            print(json.dumps({"check": "stale", "rank": hvd.rank(), **stale_sum(s)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
