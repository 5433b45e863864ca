#!/usr/bin/env bash
# Compile-checks the CUDA side without a GPU:
#   1. every csrc/cuda/*.cu with nvcc for each architecture we ship, ptxas reporting registers
#      and spills (-Xptxas -v); any compile error, warning or register spill fails the check;
#      and again with -ftz=true (what cupy adds) and --use_fast_math: no flushing or approximate
#      instruction may appear in the PTX;
#   2. compress.cuh as NVRTC sees it (cupy compiles it at run time): only headers NVRTC has,
#      no host code; and as ops.cpp's host compiler sees it: the launchers' declarations only;
#   3. ops.cpp against the installed torch's headers (syntax only), when a torch is importable.
# Usage: bash csrc/check_compile.sh
#   env: NVCC, CXX, PYTHON (a python with torch), TV_CUDA_ARCHS="70 75 80 90",
#        TV_CUDA_SOURCES (the directory of .cu files for step 1; default csrc/cuda)
# Exit 0 when everything passed; 1 with one sentence saying what failed.
set -uo pipefail
shopt -s nullglob

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
NVCC=${NVCC:-nvcc}
CXX=${CXX:-g++}
# sm_70 is the oldest that Horovod's GPU hosts still run; newer toolkits drop it (see below).
WANTED_ARCHS=${TV_CUDA_ARCHS:-"70 75 80 90"}
sources=${TV_CUDA_SOURCES:-$here/cuda}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

fail() {
    echo "check_compile: FAILED: $*"
    exit 1
}

command -v "$NVCC" >/dev/null 2>&1 || fail "nvcc not found (set NVCC or put the CUDA toolkit's bin on PATH)."
cuda_version=$("$NVCC" --version | sed -n 's/.*release \([0-9][0-9.]*\).*/\1/p')
# nvcc may be a wrapper script; its dry run names the toolkit's real include directory.
cuda_include=$("$NVCC" --dryrun -c -x cu /dev/null -o /dev/null 2>&1 |
    sed -n 's/^#\$ INCLUDES="-I\([^"]*\)".*/\1/p' | head -1)

# --- which architectures this nvcc can build --------------------------------------------------
supported=$("$NVCC" --list-gpu-arch 2>/dev/null | sed -n 's/^compute_\([0-9]*\)$/\1/p')
archs=()
skipped=()
for a in $WANTED_ARCHS; do
    if grep -qx "$a" <<<"$supported"; then
        archs+=("$a")
    elif [[ $a == 70 ]]; then
        skipped+=("sm_70 skipped: nvcc ${cuda_version} no longer builds it (CUDA 13 dropped Volta)")
    else
        skipped+=("sm_$a skipped: nvcc ${cuda_version} cannot build it")
    fi
