"""Run by tests/gradients/test_exchange.py under `horovodrun -np N`: prints one JSON line per check and rank.

    horovodrun -np 2 -H localhost:2 --gloo python tests/probes/exchange_probe.py stale nan
    horovodrun -np 4 -H localhost:4 --gloo python tests/probes/exchange_probe.py owner_residual

Every check builds its own exchange and drains it before the next one starts, so no op is
left in flight under a name the next exchange uses. TRANSIENTVOD_PROBE_DEVICE=cuda puts the
exchanged parameters on the GPU (every rank on GPU local_rank % count; tests/gpu/run_checks.sh);
the data is made on the CPU and copied, so both devices see the same numbers.
"""
from __future__ import annotations

import json
import os
import sys
import time
import zlib

import numba
import torch

import horovod.torch as hvd

from transientvod.gradients.bucket_tuning import BucketTuner, cuts
from transientvod.gradients.exchange import GradientExchange
from transientvod.gradients.synchronous import SynchronousStep

CODECS = ("none", "fp16", "bf16", "int8")
COMPRESSED = ("fp16", "bf16", "int8")
SIZE = 70_000  # above the 64K-element floor, so every codec really compresses
BLOCK = 512
# The smallest step each codec can express near 1.0: fp16 and bf16 ulps, an int8 block's scale.
QUANTUM = {"fp16": 2.0 ** -10, "bf16": 2.0 ** -7, "int8": 1.0 / 127}
DEVICE = torch.device(os.environ.get("TRANSIENTVOD_PROBE_DEVICE", "cpu"))


def checksum(model) -> str:
    crc = 0
    tensors = model.state_dict().values() if isinstance(model, torch.nn.Module) else model
    for t in tensors:
        crc = zlib.crc32(t.detach().cpu().contiguous().numpy().tobytes(), crc)
    return f"{crc:08x}"


def one_param_exchange(size: int, codec: str, staleness: int = 0, **options):
    param = torch.nn.Parameter(torch.zeros(size, device=DEVICE))
    exchange = GradientExchange(torch.optim.SGD([param], lr=1.0), [param], staleness=staleness, codec=codec,
                                min_compress_elements=0, **options)
    return param, exchange


def train_tiny(use_exchange: bool, one_tensor: bool = False) -> str:
    """20 SGD steps of a small MLP (or of one weight matrix) with momentum and weight decay;
    per-rank data."""
    torch.manual_seed(0)
    model = (torch.nn.Linear(16, 4, bias=False) if one_tensor else
             torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)))
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
    param, exchange = one_param_exchange(SIZE, codec)
    exchange.zero_grad()
    param.grad.copy_(grads[hvd.rank()])
    exchange.step(0)
    exact = torch.stack([g.double() for g in grads]).mean(0)
    error = (-param.detach().cpu().double() - exact).abs().max().item()
    return {"codec": codec, "max_error": error, "max_abs_grad": max(g.abs().max().item() for g in grads)}


def stale_sum(codec: str, staleness: int, size: int, steps: int = 6, stale_from_step: int = 0) -> dict:
    """Gradient t is t+1 everywhere; with lr 1 the parameter ends at -(sum of those applied)."""
    param, exchange = one_param_exchange(size, codec, staleness, stale_from_step=stale_from_step)
    applied, params = [], []
    for step in range(steps):
        exchange.zero_grad()
        param.grad.fill_(step + 1.0)
        applied.append(exchange.step(step))
        params.append(param[0].item())
    drained = exchange.drain()
    return {"codec": codec, "staleness": staleness, "size": size, "applied": applied, "params": params,
            "drained": drained, "final": param.detach().tolist()[:4], "stale_from_step": stale_from_step}


def backward_polls(codec: str) -> dict:
    """Step 0's first phase is started by step(0); then only backward passes run, no step():
    the parameters' gradient hooks must move it on to its next phase once the first is done."""
    # start_in_backward off: these backward passes only poll (they would start step 1 otherwise).
    param, exchange = one_param_exchange(SIZE, codec, staleness=2, name=f"backward_polls.{codec}",
                                         start_in_backward=False)
    exchange.zero_grad()
    param.grad.fill_(1.0)
    exchange.step(0)
    transfer = exchange.queue[0].transfers[0]
    backwards, deadline = 0, time.monotonic() + 20
    while transfer.phases_done == 0 and time.monotonic() < deadline:
        (param * 1.0).sum().backward()  # accumulates into the bucket, as the next step's backward would
        backwards += 1
        time.sleep(0.005)
    phases = transfer.phases_done
    exchange.drain()
    return {"codec": codec, "phases_done": phases, "backwards": backwards}


