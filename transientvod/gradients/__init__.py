"""The gradients' path between backward and the optimizer: the exchange over Horovod (buckets,
codecs, bounded staleness), its bucket tuning, the waits on Horovod's handles, and the fused
compression ops (ops/: numba on CPU, the CUDA extension or cupy on GPU, a plain-torch reference).
`ops` and `codecs` know nothing of Horovod's elastic mode or of training.
"""
