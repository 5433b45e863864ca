"""transientvod: elastic deep-learning training on transient (spot / preemptible) servers.

Install with `make install` (or `pip install -e .` after torch and Horovod, see README).
Horovod is not listed in install_requires: its PyPI release does not build against
PyTorch 2.x as is, so `launch/install_horovod.sh` builds it (cached) before this step.
The CUDA extension's build (csrc/, a CUDAExtension when torch is a CUDA build and nvcc is
present) will be added here by the kernel work.
"""
from setuptools import find_packages, setup

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
        "mlflow",
        "psutil",
        "cloudpickle",
    ],
    extras_require={"test": ["pytest", "pytest-timeout", "moto[server]"]},
    entry_points={"console_scripts": ["transientvod=transientvod.cli:main"]},
)