def backward_starts(codec: str) -> list[dict]:
    """A 4-layer MLP trained 12 steps through backward, its buckets started from the gradient
    hooks or all in step(): the same parameters bit for bit, and how many buckets backward
    started. Then a backward without step(): zero_grad() must refuse it in one sentence, and
    step() and drain() must still leave nothing in flight."""
    found = []
    for staleness in (0, 2):
        runs = {}
        for early in (True, False):
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.ReLU(), torch.nn.Linear(128, 128),
                                        torch.nn.ReLU(), torch.nn.Linear(128, 128), torch.nn.ReLU(),
                                        torch.nn.Linear(128, 4)).to(DEVICE)
            sgd = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
            exchange = GradientExchange(sgd, model.parameters(), staleness=staleness, codec=codec,
                                        min_compress_elements=0, bucket_elements=500, start_in_backward=early,
                                        name=f"starts.{codec}.{staleness}.{early}")
            data = torch.Generator().manual_seed(100 + hvd.rank())
            for step in range(12):
                x, y = torch.randn(8, 32, generator=data), torch.randint(0, 4, (8,), generator=data)
                exchange.zero_grad()
                torch.nn.functional.cross_entropy(model(x.to(DEVICE)), y.to(DEVICE)).backward()
                exchange.step(step)
            exchange.drain()
            trained, refused = checksum(model), ""
            if early:
                exchange.zero_grad()
                model(torch.ones(1, 32, device=DEVICE)).sum().backward()
                try:
                    exchange.zero_grad()
                except RuntimeError as error:
                    refused = str(error)
                exchange.step(12)
                exchange.drain()
            runs[early] = {"checksum": trained, "started_in_backward": exchange.started_in_backward,
                           "buckets": len(exchange.buckets), "refused": refused}
        found.append({"codec": codec, "staleness": staleness, "early": runs[True], "in_step": runs[False]})
    return found


