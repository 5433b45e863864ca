"""The fused compression ops on CUDA tensors.

The kernels are csrc/cuda/compress.cuh, run one of two ways (same text, same results):

- "cuda", the compiled extension `transientvod._C`, built by setup.py on a CUDA host
  (csrc/setup_extension.py: `TRANSIENTVOD_BUILD_CUDA=1 pip install -e . --no-build-isolation --use-pep517`);
  the ops are `torch.ops.transientvod.*`, declared once with TORCH_LIBRARY in csrc/ops.cpp.
- "cupy": cupy compiles compress.cuh with NVRTC at first use (cupy caches the binary on disk) and
  launches the kernels on torch's current stream, on views of the torch tensors (no copies).

`TRANSIENTVOD_KERNELS` (read at every call, as `transientvod.gradients.ops` does) picks one: "cuda" or
"cupy"; unset (or anything else) the extension if it imports, else cupy.
`BACKEND` says which one the ops use now ("cuda" or "cupy"; None when neither works).

Each op has the signature of its `transientvod.gradients.ops` namesake plus `flag=`. Without it, the op
allocates a one-element flag, and reading it back (the returned bool: NaN/Inf seen) waits for
the stream. With it (int32, one element, on the tensors' device), the op only ORs 1 into it
and returns None: zero it once, run many buckets, read it once.
"""
from __future__ import annotations

import functools
import importlib
import os
from importlib import resources
from pathlib import Path

import torch

from transientvod.config import INT8_BLOCK_MAX, INT8_BLOCK_MIN

KERNELS_ENV = "TRANSIENTVOD_KERNELS"  # transientvod.gradients.ops.KERNELS_ENV (no import: no cycle)
# The kernels' contract, the same numbers as compress.cuh's TV_* macros (a test compares them).
BLOCK_MIN, BLOCK_MAX = INT8_BLOCK_MIN, INT8_BLOCK_MAX
THREADS = 256  # TV_THREADS: CTA size of the elementwise kernels
VEC = 8  # TV_VEC: elements per vector step of the elementwise kernels
QUANT_ITEMS = 4  # TV_QUANT_ITEMS: int8 elements per thread
_PAYLOAD_DTYPES = (torch.float16, torch.bfloat16, torch.int8)
_BUILD_HINT = ("build transientvod._C (TRANSIENTVOD_BUILD_CUDA=1 pip install -e . "
               "--no-build-isolation --use-pep517) or install cupy (cupy-cuda12x / cupy-cuda13x)")


def kernel_source_path() -> Path:
    """compress.cuh, shipped in the package as transientvod.csrc (csrc/ of a checkout, mapped
    into the package by setup.py; pip installs a package as plain files, so this is a path)."""
    path = Path(str(resources.files("transientvod.csrc") / "cuda" / "compress.cuh"))
    if not path.is_file():
        raise FileNotFoundError(f"compress.cuh is missing from {path.parent}; reinstall transientvod.")
    return path


def available() -> tuple[bool, str]:
    """(True, which backend) when CUDA tensors can use these ops, else (False, why not)."""
    if not torch.cuda.is_available():
        if not torch.version.cuda:
            return False, f"torch {torch.__version__} is not a CUDA build"
        return False, "no CUDA device is visible"
    try:
        return True, _backend().description
    except RuntimeError as error:
        return False, str(error)


# ---------------------------------------------------------------------------------------------
# The ops


def compress_ef_(grad: torch.Tensor, residual: torch.Tensor, payload: torch.Tensor,
                 weight: float, scales: torch.Tensor | None = None, block: int = 512, *,
                 flag: torch.Tensor | None = None) -> bool | None:
    """x = grad*weight + residual; payload = x quantized; residual = x - payload (fp32)."""
    n = grad.numel()
    device = _check("compress_ef_", "grad", grad, (torch.float32,), n, grad.device)
    _check("compress_ef_", "residual", residual, (torch.float32,), n, device)
    _check("compress_ef_", "payload", payload, _PAYLOAD_DTYPES, n, device)
    if payload.dtype == torch.int8:
        _check("compress_ef_", "scales", scales, (torch.float32,), _blocks(n, block), device)
    flag, own = _flag("compress_ef_", flag, device)
    _backend().compress_ef_(grad, residual, payload, float(weight), scales, int(block), flag)
    return bool(flag.item()) if own else None


