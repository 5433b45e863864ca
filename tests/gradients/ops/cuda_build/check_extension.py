"""Run by tests/gradients/ops/test_cuda_extension_build.py with the CUDA build of torch (its own venv):
load the freshly built transientvod._C and check what a GPU-less machine can check. Prints
one JSON object; every check that fails raises.

    python check_extension.py /path/to/_C.cpython-311-x86_64-linux-gnu.so
"""
from __future__ import annotations

import json
import sys

import torch
from torch.fx.experimental.proxy_tensor import make_fx

OPS = ("compress_ef_", "decompress_avg_", "decompress_sum_", "reduce_compress_ef_")


def meta_arguments(n: int = 1000, block: int = 256) -> dict:
    blocks = -(-n // block)
    meta = {"device": "meta"}
    flag = torch.zeros(1, dtype=torch.int32, **meta)
    grad, residual = torch.empty(n, **meta), torch.empty(n, **meta)
    return {
        "compress_ef_": (grad, residual, torch.empty(n, dtype=torch.int8, **meta), 1.0,
                         torch.empty(blocks, **meta), block, flag),
        "decompress_avg_": (torch.empty(n, dtype=torch.float16, **meta), torch.empty(n, **meta), 0.25, None, block,
                            flag),
        "decompress_sum_": (torch.empty(3, n, dtype=torch.int8, **meta), torch.empty(n, **meta), 1.0 / 3,
                            torch.empty(3, blocks, **meta), block, flag),
        "reduce_compress_ef_": (torch.empty(3, n, dtype=torch.int8, **meta), torch.empty(n, **meta),
                                torch.empty(n, dtype=torch.int8, **meta), 1.0 / 3, torch.empty(3, blocks, **meta),
                                torch.empty(blocks, **meta), block, flag),
    }


def main(library: str) -> None:
    torch.ops.load_library(library)
    ops = torch.ops.transientvod
    report = {"torch": torch.__version__, "cuda": torch.version.cuda, "schemas": {}, "kernels": {}}
    for name in OPS:
        report["schemas"][name] = str(getattr(ops, name).default._schema)
        report["kernels"][name] = [key for key in ("CUDA", "Meta", "CPU")
                                   if torch._C._dispatch_has_kernel_for_dispatch_key(f"transientvod::{name}", key)]

    arguments = meta_arguments()
    for name, args in arguments.items():
        getattr(ops, name)(*args)  # the Meta kernel: the checks, nothing launched
    # The checks run on meta tensors too: a scales tensor one block short is refused.
    grad, residual, payload, weight, scales, block, flag = arguments["compress_ef_"]
    try:
        ops.compress_ef_(grad, residual, payload, weight, scales[:-1], block, flag)
        report["short_scales"] = "accepted"
    except RuntimeError as e:
        report["short_scales"] = str(e).splitlines()[0]
    # decompress_sum_'s scales need one row per copy: one row short is refused as well.
    payloads, out, inv_n, sum_scales, block, flag = arguments["decompress_sum_"]
    try:
        ops.decompress_sum_(payloads, out, inv_n, sum_scales[:-1], block, flag)
        report["sum_short_scales"] = "accepted"
    except RuntimeError as e:
        report["sum_short_scales"] = str(e).splitlines()[0]
    # reduce_compress_ef_'s out_scales: one block short is refused.
    payloads, residual, out_payload, weight, in_scales, out_scales, block, flag = arguments["reduce_compress_ef_"]
    try:
        ops.reduce_compress_ef_(payloads, residual, out_payload, weight, in_scales, out_scales[:-1], block, flag)
        report["owner_short_scales"] = "accepted"
    except RuntimeError as e:
        report["owner_short_scales"] = str(e).splitlines()[0]

    # Tracing, as torch.compile's front end does: the ops appear in the graph, in place.
    def step(grad, residual, payload, scales, flag):
        ops.compress_ef_(grad, residual, payload, 1.0, scales, 256, flag)
        return payload

    graph = make_fx(step, tracing_mode="fake")(grad, residual, payload, scales, flag)
    report["traced"] = [str(node.target) for node in graph.graph.nodes if node.op == "call_function"]

    # opcheck: schema, fake tensor and autograd registration, on meta tensors.
    report["opcheck"] = {}
    for name, args in arguments.items():
        results = torch.library.opcheck(getattr(ops, name).default, args,
                                        test_utils=("test_schema", "test_faketensor"))
        report["opcheck"][name] = results
    print(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1])