def owner_residual(steps: int = 200, recut_every: int = 0) -> list[dict]:
    """A small steady gradient under large steady ones: how much of it arrives, per codec?

    Part A: in each int8 block one element is 1.0 and the rest get the small g_r; part B:
    every element is 1.0 + g_r. g_r differs by rank (its mean over ranks is g, an eighth of
    the codec's quantum near 1.0), so the owner's average is rarely representable, and its
    rounding never averages out; the same two parts again with noise (std of two quanta),
    which does average it out. The three codecs' exchanges step together, so their ops share
    Horovod's cycles (200 steps on 4 ranks stay within seconds on two cores).

    With `recut_every`, the four parts are four parameters, and every that many steps the
    exchange drains and is cut afresh (rebucket), in turns into one bucket per part and one
    for all: delivery must hold through the cuts. It does not tell whether residuals are
    carried (a steady residual is as often below as above zero when dropped: with them
    dropped, only int8 failed here); `recut_delivery` does."""
    world, rank = hvd.size(), hvd.rank()
    part = 16 * BLOCK  # whole int8 blocks, at least one per owner
    parts = {"steady_a": 0, "steady_b": 1, "noisy_a": 2, "noisy_b": 3}
    runs = {}
    for codec in COMPRESSED:
        g = QUANTUM[codec] / 8
        g_rank = g * (2 * rank + 1) / world  # the sum over ranks of (2r + 1) is world**2: mean g
        base = torch.full((4 * part,), g_rank)
        for name, k in parts.items():
            if name.endswith("_a"):
                base[k * part:(k + 1) * part:BLOCK] = 1.0  # one large element per block
            else:
                base[k * part:(k + 1) * part] += 1.0  # large + small in every element
        count = len(parts) if recut_every else 1
        params = [torch.nn.Parameter(torch.zeros(4 * part // count, device=DEVICE)) for _ in range(count)]
        exchange = GradientExchange(torch.optim.SGD(params, lr=1.0), params, staleness=4, codec=codec,
                                    min_compress_elements=0, block=BLOCK, bucket_elements=part,
                                    name=f"{codec}.{recut_every}")
        runs[codec] = (g, base.to(DEVICE), params, exchange)
    noise = torch.Generator().manual_seed(1000 + rank)
    for step in range(steps):
        if recut_every and step and step % recut_every == 0:
            for _, _, _, exchange in runs.values():
                exchange.drain()
                exchange.rebucket(part if step // recut_every % 2 == 0 else 4 * part)
        for codec, (g, base, params, exchange) in runs.items():
            exchange.zero_grad()
            grad = base.clone()
            grad[2 * part:].add_((torch.randn(2 * part, generator=noise) * 2 * QUANTUM[codec]).to(DEVICE))
            for param, piece in zip(params, grad.split([p.numel() for p in params])):
                param.grad.copy_(piece)
            exchange.step(step)
    rows = []
    small = torch.ones(part, dtype=torch.bool)
    small[::BLOCK] = False
    for codec, (g, base, params, exchange) in runs.items():
        exchange.drain()
        delivered = -torch.cat([p.detach().cpu().double() for p in params])
        row = {"codec": codec, "applied": exchange.applied_steps, "steps": steps, "recut_every": recut_every,
               "buckets": len(exchange.buckets)}
        for name, k in parts.items():
            values = delivered[k * part:(k + 1) * part]
            row[name] = (values[small].mean().item() if name.endswith("_a")
                         else values.mean().item() - steps * 1.0) / (steps * g)
        rows.append(row)
    return rows


def nan_skip(codec: str) -> dict:
    """Only the last rank's gradient holds a NaN at step 3; every rank must skip step 3."""
    param, exchange = one_param_exchange(SIZE, codec, staleness=1)
    applied = []
    for step in range(6):
        exchange.zero_grad()
        param.grad.fill_(1.0)
        if step == 3 and hvd.rank() == hvd.size() - 1:
            param.grad[SIZE // 2] = float("nan")
        applied.append(exchange.step(step))
    exchange.drain()
    return {"codec": codec, "applied": applied, "skipped": exchange.skipped_steps,
            "finite": bool(torch.isfinite(param).all()), "param": param[0].item(), "checksum": checksum([param])}


def several_buckets(codec: str) -> dict:
    """Three parameters in two buckets, the small first bucket under the compression floor."""
    params = [torch.nn.Parameter(torch.zeros(n, device=DEVICE)) for n in (3000, 100, 5000)]
    exchange = GradientExchange(torch.optim.SGD(params, lr=1.0), params, staleness=1, codec=codec,
                                min_compress_elements=4000, bucket_elements=4000)
    reads = []  # per step() call, then drain(): how often the exchange read a tensor on the host
    for step in range(3):
        exchange.zero_grad()
        # hold the gradients of step 0..2 fixed: per parameter i, the mean over ranks of (r+1)(i+1)
        for i, p in enumerate(params):
            p.grad.fill_((hvd.rank() + 1) * (i + 1))
        with HostReads() as counted:
            exchange.step(step)
        reads.append(counted.reads)
    with HostReads() as counted:
        exchange.drain()
    reads.append(counted.reads)
    mean_rank = (hvd.size() + 1) / 2
    errors = [(-p.detach().cpu().double() / 3 - mean_rank * (i + 1)).abs().max().item() for i, p in enumerate(params)]
    return {"codec": codec, "buckets": [sorted(b.codecs) for b in exchange.buckets], "errors": errors,
            "reads": reads}


class HostReads:
    """Counts the reads of a tensor's value on the host (`Tensor.item`, `bool(tensor)`) while
    active: on a GPU each one waits for the stream to drain."""

    def __enter__(self) -> "HostReads":
        self.reads = 0
        self._saved = torch.Tensor.item, torch.Tensor.__bool__

        def counting(method):
            def read(tensor, *args):
                self.reads += 1
                return method(tensor, *args)
            return read
        torch.Tensor.item, torch.Tensor.__bool__ = (counting(method) for method in self._saved)
        return self

    def __exit__(self, *exc) -> None:
        torch.Tensor.item, torch.Tensor.__bool__ = self._saved


def compress_switch() -> dict:
    """int8 from step 3 on: the first three steps go as fp32, the rest as int8; bytes per step."""
    param, exchange = one_param_exchange(SIZE, "int8", compress_from_step=3)
    sent = []
    for step in range(6):
        exchange.zero_grad()
        param.grad.fill_(1.0)
        before = exchange.wire.sent_bytes
        exchange.step(step)
        sent.append(exchange.wire.sent_bytes - before)
    return {"codecs": sorted(exchange.buckets[0].codecs), "sent": sent, "param": param[0].item()}


def drain_count(codec: str, staleness: int = 2, steps: int = 8, reset_at: int = 5) -> dict:
    """Step t's gradient is 1 in element t only, so -param[t] counts how often it was applied.
    At step reset_at the loop does what train.py does at a graceful reset (drain, then the
    reset callback), and at the end it drains."""
    param, exchange = one_param_exchange(SIZE, codec, staleness)
    drained = []
    for step in range(steps):
        if step == reset_at:
            drained.append(exchange.drain())
            exchange.reset()
        exchange.zero_grad()
        param.grad[step] = 1.0
        exchange.step(step)
    drained.append(exchange.drain())
    counts = (-param.detach()[:steps + 2]).cpu().tolist()
    return {"codec": codec, "counts": counts, "drained": drained, "applied": exchange.applied_steps}


def recut_delivery(codec: str) -> dict:
    """One step of a gradient whose rounding leaves residuals at the senders and at the owners,
    then a drain and a cut into one bucket instead of two, then 3 steps of zero gradient: they
    must deliver what the residuals held, so that the parameters end at minus the mean of the
    ranks' gradients. Rank r sends, beside a part under half a quantum (the sender's residual),
    r quanta (fp16, bf16: 1 + r ulps) or r % 2 (int8: beside one 1.0 per block), so that the
    owner's average falls halfway between two codes (its residual): dropped at the cut, either
    leaves the parameters an eighth to a half of a quantum short."""
    world, rank = hvd.size(), hvd.rank()
    part = 4 * BLOCK * world  # whole int8 blocks for every owner in each bucket
    params = [torch.nn.Parameter(torch.zeros(part, device=DEVICE)) for _ in range(2)]
    exchange = GradientExchange(torch.optim.SGD(params, lr=1.0), params, staleness=0, codec=codec,
                                min_compress_elements=0, block=BLOCK, bucket_elements=part,
                                name=f"recut_delivery.{codec}")

    def gradient(r: int) -> torch.Tensor:
        quantum = QUANTUM[codec]
        small = quantum * (2 * r + 1) / (8 * world)  # under half a quantum on every rank
        if codec == "int8":
            grad = torch.full((2 * part,), (r % 2) * quantum + small)
            grad[::BLOCK] = 1.0  # the block's scale: 1/127, the quantum
        else:
            grad = torch.full((2 * part,), 1.0 + r * quantum + small)
        return grad

    buckets = [len(exchange.buckets)]
    for step in range(4):
        exchange.zero_grad()
        grad = gradient(rank) if step == 0 else torch.zeros(2 * part)
        for param, piece in zip(params, grad.to(DEVICE).split(part)):
            param.grad.copy_(piece)
        exchange.step(step)
        if step == 0:
            exchange.drain()
            exchange.rebucket(2 * part)
            buckets.append(len(exchange.buckets))
    delivered = -torch.cat([p.detach().cpu().double() for p in params])
    expected = torch.stack([gradient(r).double() for r in range(world)]).mean(0)
    return {"codec": codec, "buckets": buckets, "error": (delivered - expected).abs().max().item(),
            "quantum": QUANTUM[codec]}


def bucket_tuning(slow_cut: int, steps: int = 64, bursty: bool = False) -> dict:
    """A BucketTuner on fp16 at staleness 2, six parameters of 100,000 elements (one bucket by
    default, 3 the other cut), every gradient 1.0: rank 0 sleeps 60 ms in each step it runs in
    `slow_cut` buckets, so the other cut must be kept, on both ranks. Which cut each step ran
    in, and the parameters: every step's gradient applied exactly once through the switches'
    drains (-steps in every element).

    `bursty`: the slow cut sleeps 400 ms every 4th step instead (100 ms a step on average, none
    in most steps, as a stale step on a slow link waits now and then), the other 50 ms every
    step, and after every 7th step in the other cut every rank sleeps 500 ms more as "other
    work" (a commit, an evaluation), which the tuner is told of. Kept by the median, or with
    that work counted (150 ms a step), the slow cut would win."""
    params = [torch.nn.Parameter(torch.zeros(100_000, device=DEVICE)) for _ in range(6)]
    exchange = GradientExchange(torch.optim.SGD(params, lr=1.0), params, staleness=2, codec="fp16",
                                name=f"tuning.{slow_cut}.{int(bursty)}")
    tuner = BucketTuner(exchange, cuts(params, 2), tune_from_step=0, total_steps=steps)
    tuner.begin(0)
    ran_in = []
    for step in range(steps):
        ran_in.append(len(exchange.buckets))
        exchange.zero_grad()
        for param in params:
            param.grad.fill_(1.0)
        in_slow_cut = len(exchange.buckets) == slow_cut
        if hvd.rank() == 0 and not bursty and in_slow_cut:
            time.sleep(0.06)
        if hvd.rank() == 0 and bursty:
            time.sleep((0.4 if step % 4 == 0 else 0.0) if in_slow_cut else 0.05)
        exchange.step(step)
        tuner.after_step(step + 1)
        if bursty and not in_slow_cut and step % 7 == 0:
            time.sleep(0.5)
            tuner.other_work()
    exchange.drain()
    values = torch.cat([p.detach().cpu() for p in params])
    return {"slow_cut": slow_cut, "bursty": bursty, "ran_in": ran_in, "chosen_buckets": len(exchange.buckets), "chosen": tuner.chosen,
            "seconds": tuner.seconds, "sizes": tuner.sizes, "turn_steps": tuner.turn_steps,
            "param_range": [values.min().item(), values.max().item()], "applied": exchange.applied_steps}


def lost_peer_reset(codec: str) -> dict:
    """reset() without a drain (a lost peer): every residual, owners' included, is zero after.
    A real lost peer shuts Horovod down, which ends the dropped ops; here they complete unread,
    so this exchange has names of its own."""
    param, exchange = one_param_exchange(SIZE, codec, staleness=1, name=f"lost_peer.{codec}")
    data = torch.Generator().manual_seed(200 + hvd.rank())  # ranks differ: the owner rounds
    for step in range(3):
        exchange.zero_grad()
        param.grad.copy_(torch.randn(SIZE, generator=data))
        exchange.step(step)
    codec_object = exchange.buckets[0].codecs[codec]
    before = [float(codec_object.residual.abs().sum()), float(codec_object.owner_residual.abs().sum())]
    exchange.reset()
    after = [float(codec_object.residual.abs().sum()), float(codec_object.owner_residual.abs().sum())]
    return {"codec": codec, "in_flight_before": 1, "queue_after": len(exchange.queue),
            "residuals_before": before, "residuals_after": after}


def waited(codec: str, steps: int = 6, late: float = 0.1) -> dict:
    """Rank 1 reaches every step `late` seconds after rank 0 (s = 0): the time rank 0 spends in
    step() waiting for the exchange must count it; `none` goes through SynchronousStep."""
    if codec == "none":
        param = torch.nn.Parameter(torch.zeros(SIZE, device=DEVICE))
        optimizer = hvd.DistributedOptimizer(torch.optim.SGD([param], lr=1.0), named_parameters=[("waited", param)])
        exchange = SynchronousStep(optimizer)
    else:
        param, exchange = one_param_exchange(SIZE, codec, name=f"waited.{codec}")
    per_step = []
    for step in range(steps):
        exchange.zero_grad()
        if hvd.rank() == 1:
            time.sleep(late)
        (param * 1.0).sum().backward()
        before = exchange.waited_seconds
        exchange.step(step)
        per_step.append(exchange.waited_seconds - before)
    exchange.drain()
    return {"codec": codec, "late": late, "waited": per_step}


def sent_bytes(codec: str) -> dict:
    param, exchange = one_param_exchange(SIZE, codec, block=BLOCK)
    exchange.zero_grad()
    param.grad.copy_(torch.randn(SIZE))
    exchange.step(0)
    return {"codec": codec, "elements": SIZE, "block": BLOCK, "sent": exchange.wire.sent_bytes}


def interface_sent_bytes(interface: str) -> int:
    """What this process's network namespace has sent on `interface`: the kernel's own counter
    (/proc/self/net/dev is per namespace), so everything Gloo put on the link, headers included."""
    for line in open("/proc/self/net/dev"):
        name, _, counters = line.partition(":")
        if name.strip() == interface:
            return int(counters.split()[8])  # receive has 8 columns, then transmit bytes
    raise SystemExit(f"exchange_probe: no interface {interface!r} in this namespace")


def wire_bytes(codec: str, interface: str = "eth0", elements: int = 1 << 21, steps: int = 5) -> dict:
    """Bytes this host's link carried per exchange step (on a testbed host, one rank per host),
    beside what the exchange handed Horovod. Synchronous steps between two barriers: after the
    first barrier every rank is idle, after the second every step's bytes have arrived."""
    param, exchange = one_param_exchange(elements, codec, block=BLOCK, name=f"wire.{codec}")
    data = torch.Generator().manual_seed(300 + hvd.rank())

    def one_step(step: int) -> None:
        exchange.zero_grad()
        param.grad.copy_(torch.randn(elements, generator=data))
        exchange.step(step)

    one_step(0)  # the first step negotiates the names with Horovod's coordinator
    hvd.allreduce(torch.zeros(1), name=f"wire.{codec}.before")
    link_before, counted_before = interface_sent_bytes(interface), exchange.wire.sent_bytes
    for step in range(1, steps + 1):
        one_step(step)
    hvd.allreduce(torch.zeros(1), name=f"wire.{codec}.after")
    return {"codec": codec, "elements": elements, "block": BLOCK,
            "link_per_step": (interface_sent_bytes(interface) - link_before) / steps,
            "counted_per_step": (exchange.wire.sent_bytes - counted_before) / steps}


CHECKS = {
    "bitident": lambda: [{"exchange": train_tiny(True), "distributed_optimizer": train_tiny(False)}],
    "bitident_one_tensor": lambda: [{"exchange": train_tiny(True, one_tensor=True),
                                     "distributed_optimizer": train_tiny(False, one_tensor=True)}],
    "average": lambda: [average_error(c) for c in CODECS],
    "stale": lambda: [stale_sum(c, s, size) for c in CODECS for s in (0, 1, 2) for size in (4, 2 * BLOCK)],
    "stale_from": lambda: [stale_sum(c, 2, 2 * BLOCK, steps=8, stale_from_step=3) for c in CODECS],
    "owner_residual": owner_residual,
    "recut_residual": lambda: owner_residual(recut_every=20),
    "recut_delivery": lambda: [recut_delivery(c) for c in COMPRESSED],
    "backward_polls": lambda: [backward_polls(c) for c in COMPRESSED],
    "backward_starts": lambda: [row for c in CODECS for row in backward_starts(c)],
    "nan": lambda: [nan_skip(c) for c in CODECS],
    "buckets": lambda: [several_buckets(c) for c in CODECS],
    "switch": lambda: [compress_switch()],
    "drain": lambda: [drain_count(c) for c in CODECS],
    "lost_peer": lambda: [lost_peer_reset(c) for c in COMPRESSED],
    "tuning": lambda: [bucket_tuning(1), bucket_tuning(3), bucket_tuning(3, bursty=True)],
    "bytes": lambda: [sent_bytes(c) for c in CODECS],
    "waited": lambda: [waited(c) for c in CODECS],
    "wire_bytes": lambda: [wire_bytes(c) for c in CODECS],  # on a testbed: one rank per host
}


def main() -> int:
    hvd.init()
    # One thread each for torch and the numba kernels, as train.py gives workers that share the
    # cores: 2 ranks with 2 numba threads each on 2 cores made one owner's pass take 1-32 ms.
    torch.set_num_threads(1)
    numba.set_num_threads(1)
    if DEVICE.type == "cuda":
        gpus = torch.cuda.device_count()
        torch.cuda.set_device(hvd.local_rank() % gpus)
        if hvd.local_size() > gpus:
            # NCCL refuses two ranks of one communicator on one GPU of one host ("Duplicate GPU
            # detected"). A host id of its own makes each rank look like another host, so NCCL
            # connects the ranks through its socket transport. Set before the first GPU op, when
            # Horovod creates the communicator.
            os.environ["NCCL_HOSTID"] = f"transientvod-probe-rank-{hvd.rank()}"
            os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")  # the ranks are on this one machine
    for check in sys.argv[1:] or list(CHECKS):
        for row in CHECKS[check]():
            print(json.dumps({"check": check, "rank": hvd.rank(), "world": hvd.size(), **row}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