def decompress_avg_(payload: torch.Tensor, out: torch.Tensor, inv_n: float,
                    scales: torch.Tensor | None = None, block: int = 512, *,
                    flag: torch.Tensor | None = None) -> bool | None:
    """out = float(payload) * inv_n (int8: q * scale * inv_n)."""
    n = payload.numel()
    device = _check("decompress_avg_", "payload", payload, (torch.float32,) + _PAYLOAD_DTYPES,
                    n, payload.device)
    _check("decompress_avg_", "out", out, (torch.float32,), n, device)
    if payload.dtype == torch.int8:
        _check("decompress_avg_", "scales", scales, (torch.float32,), _blocks(n, block), device)
    flag, own = _flag("decompress_avg_", flag, device)
    _backend().decompress_avg_(payload, out, float(inv_n), scales, int(block), flag)
    return bool(flag.item()) if own else None


def decompress_sum_(payloads: torch.Tensor, out: torch.Tensor, inv_n: float,
                    scales: torch.Tensor | None = None, block: int = 512, *,
                    flag: torch.Tensor | None = None) -> bool | None:
    """out = (decode(payloads[0]) + ... + decode(payloads[k-1])) * inv_n, rows summed in order."""
    op = "decompress_sum_"
    k, m, device = _copies(op, payloads)
    _check(op, "out", out, (torch.float32,), m, device)
    if payloads.dtype == torch.int8:
        _check(op, "scales", scales, (torch.float32,), k * _blocks(m, block), device)
    flag, own = _flag(op, flag, device)
    _backend().decompress_sum_(payloads, out, float(inv_n), scales, int(block), flag)
    return bool(flag.item()) if own else None


def reduce_compress_ef_(payloads: torch.Tensor, residual: torch.Tensor, out_payload: torch.Tensor,
                        weight: float, in_scales: torch.Tensor | None = None,
                        out_scales: torch.Tensor | None = None, block: int = 512, *,
                        flag: torch.Tensor | None = None) -> bool | None:
    """decompress_sum_(payloads, total, 1.0, in_scales) then compress_ef_(total, residual,
    out_payload, weight, out_scales), in one kernel: the owner's step."""
    op = "reduce_compress_ef_"
    k, m, device = _copies(op, payloads)
    _check(op, "residual", residual, (torch.float32,), m, device)
    _check(op, "out_payload", out_payload, (payloads.dtype,), m, device)
    if payloads.dtype == torch.int8:
        _check(op, "in_scales", in_scales, (torch.float32,), k * _blocks(m, block), device)
        _check(op, "out_scales", out_scales, (torch.float32,), _blocks(m, block), device)
    flag, own = _flag(op, flag, device)
    _backend().reduce_compress_ef_(payloads, residual, out_payload, float(weight), in_scales, out_scales,
                                   int(block), flag)
    return bool(flag.item()) if own else None


def _copies(op: str, payloads: torch.Tensor) -> tuple[int, int, torch.device]:
    """(k, m, device) of the owner's ops' payloads [k, m], checked as the kernels need them."""
    if payloads.dim() != 2 or payloads.shape[0] < 1:
        raise ValueError(f"{op}: payloads must be [k, m] with k >= 1, not {list(payloads.shape)}.")
    k, m = payloads.shape
    return k, m, _check(op, "payloads", payloads, _PAYLOAD_DTYPES, k * m, payloads.device)


def _check(op: str, name: str, t: torch.Tensor | None, dtypes: tuple, numel: int,
           device: torch.device) -> torch.device:
    """ValueError, in one sentence, unless t is a contiguous CUDA tensor as the kernels need."""
    if t is None:
        raise ValueError(f"{op}: {name} is required (an int8 payload needs its scales).")
    if t.device.type != "cuda":
        raise ValueError(f"{op}: {name} must be a CUDA tensor, not {t.device} "
                         "(transientvod.gradients.ops runs CPU tensors on the CPU kernels).")
    if t.device != device:
        raise ValueError(f"{op}: {name} is on {t.device}, the other tensors on {device}.")
    if t.dtype not in dtypes:
        names = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise ValueError(f"{op}: {name} must be {names}, not {str(t.dtype).removeprefix('torch.')}.")
    if not t.is_contiguous() or t.numel() != numel:
        raise ValueError(f"{op}: {name} must be contiguous with {numel} elements "
                         f"(it has {t.numel()}{'' if t.is_contiguous() else ', strided'}).")
    return t.device


