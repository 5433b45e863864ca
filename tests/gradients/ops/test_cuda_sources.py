"""The CUDA side, checked where no GPU is: the kernels compile for every architecture without
register spills, the kernel text stays free of torch (NVRTC compiles it too), the Python face
answers `available()` with a reason and refuses what the kernels cannot take, and the build
helper setup.py calls picks the right extension list. The kernels' results are checked on a GPU
host by tests/gradients/ops/test_ops.py (see tests/gpu/run_checks.sh).
"""
from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from transientvod.gradients.ops import cuda

ROOT = Path(__file__).resolve().parents[3]
CSRC = ROOT / "csrc"
HEADER = CSRC / "cuda" / "compress.cuh"
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")


def _check_compile(env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(CSRC / "check_compile.sh")], capture_output=True,
                          text=True, timeout=300, env=env)


def _includes(path: Path) -> list[str]:
    return re.findall(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', path.read_text(), re.M)


@pytest.mark.slow  # 8 nvcc builds and a torch-headers parse: 10-35 s on two cores
@needs_nvcc
def test_kernels_compile_for_every_architecture_without_spills():
    result = _check_compile()
    print(result.stdout)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "check_compile: PASSED" in result.stdout
    assert re.search(r"spills: none \(13 kernels x \d architectures", result.stdout)


@needs_nvcc
def test_compile_check_fails_on_a_register_spill(tmp_path, monkeypatch):
    # A kernel whose launch bounds leave it 64 registers for 128 live values.
    (tmp_path / "spill.cu").write_text("""
__global__ void __launch_bounds__(1024, 1) spill(float* p) {
  float v[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) v[i] = p[i * 1024 + threadIdx.x];
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < 128; ++i) s += v[i] * v[127 - i] * v[(i * 7) % 128];
  p[threadIdx.x] = s;
}
""")
    monkeypatch.setenv("TV_CUDA_SOURCES", str(tmp_path))
    monkeypatch.setenv("TV_CUDA_ARCHS", "80 90")
    result = _check_compile()
    assert result.returncode == 1, result.stdout + result.stderr
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith("check_compile: FAILED: ptxas reports register spills"), last


def test_kernel_text_has_no_torch_headers():
    allowed = {"cuda_fp16.h", "cuda_bf16.h", "cuda_runtime_api.h", "compress.cuh"}
    for path in (CSRC / "cuda").glob("*.cu*"):
        extra = set(_includes(path)) - allowed
        assert not extra, f"{path.name} includes {sorted(extra)}: kernels stay torch-free"
    # The binding reaches the kernels only through the launchers' declarations, and avoids
    # ATen/cuda/CUDAContext.h (it drags in cuSPARSE, absent from slim toolkits).
    binding = _includes(CSRC / "ops.cpp")
    assert "cuda/compress.cuh" in binding
    assert "ATen/cuda/CUDAContext.h" not in binding


def test_python_face_mirrors_the_kernels_constants():
    defines = dict(re.findall(r"^#define TV_(\w+) (\d+)", HEADER.read_text(), re.M))
    assert (cuda.THREADS, cuda.VEC, cuda.QUANT_ITEMS, cuda.BLOCK_MIN, cuda.BLOCK_MAX) == tuple(
        int(defines[k]) for k in ("THREADS", "VEC", "QUANT_ITEMS", "BLOCK_MIN", "BLOCK_MAX"))
    # every block size gets whole warps holding the whole block in registers
    for block in range(cuda.BLOCK_MIN, cuda.BLOCK_MAX + 1):
        threads = cuda.quant_threads(block)
        assert threads % 32 == 0 and threads * cuda.QUANT_ITEMS >= block
    assert cuda.kernel_source_path() == HEADER


def test_available_says_why_not_without_raising():
    ok, reason = cuda.available()
    assert isinstance(ok, bool) and isinstance(reason, str) and reason
    if not torch.cuda.is_available():
        assert ok is False and cuda.BACKEND is None


def test_cpu_tensors_are_refused_in_one_sentence():
    with pytest.raises(ValueError, match=r"^compress_ef_: grad must be a CUDA tensor, not cpu"):
        cuda.compress_ef_(torch.zeros(3), torch.zeros(3), torch.zeros(3, dtype=torch.half), 1.0)
    with pytest.raises(ValueError, match=r"^decompress_sum_: payloads must be \[k, m\] with k >= 1"):
        cuda.decompress_sum_(torch.zeros(3, dtype=torch.int8), torch.zeros(3), 1.0, torch.zeros(1, 1))
    with pytest.raises(ValueError, match=r"^decompress_sum_: payloads must be a CUDA tensor, not cpu"):
        cuda.decompress_sum_(torch.zeros(2, 3, dtype=torch.half), torch.zeros(3), 1.0)


def _setup_extension():
    spec = importlib.util.spec_from_file_location("setup_extension", CSRC / "setup_extension.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_setup_extension_builds_only_what_it_can(monkeypatch):
    setup_extension = _setup_extension()
    monkeypatch.setenv("TRANSIENTVOD_BUILD_CUDA", "0")
    assert setup_extension.cuda_extensions() == []
    monkeypatch.setenv("TRANSIENTVOD_BUILD_CUDA", "yes")
    with pytest.raises(SystemExit, match="must be auto, 1 or 0"):
        setup_extension.cuda_extensions()
    if torch.version.cuda:
        pytest.skip("torch is a CUDA build: auto and 1 build the extension here")
    monkeypatch.setenv("TRANSIENTVOD_BUILD_CUDA", "auto")
    assert setup_extension.cuda_extensions() == []
    monkeypatch.setenv("TRANSIENTVOD_BUILD_CUDA", "1")
    with pytest.raises(SystemExit, match=r"asks for the CUDA extension, but torch .* is not a CUDA build"):
        setup_extension.cuda_extensions()


def test_gpu_check_script_parses():
    subprocess.run(["bash", "-n", str(ROOT / "tests" / "gpu" / "run_checks.sh")], check=True)


def test_the_toolkit_is_found_behind_an_nvcc_wrapper(tmp_path, monkeypatch):
    # torch takes the directory above the first nvcc on PATH as CUDA_HOME; above a wrapper
    # script there are no CUDA headers, and the build died in the compile. find_toolkit asks
    # nvcc where it really lives.
    setup_extension = _setup_extension()
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not on the PATH")
    wrapper_bin = tmp_path / "bin"
    wrapper_bin.mkdir()
    (wrapper_bin / "nvcc").write_text(f'#!/bin/sh\nexec {nvcc} "$@"\n')
    (wrapper_bin / "nvcc").chmod(0o755)
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setenv("PATH", f"{wrapper_bin}:{os.environ['PATH']}")
    toolkit, why_not = setup_extension.find_toolkit()
    assert why_not is None
    assert toolkit != str(tmp_path)
    assert os.path.isfile(os.path.join(toolkit, "include", "cuda_runtime.h"))
    assert os.environ["CUDA_HOME"] == toolkit


def test_a_cuda_home_without_headers_is_one_sentence(tmp_path, monkeypatch):
    setup_extension = _setup_extension()
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    toolkit, why_not = setup_extension.find_toolkit()
    assert toolkit is None
    assert why_not.startswith(f"CUDA_HOME={tmp_path} has no include/cuda_runtime.h; set CUDA_HOME to")
    monkeypatch.delenv("CUDA_HOME")
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvcc anywhere
    assert setup_extension.find_toolkit() == (None, "nvcc was not found (set CUDA_HOME or put the CUDA toolkit's "
                                                   "bin/ on PATH)")
