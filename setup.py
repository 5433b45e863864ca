"""transientvod: elastic deep-learning training on transient (spot / preemptible) servers.

Install with `make install` (or `pip install -e .` after torch and Horovod, see README).
Horovod is not listed in install_requires: its PyPI release does not build against
PyTorch 2.x as is, so `launch/install_horovod.sh` builds it (cached) before this step.
The CUDA extension (csrc/: the fused compression kernels) is built as `transientvod._C` when
TRANSIENTVOD_BUILD_CUDA=1, or =auto (the default) with a CUDA build of torch and nvcc present;
build it with `TRANSIENTVOD_BUILD_CUDA=1 pip install -e . --no-build-isolation --use-pep517` (pip's
isolated build has no torch). Without it, CUDA tensors use cupy (NVRTC) or plain PyTorch.
"""
import os
import sys

from setuptools import find_packages, setup

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "csrc"))
from setup_extension import cuda_extensions  # noqa: E402  (csrc/ is not a package)

ext_modules = cuda_extensions()
cmdclass = {}
if ext_modules:
    from torch.utils.cpp_extension import BuildExtension

    cmdclass["build_ext"] = BuildExtension

setup(
    name="transientvod",
    version="0.1.0",
    description="Elastic deep-learning training on transient cloud GPU servers (Horovod elastic)",
    long_description=open("README.md").read() if __import__("os").path.exists("README.md") else "",
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["transientvod", "transientvod.*"]),
    # The study's public measurements, so a user with only this package can replay them.
    package_data={"transientvod.spot": ["traces/gce-2019/*.csv", "traces/gce-2019/*.md"]},
    install_requires=[
        "torch>=2.1",
        "numpy",
        "numba",
        "pyyaml",
        "scikit-learn",  # ships the embedded default data set (digits)
        "boto3",
        # the gce provider (spot/gce.py): Application Default Credentials and an authorized
        # requests session; listed although mlflow brings it today (through databricks-sdk only)
        "google-auth[requests]",
        "mlflow",
        "matplotlib",  # the cost-versus-accuracy figures
        "psutil",
        "cloudpickle",
    ],
    extras_require={"test": ["pytest", "pytest-timeout", "moto[server]"]},
    entry_points={"console_scripts": ["transientvod=transientvod.cli:main"]},
    ext_modules=ext_modules,
    cmdclass=cmdclass,
    # the cupy path compiles this text at run time; an installed (non-editable) package finds it here
    data_files=[("share/transientvod/csrc/cuda", ["csrc/cuda/compress.cuh"])],
)