def _blocks(n: int, block: int) -> int:
    if not BLOCK_MIN <= block <= BLOCK_MAX:
        raise ValueError(f"block must be in [{BLOCK_MIN}, {BLOCK_MAX}], not {block}.")
    return _ceil_div(n, block)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def quant_threads(block: int) -> int:
    """CTA size of the int8 kernels (compress.cuh's tv::quant_threads): QUANT_ITEMS elements
    per thread, in whole warps, at most THREADS."""
    return min(THREADS, _ceil_div(_ceil_div(block, QUANT_ITEMS), 32) * 32)


def _flag(op: str, flag: torch.Tensor | None, device: torch.device) -> tuple[torch.Tensor, bool]:
    """The caller's flag, checked, or a new zeroed one (stream-ordered, from torch's cache)."""
    if flag is None:
        return torch.zeros(1, dtype=torch.int32, device=device), True
    _check(op, "flag", flag, (torch.int32,), 1, device)
    return flag, False


# ---------------------------------------------------------------------------------------------
# Backends


def __getattr__(name: str):
    """`BACKEND`: "cuda" or "cupy", whichever the ops use now (None if neither works)."""
    if name == "BACKEND":
        try:
            return _backend().name
        except RuntimeError:
            return None
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _backend():
    """The backend TRANSIENTVOD_KERNELS asks for now."""
    wanted = os.environ.get(KERNELS_ENV, "").strip().lower()
    return _load(wanted if wanted in ("cuda", "cupy") else "auto")


@functools.cache
def _load(wanted: str):
    """The backend, loaded once per choice (a failure is not cached: a later call retries)."""
    reasons = []
    if wanted in ("auto", "cuda"):
        try:
            return _Extension()
        except ImportError as error:
            reasons.append(f"transientvod._C is not built ({error})")
    if wanted in ("auto", "cupy"):
        try:
            return _Cupy()
        except ImportError:
            reasons.append("cupy is not installed")
        except Exception as error:  # NVRTC or the driver: report, don't crash the caller
            reasons.append(f"cupy cannot compile the kernels ({type(error).__name__}: {error})")
    raise RuntimeError(f"no CUDA kernels: {'; '.join(reasons)}; {_BUILD_HINT}")


class _Extension:
    """torch.ops.transientvod.*, registered by importing the compiled extension."""

    name = "cuda"

    def __init__(self):
        importlib.import_module("transientvod._C")
        self.ops = torch.ops.transientvod
        self.description = "transientvod._C (compiled extension)"

    def compress_ef_(self, grad, residual, payload, weight, scales, block, flag):
        self.ops.compress_ef_(grad, residual, payload, weight, scales, block, flag)

    def decompress_avg_(self, payload, out, inv_n, scales, block, flag):
        self.ops.decompress_avg_(payload, out, inv_n, scales, block, flag)

    def decompress_sum_(self, payloads, out, inv_n, scales, block, flag):
        self.ops.decompress_sum_(payloads, out, inv_n, scales, block, flag)

    def reduce_compress_ef_(self, payloads, residual, out_payload, weight, in_scales, out_scales, block, flag):
        self.ops.reduce_compress_ef_(payloads, residual, out_payload, weight, in_scales, out_scales, block, flag)


