"""`transientvod doctor`: which kernel backend each op uses on this machine, and why."""
from __future__ import annotations

import os

from transientvod.config import ConfigError


def add_parser(subparsers) -> None:
    doctor = subparsers.add_parser("doctor", help="which kernel backend each op uses here, and why")
    doctor.set_defaults(func=cmd_doctor)


def cmd_doctor(args) -> int:
    import torch

    from transientvod.gradients import ops

    devices = [torch.device("cpu")] + ([torch.device("cuda", 0)] if torch.cuda.is_available() else [])
    ops_names = ("compress_ef_", "decompress_avg_", "decompress_sum_", "reduce_compress_ef_")
    print(f"torch {torch.__version__} (CUDA {torch.version.cuda or 'none'}); "
          f"{ops.KERNELS_ENV}={os.environ.get(ops.KERNELS_ENV, '') or '(unset)'}")
    for device in devices:
        try:
            backend, why = ops.backend_for(device)
        except RuntimeError as e:  # an unusable TRANSIENTVOD_KERNELS: one sentence, not a traceback
            raise ConfigError(str(e)) from None
        for name in ops_names:
            print(f"  {name:<26} on {str(device):<6} -> {backend:<6} ({why})")
    if not torch.cuda.is_available():
        print("  no CUDA device here: CUDA tensors would use the compiled extension, else cupy, else torch")
    return 0
