"""The whole CUDA extension builds and loads on a machine without a GPU: setup.py compiles
csrc/ops.cpp and csrc/cuda/compress.cu against a CUDA build of torch (its own venv, made by
`make cuda-env` and cached), with CUDA_HOME unset so that setup_extension has to find the
toolkit behind the nvcc wrapper itself. tests/gradients/ops/cuda_build/check_extension.py then loads the
library in that venv and checks the op schemas, that each op has a CUDA and a Meta kernel, that
the Meta kernels check their arguments, that tracing records the ops (torch.compile's front
end) and torch.library.opcheck's schema and fake-tensor tests. Nothing here runs a kernel."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
CUDA_VENV = Path(os.environ.get("TRANSIENTVOD_CUDA_VENV",
                                Path.home() / ".cache" / "transientvod" / "venv-cuda-torch2.14.1"))
CUDA_PYTHON = CUDA_VENV / "bin" / "python"
CHECK = Path(__file__).resolve().parent / "cuda_build" / "check_extension.py"

# The op contract, as csrc/ops.cpp declares it and transientvod/gradients/ops/cuda.py calls it.
SCHEMAS = {
    "compress_ef_": "transientvod::compress_ef_(Tensor grad, Tensor(a!) residual, Tensor(b!) payload, "
                    "float weight, Tensor(c!)? scales, int block, Tensor(d!) flag) -> ()",
    "decompress_avg_": "transientvod::decompress_avg_(Tensor payload, Tensor(a!) out, float inv_n, "
                       "Tensor? scales, int block, Tensor(b!) flag) -> ()",
    "decompress_sum_": "transientvod::decompress_sum_(Tensor payloads, Tensor(a!) out, float inv_n, "
                       "Tensor? scales, int block, Tensor(b!) flag) -> ()",
    "reduce_compress_ef_": "transientvod::reduce_compress_ef_(Tensor payloads, Tensor(a!) residual, "
                           "Tensor(b!) out_payload, float weight, Tensor? in_scales, Tensor(c!)? out_scales, "
                           "int block, Tensor(d!) flag) -> ()",
}

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def built_library(tmp_path_factory) -> Path:
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not on the PATH, so the CUDA extension cannot be built here")
    if not CUDA_PYTHON.exists():
        pytest.skip(f"no CUDA build of torch at {CUDA_VENV}; `make cuda-env` makes it (x86_64 with nvcc)")
    out = tmp_path_factory.mktemp("cuda-build")
    env = {key: value for key, value in os.environ.items() if key not in ("CUDA_HOME", "CUDA_PATH")}
    # One architecture keeps the build short; the default list is for real build hosts.
    env.update(TRANSIENTVOD_BUILD_CUDA="1", TORCH_CUDA_ARCH_LIST="9.0", MAX_JOBS="2")
    done = subprocess.run([str(CUDA_PYTHON), "setup.py", "-q", "build_ext", "--build-lib", str(out / "lib"),
                           "--build-temp", str(out / "tmp")], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    libraries = list((out / "lib" / "transientvod").glob("_C*.so"))
    assert len(libraries) == 1, (done.stdout + done.stderr)[-4000:]
    return libraries[0]


@pytest.fixture(scope="module")
def report(built_library, tmp_path_factory) -> dict:
    # From a directory outside the repository: nothing but the built library is loaded.
    done = subprocess.run([str(CUDA_PYTHON), str(CHECK), str(built_library)], cwd=tmp_path_factory.mktemp("check"),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_ops_have_the_declared_schemas(report):
    assert report["cuda"], "the venv's torch is not a CUDA build"
    assert report["schemas"] == SCHEMAS


def test_every_op_has_a_cuda_and_a_meta_kernel_and_no_cpu_one(report):
    # CPU tensors go to the numba kernels (transientvod/gradients/ops/cpu_kernels.py), never to the extension.
    assert report["kernels"] == {name: ["CUDA", "Meta"] for name in SCHEMAS}


def test_the_meta_kernels_check_their_arguments(report):
    assert report["short_scales"] == "scales must be contiguous with 4 elements"
    assert report["sum_short_scales"] == "scales must be contiguous with 12 elements"
    assert report["owner_short_scales"] == "out_scales must be contiguous with 4 elements"


def test_tracing_records_the_op_and_opcheck_passes(report):
    assert report["traced"] == ["transientvod.compress_ef_.default"]
    assert report["opcheck"] == {name: {"test_schema": "SUCCESS", "test_faketensor": "SUCCESS"} for name in SCHEMAS}
