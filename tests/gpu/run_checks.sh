#!/usr/bin/env bash
# Every check of the CUDA kernels that needs a GPU, in one run on a GPU host:
#   1. csrc/check_compile.sh        all architectures compile, no register spills
#   2. build transientvod._C        TRANSIENTVOD_BUILD_CUDA=1 pip install -e . --no-build-isolation --use-pep517
#   3. cuda == cpu.py               each op on CUDA vs the numba kernels, bit for bit, sizes at
#                                   block boundaries, misaligned views, NaN/Inf (every backend)
#   4. tests/gradients/ops/test_ops.py            the ops' own tests (their CUDA parametrization), every backend
#   5. tests/gradients/test_exchange.py       the exchange on CUDA tensors, every codec, 2-4 ranks (horovodrun)
#   6. tests/gpu/job_check.sh cuda  a short job through the training loop on the GPU(s): the
#                                   built-in task at fp16, then a user's task file at int8
#                                   (examples/quickstart), both at staleness 2
#   7. benchmarks/kernels.py --device cuda
# Backends (TRANSIENTVOD_KERNELS): cuda = the extension, and cupy (NVRTC) when it is installed.
# Horovod with NCCL, which step 5 needs, is built by launch/install_horovod.sh in the background
# while steps 3-4 run, unless it is installed already (HOROVOD_SDIST: a host without PyPI).
# Usage: bash tests/gpu/run_checks.sh
#   env: PYTHON (default .venv/bin/python), RUN_CHECKS_LOG (a file each step's whole log is
#   appended to as the step ends, so a run stopped part way still leaves what it did)
# Prints one line per step as it ends (and a failed step's last lines), then a summary; exit 0
# only if none failed.
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
PY=${PYTHON:-}
if [[ -z $PY ]]; then
    if [[ -x .venv/bin/python ]]; then PY=.venv/bin/python; else PY=python3; fi
fi
logs=$(mktemp -d)
results=()
failures=()

# step NAME COMMAND...: runs COMMAND with its output in a log (last_log); records PASS/FAIL.
step() {
    local name=$1 log start=$SECONDS
    shift
    log="$logs/step${#results[@]}.log"
    last_log=$log
    if "$@" >"$log" 2>&1; then
        results+=("PASS  $name ($((SECONDS - start)) s)")
    else
        results+=("FAIL  $name ($((SECONDS - start)) s)")
        failures+=("$name|$log")
    fi
    echo "${results[-1]}"
    if [[ ${results[-1]} == FAIL* ]]; then
        tail -n 8 "$log" | sed 's/^/    /'
    fi
    if [[ -n ${RUN_CHECKS_LOG:-} ]]; then
        { echo "=== ${results[-1]}"; cat "$log"; } >>"$RUN_CHECKS_LOG"
    fi
}
skip() {
    results+=("SKIP  $1: $2")
    echo "${results[-1]}"
}

