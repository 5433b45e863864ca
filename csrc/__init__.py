"""The CUDA sources, shipped as `transientvod.csrc` (package data): the cupy path compiles
cuda/compress.cuh at run time (transientvod/gradients/ops/cuda.py), and launch/install_horovod.sh finds
the CUDA toolkit with setup_extension.py. setup.py maps this folder into the package."""
