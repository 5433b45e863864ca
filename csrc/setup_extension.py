"""The CUDA extension's build, for setup.py: `ext_modules=cuda_extensions()`.

TRANSIENTVOD_BUILD_CUDA says whether `transientvod._C` (csrc/ops.cpp + csrc/cuda/compress.cu)
is built:
  auto (default)  when torch is a CUDA build and nvcc is found; otherwise nothing is built
  1               always; stops with one sentence naming what is missing
  0               never
Without the extension, transientvod.gradients.ops.cuda compiles csrc/cuda/compress.cuh with cupy (NVRTC)
at run time, and CPU tensors never need it. torch must be importable while setup.py runs, so on
a GPU host build with `TRANSIENTVOD_BUILD_CUDA=1 pip install -e . --no-build-isolation --use-pep517`
(pip's default isolated build environment has no torch: "auto" then builds nothing; and without
--use-pep517 pip runs `setup.py develop`, which setuptools >= 80 hands back to pip in isolation).

The toolkit: CUDA_HOME (or CUDA_PATH) when set, which must hold include/cuda_runtime.h.
Otherwise torch takes the directory above the first `nvcc` on PATH, which is wrong when that
nvcc is a wrapper script (/usr/local/bin/nvcc exec'ing /usr/local/cuda-13.0/bin/nvcc): the
build then dies deep in the compile with "cuda_runtime.h: No such file or directory". So
`find_toolkit` asks nvcc where it really lives (`nvcc --dryrun` prints its own _HERE_
directory) and sets CUDA_HOME to that toolkit before torch's cpp_extension reads it.

No torch import at module level: setup.py imports this module even where torch is absent.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess

BUILD_CUDA_ENV = "TRANSIENTVOD_BUILD_CUDA"
EXTENSION_NAME = "transientvod._C"
# Relative to the repository root, where pip runs setup.py (setuptools wants relative paths).
SOURCES = ["csrc/ops.cpp", "csrc/cuda/compress.cu"]
# No --use_fast_math: the kernels' results must equal the CPU side's bit for bit, and -ftz
# would flush the denormal gradients the CPU keeps. torch adds its own -std and half flags.
EXTRA_COMPILE_ARGS = {"cxx": ["-O3"], "nvcc": ["-O3", "-lineinfo"]}
# For a build host without a GPU: Turing, Ampere and Hopper (T4, A100, H100), as check_compile.sh.
DEFAULT_ARCHITECTURES = "7.5;8.0;9.0"


def _has_headers(toolkit: str) -> bool:
    return os.path.isfile(os.path.join(toolkit, "include", "cuda_runtime.h"))


def find_toolkit() -> tuple[str | None, str | None]:
    """(the CUDA toolkit's directory, None) or (None, why not). Sets CUDA_HOME when it had to
    look, so that torch.utils.cpp_extension (which reads it at import) agrees."""
    for variable in ("CUDA_HOME", "CUDA_PATH"):
        given = os.environ.get(variable)
        if given:
            if _has_headers(given):
                return given, None
            return None, (f"{variable}={given} has no include/cuda_runtime.h; set {variable} to the CUDA "
                          "toolkit's own directory (the one with bin/nvcc and include/, e.g. /usr/local/cuda-13.0)")
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return None, "nvcc was not found (set CUDA_HOME or put the CUDA toolkit's bin/ on PATH)"
    try:
        dryrun = subprocess.run([nvcc, "--dryrun", "-c", "-x", "cu", os.devnull, "-o", os.devnull],
                                capture_output=True, text=True, timeout=60)
        here = re.search(r"^#\$ _HERE_=(.+)$", dryrun.stdout + dryrun.stderr, re.MULTILINE)
    except (OSError, subprocess.TimeoutExpired):
        here = None
    candidates = [os.path.dirname(here.group(1).strip())] if here else []
    candidates.append(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))))
    for toolkit in candidates:
        if _has_headers(toolkit):
            os.environ["CUDA_HOME"] = toolkit
            return toolkit, None
    return None, (f"the nvcc at {nvcc} belongs to no toolkit with include/cuda_runtime.h; set CUDA_HOME to the "
                  "CUDA toolkit's own directory (the one with bin/nvcc and include/)")


def _missing() -> str | None:
    """What keeps this environment from building the extension, or None."""
    try:
        import torch
    except ImportError:
        return ("torch is not importable while setup.py runs "
                "(pip builds in an isolated environment: add --no-build-isolation --use-pep517)")
    if not torch.version.cuda:
        return f"torch {torch.__version__} is not a CUDA build (install a CUDA wheel of torch)"
    toolkit, why_not = find_toolkit()
    if toolkit is None:
        return why_not
    import torch.utils.cpp_extension as cpp_extension

    # It read CUDA_HOME when first imported, which may have been before find_toolkit set it.
    cpp_extension.CUDA_HOME = toolkit
    if not os.environ.get("TORCH_CUDA_ARCH_LIST") and not torch.cuda.is_available():
        # torch builds for the GPUs it sees; a build host without one (a CI runner, an image
        # build) gets the architectures csrc/check_compile.sh checks for spills.
        os.environ["TORCH_CUDA_ARCH_LIST"] = DEFAULT_ARCHITECTURES
        print(f"transientvod: no GPU visible; building the CUDA extension for {DEFAULT_ARCHITECTURES} "
              "(set TORCH_CUDA_ARCH_LIST to choose)")
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
