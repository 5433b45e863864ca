"""Run under `horovodrun -np 2`: transientvod.DistributedOptimizer against what it replaces.

    python tests/probes/optimizer_probe.py CASE

Each rank trains the same small model on its own batches and prints one JSON line: the case,
its rank, and the CRC of the parameters after each variant (equal CRCs are equal bits).
"""
from __future__ import annotations

import json
import sys
import zlib

import torch
import torch.nn.functional as F

import horovod.torch as hvd

from transientvod.config import Config
from transientvod.library.optimizer import DistributedOptimizer

STEPS = 6


def checksum(model: torch.nn.Module) -> str:
    crc = 0
    for tensor in model.state_dict().values():
        crc = zlib.crc32(tensor.detach().contiguous().numpy().tobytes(), crc)
    return f"{crc:08x}"


def model_and_batches(passes: int = 1):
    torch.manual_seed(0)  # the same model on every rank
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    g = torch.Generator().manual_seed(100 + hvd.rank())  # each rank its own data
    batches = [[(torch.randn(8, 64, generator=g), torch.randint(0, 10, (8,), generator=g)) for _ in range(passes)]
               for _ in range(STEPS)]
    return model, batches


def config(staleness: int = 0, codec: str = "none") -> Config:
    c = Config()
    c.exchange.staleness, c.exchange.codec = staleness, codec
    c.exchange.min_compress_elements = 1  # this model is small: compress it anyway
    c.optimizer.warmup_steps = 0  # stale from the first step
    return c


def train(wrap, passes: int = 1, clip: float | None = None) -> str:
    model, batches = model_and_batches(passes)
    optimizer = wrap(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), model)
    for step_batches in batches:
        optimizer.zero_grad()
        for x, y in step_batches:
            F.cross_entropy(model(x), y).backward()
        if clip is None:
            optimizer.step()
        else:
            optimizer.synchronize()
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            with optimizer.skip_synchronize():
                optimizer.step()
    if isinstance(optimizer, DistributedOptimizer):
        optimizer.drain()
    return checksum(model)


def horovods(passes: int = 1):
    return lambda opt, model: hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                                       backward_passes_per_step=passes)


def ours(passes: int = 1, **settings):
    return lambda opt, model: DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                                   backward_passes_per_step=passes, config=config(**settings))


def main(case: str) -> None:
    hvd.init()
    torch.set_num_threads(1)
    row = {"case": case, "rank": hvd.rank()}
    if case == "same_as_horovod":
        # Staleness 0, codec none: Horovod's own allreduce underneath, so bit for bit Horovod's,
        # with backward_passes_per_step too; at staleness 1 the passes go through the exchange.
        row["horovod"] = train(horovods())
        row["ours"] = train(ours())
        row["horovod_2_passes"] = train(horovods(2), passes=2)
        row["ours_2_passes"] = train(ours(2), passes=2)
        row["ours_exchange_2_passes"] = train(ours(2, staleness=1), passes=2)
    elif case == "clipping":
        row["horovod_clipped"] = train(horovods(), clip=0.05)
        row["ours_clipped"] = train(ours(), clip=0.05)
        row["ours_unclipped"] = train(ours())
        row["ours_fp16_clipped"] = train(ours(codec="fp16"), clip=0.05)
        row["ours_fp16_unclipped"] = train(ours(codec="fp16"))
    elif case == "stale":
        for staleness, codec in ((1, "none"), (2, "int8"), (0, "fp16")):
            row[f"s{staleness}_{codec}"] = train(ours(staleness=staleness, codec=codec))
    print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
