"""transientvod's build: what pyproject.toml cannot say statically.

pyproject.toml holds the metadata (name, version, dependencies, the `transientvod` command).
This file adds two things computed at build time:

- The package list. Besides transientvod/ and its subpackages, three top-level folders ship
  inside the package, so that an installed wheel needs no checkout: launch/ as
  `transientvod.launch` (the discovery scripts, `python -m transientvod.launch.spot_hosts`,
  and the Horovod build: install_horovod.sh and its patch), configs/ as
  `transientvod.configs` (the demo's config) and csrc/ as `transientvod.csrc` (the CUDA
  sources the cupy path compiles at run time). The folders stay where the project keeps them,
  so `python launch/spot_hosts.py` still works from a checkout; the code finds their files
  through importlib.resources, in a wheel and in an editable install alike.
- The CUDA extension (csrc/: the fused compression kernels), built as `transientvod._C` when
  TRANSIENTVOD_BUILD_CUDA=1, or =auto (the default) with a CUDA build of torch and nvcc present;
  build it with `TRANSIENTVOD_BUILD_CUDA=1 pip install -e . --no-build-isolation --use-pep517`
  (pip's isolated build has no torch). Without it, CUDA tensors use cupy (NVRTC) or plain PyTorch.

Install with `make install` (or `pip install -e .` after torch, then `transientvod install-horovod`).
"""
import os
import sys

from setuptools import find_packages, setup

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "csrc"))
from setup_extension import cuda_extensions  # noqa: E402  (imported from its folder: setup.py runs before any install)

# Top-level folders shipped as subpackages: package name -> folder (each has an __init__.py,
# which setuptools' editable installs need to map a package onto a folder of another name).
SHIPPED_FOLDERS = {"transientvod.launch": "launch", "transientvod.configs": "configs", "transientvod.csrc": "csrc"}

ext_modules = cuda_extensions()
cmdclass = {}
if ext_modules:
    from torch.utils.cpp_extension import BuildExtension

    cmdclass["build_ext"] = BuildExtension

setup(
    packages=find_packages(include=["transientvod", "transientvod.*"]) + list(SHIPPED_FOLDERS),
    package_dir=SHIPPED_FOLDERS,
    package_data={
        # The study's public measurements, so a user with only this package can replay them.
        "transientvod.spot": ["traces/gce-2019/*.csv", "traces/gce-2019/*.md"],
        "transientvod.launch": ["install_horovod.sh", "horovod-*-transient.patch"],
        "transientvod.configs": ["*.yaml"],
        "transientvod.csrc": ["*.cpp", "*.sh", "cuda/*.cu", "cuda/*.cuh"],
    },
    ext_modules=ext_modules,
    cmdclass=cmdclass,
)
