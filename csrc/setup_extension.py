"""The CUDA extension's build, for setup.py: `ext_modules=cuda_extensions()`.

TRANSIENTVOD_BUILD_CUDA says whether `transientvod._C` (csrc/ops.cpp + csrc/cuda/compress.cu)
is built:
  auto (default)  when torch is a CUDA build and nvcc is found; otherwise nothing is built
  1               always; stops with one sentence naming what is missing
  0               never
Without the extension, transientvod.ops.cuda compiles csrc/cuda/compress.cuh with cupy (NVRTC)
at run time, and CPU tensors never need it. torch must be importable while setup.py runs, so on
a GPU host build with `TRANSIENTVOD_BUILD_CUDA=1 pip install -e . --no-build-isolation`
(pip's default isolated build environment has no torch: "auto" then builds nothing).

No torch import at module level: setup.py imports this module even where torch is absent.
"""
from __future__ import annotations

import os

BUILD_CUDA_ENV = "TRANSIENTVOD_BUILD_CUDA"
EXTENSION_NAME = "transientvod._C"
# Relative to the repository root, where pip runs setup.py (setuptools wants relative paths).
SOURCES = ["csrc/ops.cpp", "csrc/cuda/compress.cu"]
# No --use_fast_math: the kernels' results must equal the CPU side's bit for bit, and -ftz
# would flush the denormal gradients the CPU keeps. torch adds its own -std and half flags.
EXTRA_COMPILE_ARGS = {"cxx": ["-O3"], "nvcc": ["-O3", "-lineinfo"]}


def _missing() -> str | None:
    """What keeps this environment from building the extension, or None."""
    try:
        import torch
    except ImportError:
        return ("torch is not importable while setup.py runs "
                "(pip builds in an isolated environment: add --no-build-isolation)")
    if not torch.version.cuda:
        return f"torch {torch.__version__} is not a CUDA build (install a CUDA wheel of torch)"
    from torch.utils.cpp_extension import CUDA_HOME

    nvcc = os.path.join(CUDA_HOME or "", "bin", "nvcc")
    if not CUDA_HOME or not os.path.exists(nvcc):
        return "nvcc was not found (set CUDA_HOME or put the CUDA toolkit's bin/ on PATH)"
    return None


def cuda_extensions() -> list:
    """[CUDAExtension("transientvod._C", ...)] when it should and can be built, else []."""
    mode = os.environ.get(BUILD_CUDA_ENV, "auto").strip().lower()
    if mode not in ("auto", "0", "1"):
        raise SystemExit(f"{BUILD_CUDA_ENV} must be auto, 1 or 0, not {mode!r}.")
    if mode == "0":
        return []
    missing = _missing()
    if missing:
        if mode == "1":
            raise SystemExit(f"{BUILD_CUDA_ENV}=1 asks for the CUDA extension, but {missing}.")
        return []
    from torch.utils.cpp_extension import CUDAExtension

    return [CUDAExtension(EXTENSION_NAME, SOURCES, extra_compile_args=EXTRA_COMPILE_ARGS)]