report() {
    echo "== run_checks: $("$PY" -c 'import torch; print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name()}")' 2>/dev/null)"
    printf '%s\n' "${results[@]}"
    local f
    for f in "${failures[@]}"; do
        echo "-- ${f%%|*}: last lines of its log"
        tail -n 25 "${f#*|}"
    done
    rm -rf "$logs"
    if ((${#failures[@]})); then
        echo "run_checks: FAILED (${#failures[@]} step(s))"
        exit 1
    fi
    echo "run_checks: PASSED"
}

if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.version.cuda and torch.cuda.is_available() else 1)' 2>/dev/null; then
    echo "run_checks: $PY has no CUDA torch or sees no GPU; run this on a GPU host with a CUDA build of torch."
    exit 1
fi

# 1. compile check, with the toolkit the extension will be built with
step "check_compile.sh (all architectures, no spills)" env PYTHON="$PY" bash csrc/check_compile.sh

# 2. the extension, built into the checkout (no network: --no-deps)
step "build transientvod._C" env TRANSIENTVOD_BUILD_CUDA=1 \
    "$PY" -m pip install --no-build-isolation --use-pep517 --no-deps -e .
step "import transientvod._C (setup.py builds it)" "$PY" -c 'import torch, transientvod._C
print(torch.ops.transientvod.compress_ef_)'

# Horovod with NCCL for step 5, built while steps 3-4 run (after step 2: two pips at once in one
# environment could swap setuptools under the extension's build). Returns at once when the
# right build is installed already.
PYTHON="$PY" bash launch/install_horovod.sh >"$logs/horovod-build.log" 2>&1 &
horovod_build=$!
horovod_ready() {
    wait "$horovod_build"
    local rc=$?
    cat "$logs/horovod-build.log"
    return $rc
}

backends=(cuda)
if "$PY" -c 'import cupy' 2>/dev/null; then
    backends+=(cupy)
else
    skip "cupy backend" "cupy is not installed"
fi

# 3. the CUDA ops against the numba kernels, bit for bit (fp16/bf16 NaN payloads compared as NaN)
cat >"$logs/agree.py" <<'EOF'
import numpy as np
import torch

from transientvod.gradients.ops import cpu, cuda

ok, why = cuda.available()
assert ok, why
print("backend:", cuda.BACKEND, "-", why)
rng = np.random.default_rng(0)
dev = torch.device("cuda")


def data(n, offset, scale=1.0):
    x = torch.from_numpy((rng.standard_normal(n + offset) * scale).astype(np.float32))[offset:]
    if n > 8:
        x[[1, n // 2, n - 1]] = torch.tensor([float("nan"), float("inf"), 7e4])  # 7e4: fp16 overflow
    return x


def on_gpu(t, offset):  # the same values in a view `offset` elements into its storage
    g = torch.empty(t.numel() + offset, dtype=t.dtype, device=dev)[offset:]
    return g.copy_(t)


def same(a, b, what):
    a, b = a.cpu(), b.cpu()
    if a.is_floating_point():
        assert torch.equal(torch.isnan(a), torch.isnan(b)), what
        a, b = a.nan_to_num(0.0), b.nan_to_num(0.0)
    if a.dtype in (torch.float16, torch.bfloat16):  # numpy has no bfloat16
        a, b = a.view(torch.int16), b.view(torch.int16)
    assert a.numpy().tobytes() == b.numpy().tobytes(), what


cases = 0
for n in (0, 1, 255, 256, 257, 4097, 2**20 + 3):
    for offset in (0, 1):
        for dtype, block in ((torch.float16, 512), (torch.bfloat16, 512), (torch.int8, 256),
                             (torch.int8, 300), (torch.int8, 1024)):
            what = f"n={n} offset={offset} {dtype} block={block}"
            grad, res = data(n, offset), data(n, offset, 1e-3).nan_to_num(0.0, 0.0, 0.0)
            nb = -(-n // block)
            r_c, p_c, s_c = res.clone(), torch.zeros(n, dtype=dtype), torch.zeros(nb)
            bad_c = cpu.compress_ef_(grad, r_c, p_c, 0.3, s_c if dtype == torch.int8 else None, block)
            r_g, p_g, s_g = on_gpu(res, offset), on_gpu(torch.zeros(n, dtype=dtype), offset), torch.zeros(nb, device=dev)
            bad_g = cuda.compress_ef_(on_gpu(grad, offset), r_g, p_g, 0.3, s_g if dtype == torch.int8 else None, block)
            same(p_c, p_g, what + " payload")
            same(r_c, r_g, what + " residual")
            same(s_c, s_g, what + " scales")
            assert bad_c == bad_g, what + " flag"
            o_c, o_g = torch.zeros(n), on_gpu(torch.zeros(n), offset)
            bad_c = cpu.decompress_avg_(p_c, o_c, 0.25, s_c if dtype == torch.int8 else None, block)
            bad_g = cuda.decompress_avg_(p_g, o_g, 0.25, s_g if dtype == torch.int8 else None, block)
            same(o_c, o_g, what + " decompress")
            assert bad_c == bad_g, what + " decompress flag"
            cases += 1
        for dtype, k, block in ((torch.float16, 1, 512), (torch.bfloat16, 3, 512), (torch.float16, 4, 512),
                                (torch.int8, 1, 512), (torch.int8, 3, 300), (torch.int8, 8, 1024)):
            what = f"sum n={n} offset={offset} k={k} {dtype} block={block}"
            nb = -(-n // block)
            if dtype == torch.int8:
                p = torch.from_numpy(rng.integers(-127, 128, (k, n), dtype=np.int8))
                s = torch.from_numpy(rng.random((k, nb), dtype=np.float32))
                if nb:
                    s[k - 1, nb - 1] = float("inf")
            else:
                p = torch.stack([data(n, 0) for _ in range(k)]).to(dtype)
            s_c, s_g = (s, s.to(dev)) if dtype == torch.int8 else (None, None)
            o_c = torch.zeros(n)
            bad_c = cpu.decompress_sum_(p, o_c, 0.25, s_c, block)
            # out pre-filled with a value a sum never gives here, so a skipped element fails
            o_g = on_gpu(torch.full((n,), -7.5e37), offset)
            bad_g = cuda.decompress_sum_(p.to(dev), o_g, 0.25, s_g, block)
            same(o_c, o_g, what)
            assert bad_c == bad_g, what + " flag"
            cases += 1
            # reduce_compress_ef_: the same copies summed and re-encoded with a residual (1 / k:
            # the owner's weight), the GPU's tensors `offset` elements into their storage
            res = data(n, 0, 1e-3).nan_to_num(0.0, 0.0, 0.0)
            r_c, q_c = res.clone(), torch.zeros(n, dtype=dtype)
            os_c = torch.zeros(nb) if dtype == torch.int8 else None
            bad_c = cpu.reduce_compress_ef_(p, r_c, q_c, 1.0 / k, s_c, os_c, block)
            r_g, q_g = on_gpu(res, offset), on_gpu(torch.zeros(n, dtype=dtype), offset)
            os_g = torch.zeros(nb, device=dev) if dtype == torch.int8 else None
            p_g = on_gpu(p.reshape(-1), offset).view(k, n)
            bad_g = cuda.reduce_compress_ef_(p_g, r_g, q_g, 1.0 / k, s_g, os_g, block)
            same(q_c, q_g, what + " owner payload")
            same(r_c, r_g, what + " owner residual")
            if os_c is not None:
                same(os_c, os_g, what + " owner scales")
            assert bad_c == bad_g, what + " owner flag"
            cases += 1
torch.cuda.synchronize()
print(f"cuda == cpu.py in {cases} cases")
EOF

for backend in "${backends[@]}"; do
    step "cuda == cpu.py, TRANSIENTVOD_KERNELS=$backend" env TRANSIENTVOD_KERNELS="$backend" \
        "$PY" "$logs/agree.py"
    if [[ -f tests/gradients/ops/test_ops.py ]]; then
        step "pytest tests/gradients/ops/test_ops.py, TRANSIENTVOD_KERNELS=$backend" env TRANSIENTVOD_KERNELS="$backend" \
            "$PY" -m pytest -q -p no:cacheprovider -rs tests/gradients/ops/test_ops.py
    else
        skip "pytest tests/gradients/ops/test_ops.py" "the file does not exist yet"
    fi
done

# 5. the exchange itself on CUDA tensors: every codec, through horovodrun on this host (2, 3 and 4
#    ranks, sharing the GPUs there are: rank r on GPU r % count). NCCL refuses two ranks on one
#    GPU of one host ("Duplicate GPU detected"), so where ranks share a GPU the probe gives each
#    its own NCCL_HOSTID and NCCL connects them through its socket transport, as across hosts.
#    The jobs through the training loop (host_removed, stale_job) train on the CPU: not run here.
step "Horovod with NCCL (launch/install_horovod.sh)" horovod_ready
step "pytest tests/gradients/test_exchange.py on CUDA tensors (TRANSIENTVOD_PROBE_DEVICE=cuda)" \
    env TRANSIENTVOD_PROBE_DEVICE=cuda NCCL_DEBUG=WARN "$PY" -m pytest -q -p no:cacheprovider -rs \
    tests/gradients/test_exchange.py -k "not host_removed and not stale_job"

# 6. the training loop on the GPU: launcher, elastic horovodrun, fp16 at staleness 2, checkpoints.
#    transientvod's CLI imports boto3 (S3 checkpoints); a host lent for checks may not have it.
if "$PY" -c 'import boto3, sklearn' 2>/dev/null; then
    step "a job on the GPU (tests/gpu/job_check.sh cuda)" env PYTHON="$PY" bash tests/gpu/job_check.sh cuda
    step "a task file's job on the GPU, int8 (job_check.sh cuda quickstart)" \
        env PYTHON="$PY" bash tests/gpu/job_check.sh cuda quickstart
else
    skip "the jobs on the GPU" "boto3 or scikit-learn is not installed (pip install boto3 scikit-learn)"
fi

# 7. the benchmark: its own report, shown before the summary
if [[ -f benchmarks/kernels.py ]]; then
    step "benchmarks/kernels.py --device cuda" "$PY" benchmarks/kernels.py --device cuda
    echo "== benchmarks/kernels.py --device cuda (last lines)"
    tail -n 20 "$last_log"
else
    skip "benchmarks/kernels.py" "the file does not exist yet"
fi

report