class _Cupy:
    """compress.cuh compiled by NVRTC through cupy; launches mirror csrc/cuda/compress.cu."""

    name = "cupy"
    _KERNELS = {torch.float16: "f16", torch.bfloat16: "bf16", torch.int8: "i8",
                torch.float32: "f32"}

    def __init__(self):
        import cupy
        import numpy

        self.cupy, self.numpy = cupy, numpy
        path = kernel_source_path()
        options = ["-std=c++17"]
        # cuda_fp16.h / cuda_bf16.h: NVRTC may not have them built in; the toolkit's will do.
        cuda_path = cupy.cuda.get_cuda_path()
        if cuda_path and Path(cuda_path, "include", "cuda_fp16.h").is_file():
            options.append(f"-I{Path(cuda_path, 'include')}")
        self.module = cupy.RawModule(code=path.read_text(), options=tuple(options))
        with cupy.cuda.Device(torch.cuda.current_device()):
            self.module.get_function("tv_compress_ef_f16_kernel")  # compile now, fail here
        self.description = f"cupy {cupy.__version__} (NVRTC, {path})"

    # Scalars go as numpy scalars of the kernels' C types (float, long long, int): cupy would
    # pass a Python float as double and a Python int as a 64-bit integer.

    def compress_ef_(self, grad, residual, payload, weight, scales, block, flag):
        n, np = grad.numel(), self.numpy
        name = f"tv_compress_ef_{self._KERNELS[payload.dtype]}_kernel"
        if payload.dtype == torch.int8:
            self._launch_quant(name, n, block, grad, residual, payload, scales,
                               np.float32(weight), np.int64(n), np.int32(block), flag)
        else:
            self._launch_elementwise(name, n, grad, residual, payload, np.float32(weight),
                                     np.int64(n), flag)

    def decompress_avg_(self, payload, out, inv_n, scales, block, flag):
        n, np = payload.numel(), self.numpy
        name = f"tv_decompress_avg_{self._KERNELS[payload.dtype]}_kernel"
        if payload.dtype == torch.int8:
            self._launch_quant(name, n, block, payload, scales, out, np.float32(inv_n),
                               np.int64(n), np.int32(block), flag)
        else:
            self._launch_elementwise(name, n, payload, out, np.float32(inv_n), np.int64(n), flag)

    def decompress_sum_(self, payloads, out, inv_n, scales, block, flag):
        (k, m), np = payloads.shape, self.numpy
        name = f"tv_decompress_sum_{self._KERNELS[payloads.dtype]}_kernel"
        if payloads.dtype == torch.int8:
            args = (payloads, scales, np.int32(k), np.int64(m), out, np.float32(inv_n), np.int32(block), flag)
        else:
            args = (payloads, np.int32(k), np.int64(m), out, np.float32(inv_n), flag)
        self._launch(name, m, _ceil_div(m, THREADS), THREADS, args)  # one thread per element

    def reduce_compress_ef_(self, payloads, residual, out_payload, weight, in_scales, out_scales, block, flag):
        (k, m), np = payloads.shape, self.numpy
        name = f"tv_reduce_compress_ef_{self._KERNELS[payloads.dtype]}_kernel"
        if payloads.dtype == torch.int8:  # one CTA per block, as compress_ef_
            self._launch_quant(name, m, block, payloads, in_scales, np.int32(k), np.int64(m), residual, out_payload,
                               out_scales, np.float32(weight), np.int32(block), flag)
        else:  # one thread per element, as decompress_sum_
            args = (payloads, np.int32(k), np.int64(m), residual, out_payload, np.float32(weight), flag)
            self._launch(name, m, _ceil_div(m, THREADS), THREADS, args)

    # -- launch plumbing: the same grids as csrc/cuda/compress.cu -----------------------------

    def _launch_elementwise(self, name, n, *args):
        groups = _ceil_div(n, VEC)  # one thread per vector step
        self._launch(name, n, _ceil_div(groups, THREADS), THREADS, args)

    def _launch_quant(self, name, n, block, *args):
        self._launch(name, n, _ceil_div(n, block), quant_threads(block), args)

    def _launch(self, name, n, ctas_wanted, threads, args):
        if n == 0:  # as the launchers: nothing to do, and a grid of 0 is an error
            return
        device = next(a.device for a in args if isinstance(a, torch.Tensor))
        # grid_size(): enough CTAs to fill every SM once; the kernels grid-stride over the rest
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        grid = min(ctas_wanted, sms * (2048 // threads))
        stream = torch.cuda.current_stream(device)
        cupy = self.cupy
        with cupy.cuda.Device(device.index), cupy.cuda.ExternalStream(stream.cuda_stream):
            kernel = self.module.get_function(name)
            kernel((grid,), (threads,), tuple(self._arg(a) for a in args))

    def _arg(self, a):
        """A torch tensor as a cupy view of the same memory (16-bit floats as int16 bits)."""
        if not isinstance(a, torch.Tensor):
            return a
        a = a.detach()
        if a.dtype in (torch.float16, torch.bfloat16):  # cupy has no bfloat16
            a = a.view(torch.int16)
        return self.cupy.asarray(a)
