"""The simulation's inputs checked and shaped before the numba kernel sees them (montecarlo.py):
real numbers as C-contiguous float64, per-slot arrays spread over a slot's servers, positive
times; each mistake is a ValueError of one sentence."""
from __future__ import annotations

import math

import numpy as np


def real_array(name, values, ndim):
    """values as a C-contiguous float64 array (a copy only if needed), or a ValueError."""
    array = np.asarray(values)
    if array.dtype.kind not in "fiu":
        raise ValueError(f"{name} has dtype {array.dtype}; it must hold real numbers (float64).")
    if ndim is not None and array.ndim != ndim:
        raise ValueError(f"{name} has {array.ndim} dimensions; it must have {ndim}.")
    return np.ascontiguousarray(array, dtype=np.float64)


def per_server(name, values, runs, slots, servers):
    """[R, W] spread over the slot's servers, or [R, W, G + 1] as is."""
    array = np.asarray(values)
    if name == "noticed" and array.dtype != np.bool_:
        raise ValueError(f"noticed has dtype {array.dtype}; it must be bool (True: the server got a notice).")
    if array.shape == (runs, slots):
        return np.ascontiguousarray(np.repeat(array[:, :, None], servers, axis=2))
    if array.shape == (runs, slots, servers):
        return np.ascontiguousarray(array)
    raise ValueError(f"{name} has shape {array.shape}; it must be [runs, workers] = {(runs, slots)} or "
                     f"[runs, workers, generations + 1] = {(runs, slots, servers)}.")


def positive_number(name, value):
    value = float(value)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} is {value}; it must be a finite number > 0.")
    return value