done
((${#archs[@]})) || fail "nvcc ${cuda_version} supports none of the architectures ${WANTED_ARCHS}."
echo "check_compile: nvcc ${cuda_version}; architectures: ${archs[*]/#/sm_}"
for s in "${skipped[@]}"; do echo "  ($s)"; done

# --- 1. kernels: compile, collect ptxas statistics --------------------------------------------
# -O3 is what the extension builds with; -std=c++17 is the NVRTC floor (the extension itself
# builds with torch's default, C++20, checked once below). --Werror: warnings are bugs here.
stats="$work/stats"   # lines: arch kernel registers stack spill_stores spill_loads
: >"$stats"
ncu=0
# All builds run at once (each is one process, mostly ptxas/cicc), then are read in order.
for cu in "$sources"/*.cu; do
    name=$(basename "$cu")
    for a in "${archs[@]}"; do
        ( "$NVCC" -std=c++17 -O3 -arch="sm_$a" -Xptxas -v -Xcompiler -Wall,-Wextra \
            --Werror all-warnings -c "$cu" -o "$work/${name}.sm_$a.o" \
            >"$work/${name}.sm_$a.log" 2>&1; echo $? >"$work/${name}.sm_$a.rc" ) &
    done
done
wait
for cu in "$sources"/*.cu; do
    ncu=$((ncu + 1))
    name=$(basename "$cu")
    for a in "${archs[@]}"; do
        log="$work/${name}.sm_$a.log"
        if [[ $(cat "$work/${name}.sm_$a.rc") != 0 ]]; then
            grep -v 'ptxas info\|bytes stack frame' "$log" | head -20
            fail "$name does not compile for sm_$a (errors above)."
        fi
        # ptxas prints, per function: "Compiling entry function 'K' for 'sm_A'", then
        # "N bytes stack frame, S bytes spill stores, L bytes spill loads", then "Used R registers".
        awk -v arch="sm_$a" '
            /Compiling entry function/ { split($0, q, "\047"); fn = q[2] }
            /Function properties for/ { fn = $NF }
            /bytes stack frame/ { stack = $1; st = $5; ld = $9 }
            /Used [0-9]+ registers/ {
                for (i = 1; i <= NF; i++) if ($i == "Used") regs = $(i + 1)
                print arch, fn, regs, stack + 0, st + 0, ld + 0
            }' "$log" >>"$stats"
    done
done
((ncu)) || fail "no .cu files under $sources."
[[ -s $stats ]] || fail "ptxas reported no kernels (is -Xptxas -v output parsed right?)."

# Compact report: one row per kernel, registers per architecture; spills and stack only if any.
awk -v archs="${archs[*]}" '
    BEGIN { na = split(archs, A, " ") }
    {
        if (!($2 in seen)) { seen[$2] = 1; order[++nk] = $2 }
        regs["sm_" substr($1, 4), $2] = $3
        if ($4 > 0) notes = notes sprintf("  note: %s %s uses %d bytes of stack\n", $1, $2, $4)
        if ($5 + $6 > 0) spills = spills sprintf("  SPILL: %s %s: %d bytes spill stores, %d bytes spill loads\n", $1, $2, $5, $6)
    }
    END {
        printf "%-40s", "registers per thread"
        for (i = 1; i <= na; i++) printf "%8s", "sm_" A[i]
        printf "\n"
        for (k = 1; k <= nk; k++) {
            printf "  %-38s", order[k]
            for (i = 1; i <= na; i++) printf "%8s", regs["sm_" A[i], order[k]]
            printf "\n"
        }
        printf "%s%s", notes, spills
    }' "$stats"
nspill=$(awk '$5 + $6 > 0' "$stats" | wc -l)
((nspill == 0)) || fail "ptxas reports register spills in $nspill kernel builds (SPILL lines above)."
nkern=$(awk '{print $2}' "$stats" | sort -u | wc -l)
echo "  spills: none ($nkern kernels x ${#archs[@]} architectures, $ncu .cu file(s))"

# The extension builds with torch's own nvcc flags (torch.utils.cpp_extension's C++20 and
# COMMON_NVCC_FLAGS, which hide the half types' operators): one more compile, newest arch.
last=${archs[${#archs[@]}-1]}
torch_nvcc_flags=(-std=c++20 -D__CUDA_NO_HALF_OPERATORS__ -D__CUDA_NO_HALF_CONVERSIONS__
    -D__CUDA_NO_BFLOAT16_CONVERSIONS__ -D__CUDA_NO_HALF2_OPERATORS__ --expt-relaxed-constexpr)
for cu in "$sources"/*.cu; do
    "$NVCC" "${torch_nvcc_flags[@]}" -O3 -arch="sm_$last" -c "$cu" -o "$work/torch.o" \
        >"$work/torch.log" 2>&1 ||
        { head -20 "$work/torch.log"; fail "$(basename "$cu") does not compile with torch's nvcc flags."; }
done
echo "  with torch's nvcc flags (C++20, no half operators) for sm_$last: ok"

# cupy appends -ftz=true to every NVRTC compile, and a user may build with --use_fast_math: the
# arithmetic must not change under either. Any .ftz (subnormals flushed to zero), .approx or
# .full (approximate division, reciprocal) instruction in the PTX means some float operation
# skipped compress.cuh's wrappers; seen on an H200 through cupy: bf16 subnormals decoded to 0.
for flag in -ftz=true --use_fast_math; do
    for cu in "$sources"/*.cu; do
        "$NVCC" -std=c++17 "$flag" -arch="sm_$last" -ptx "$cu" -o "$work/flags.ptx" >"$work/flags.log" 2>&1 ||
            { head -20 "$work/flags.log"; fail "$(basename "$cu") does not compile with $flag."; }
        loose=$(grep -oE '[a-z0-9]+(\.[a-z0-9]+)*\.(ftz|approx|full)(\.[a-z0-9]+)*' "$work/flags.ptx" | sort | uniq -c)
        [[ -z $loose ]] || { echo "$loose"; fail "$(basename "$cu") built with $flag has flushing or approximate instructions (above)."; }
    done
done
echo "  with -ftz=true (cupy's) and --use_fast_math: no .ftz, .approx or .full instruction in the PTX"

# --- 2. compress.cuh as NVRTC and as a host compiler see it -----------------------------------
# NVRTC defines __CUDACC__ and __CUDACC_RTC__ and provides cuda_fp16.h / cuda_bf16.h itself;
# preprocessing with only those two (empty) headers on the search path proves that the text
# reaching NVRTC includes nothing else and holds no host code (launches, streams).
header="$here/cuda/compress.cuh"
mkdir -p "$work/nvrtc"
: >"$work/nvrtc/cuda_fp16.h"
: >"$work/nvrtc/cuda_bf16.h"
if ! cpp -P -nostdinc -I"$work/nvrtc" -D__CUDACC__ -D__CUDACC_RTC__ "$header" \
    -o "$work/nvrtc.i" 2>"$work/nvrtc.log"; then
    head -5 "$work/nvrtc.log"
    fail "compress.cuh includes a header NVRTC does not have (error above)."
fi
if grep -n '<<<\|cudaStream_t\|cudaError_t' "$work/nvrtc.i" | head -3 | grep .; then
    fail "compress.cuh shows host code to NVRTC (lines above); keep it under !__CUDACC_RTC__."
fi
echo "  NVRTC view of compress.cuh: ok ($(grep -c '__global__' "$work/nvrtc.i") kernels, only cuda_fp16.h/cuda_bf16.h included)"
printf '#include "compress.cuh"\n' >"$work/host.cpp"
if ! "$CXX" -std=c++17 -fsyntax-only -Wall -Wextra -Werror -I"$here/cuda" -I"$cuda_include" \
    "$work/host.cpp" >"$work/host.log" 2>&1; then
    head -10 "$work/host.log"
    fail "compress.cuh is not plain C++ for ops.cpp's host compiler (errors above)."
fi
echo "  host view of compress.cuh (what ops.cpp sees): ok"

# --- 3. ops.cpp against torch's headers --------------------------------------------------------
# A CPU build of torch ships c10/cuda but not the generated c10/cuda/impl/cuda_cmake_macros.h;
# C10_USING_CUSTOM_GENERATED_MACROS skips it (it only sets export macros).
PYTHON=${PYTHON:-}
if [[ -z $PYTHON ]]; then
    if [[ -x $here/../.venv/bin/python ]]; then PYTHON=$here/../.venv/bin/python; else PYTHON=python3; fi
fi
torch_flags=$("$PYTHON" - 2>/dev/null <<'EOF'
import sysconfig
import torch
from torch.utils.cpp_extension import include_paths
print(torch.__version__, " ".join("-I" + p for p in include_paths() + [sysconfig.get_paths()["include"]]))
EOF
)
if [[ -z $torch_flags ]]; then
    echo "  ops.cpp: not checked ($PYTHON cannot import torch)"
else
    read -r torch_version torch_includes <<<"$torch_flags"
    # shellcheck disable=SC2086  # torch_includes is a list of -I flags
    if ! "$CXX" -std=c++20 -fsyntax-only -Wall -DC10_USING_CUSTOM_GENERATED_MACROS $torch_includes \
        -I"$cuda_include" -I"$here" "$here/ops.cpp" >"$work/ops.log" 2>&1; then
        grep -m 10 'error' "$work/ops.log"
        fail "ops.cpp does not compile against torch ${torch_version}'s headers (errors above)."
    fi
    echo "  ops.cpp against torch ${torch_version} headers: ok (syntax only)"
fi

echo "check_compile: PASSED"
