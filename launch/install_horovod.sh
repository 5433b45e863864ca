#!/usr/bin/env bash
# Build and install Horovod 0.28.1 so that it works with today's PyTorch.
#
#   bash launch/install_horovod.sh            # uses `python` on PATH (run it inside your venv)
#   PYTHON=.venv/bin/python bash launch/install_horovod.sh
#   HOROVOD_SDIST=/path/horovod-0.28.1.tar.gz bash launch/install_horovod.sh   # a host without PyPI
#
# Why a build script: Horovod 0.28.1 is the last release, and its CMake files pin C++14,
# while PyTorch 2.x headers need C++17 (2.14 on: C++20). We take the PyPI sdist, set CMAKE_CXX_STANDARD to 17 (20)
# in the two CMakeLists.txt that pin it, and build a wheel with PyTorch + Gloo (plus NCCL GPU
# operations when torch is a CUDA build and nvcc is present: NCCL from torch's own nvidia-nccl
# package unless HOROVOD_NCCL_HOME says otherwise, Horovod's kernels for the architectures torch
# was built for unless HOROVOD_BUILD_CUDA_CC_LIST says otherwise). The wheel is cached under
# $TRANSIENTVOD_CACHE (default ~/.cache/transientvod), keyed by the torch build, Python and
# our patch, so the build (minutes) happens once per machine; later installs take seconds.
#
# launch/horovod-0.28.1-transient.patch makes Horovod hold on a real network (see its comments):
# process sets use HOROVOD_GLOO_IFACE (else Gloo resolves the hostname, often to loopback, and
# the ring cannot form); HOROVOD_GLOO_OP_TIMEOUT_SECONDS bounds collectives apart from the
# rendezvous; horovodrun's ssh sends keepalives, so a vanished host is noticed in seconds; and
# the elastic driver's message to a vanished coordinator neither waits minutes nor holds its lock;
# the rendezvous server and the workers' notification services listen on the one address
# their peers are told to use (loopback for a job on this machine), not on every interface;
# `hvd.synchronize` (every blocking op: allreduce, broadcast_object, the elastic state's
# sync) sleeps between polls instead of keeping a core busy while it waits for a peer;
# and a survivor that enqueues an op (a gradient hook) just as a dead peer's ring shuts down
# gets HorovodInternalError instead of hanging: ops are enqueued without the GIL (the
# shutdown destroys tensors under locks the enqueue takes), and a finalized queue refuses ops.
set -euo pipefail

HOROVOD_VERSION=0.28.1
PYTHON=${PYTHON:-python}
CACHE=${TRANSIENTVOD_CACHE:-$HOME/.cache/transientvod}

# WHEEL_PATH_ONLY=1 (`transientvod install-horovod --wheel-path`): stdout carries only the cached
# wheel's path, for a script that uploads it (fleet --horovod-wheel); all else goes to stderr.
WHEEL_PATH_ONLY=${WHEEL_PATH_ONLY:-}
if [ -n "$WHEEL_PATH_ONLY" ]; then exec 3>&1 1>&2; fi
die() { echo "install_horovod: $*" >&2; exit 1; }
say() { echo "install_horovod: $*"; }

command -v "$PYTHON" >/dev/null || die "no Python at '$PYTHON'; set PYTHON to your venv's python."
"$PYTHON" -c "import torch" 2>/dev/null \
  || die "PyTorch is not installed for $PYTHON; install torch first (pip install torch==2.13.0)."

PATCH="$(cd "$(dirname "$0")" && pwd)/horovod-${HOROVOD_VERSION}-transient.patch"
[ -f "$PATCH" ] || die "the patch $PATCH is missing; restore it from the repository."
PATCH_ID=$(sha256sum "$PATCH" | cut -c1-8)
# The build carries the patch in its version, so an older or unpatched Horovod is replaced.
BUILD_VERSION="${HOROVOD_VERSION}+transientvod.${PATCH_ID}"

# The cache key: Horovod's torch extension links against one torch build and one Python.
read -r TORCH_VERSION TORCH_CUDA PY_TAG < <("$PYTHON" -c '
import sys, torch
print(torch.__version__, torch.version.cuda or "cpu", "cp%d%d" % sys.version_info[:2])')
GPU_OPS=""
if [ "$TORCH_CUDA" != "cpu" ] && command -v nvcc >/dev/null; then
  GPU_OPS=NCCL
fi

check_build() {
  # Our patched build, and horovodrun --check-build lists PyTorch and Gloo (and NCCL) with [X].
  local bin out
  [ "$("$PYTHON" -c 'import horovod; print(horovod.__version__)' 2>/dev/null)" = "$BUILD_VERSION" ] || return 1
  bin="$(dirname "$("$PYTHON" -c 'import sys; print(sys.executable)')")/horovodrun"
  [ -x "$bin" ] || return 1
  out=$("$bin" --check-build 2>/dev/null) || return 1
  grep -q '\[X\] PyTorch' <<<"$out" && grep -q '\[X\] Gloo' <<<"$out" || return 1
  [ -z "$GPU_OPS" ] || grep -q '\[X\] NCCL' <<<"$out"
}

KEY="horovod-${HOROVOD_VERSION}_torch-${TORCH_VERSION}_cuda-${TORCH_CUDA}_${PY_TAG}${GPU_OPS:+_nccl}_patch-${PATCH_ID}"
WHEEL_DIR="$CACHE/wheels/$KEY"
cached_wheel() { ls "$WHEEL_DIR"/horovod-*.whl 2>/dev/null | head -1; }

# Installed already: done, unless the wheel is wanted and was never cached here (a Horovod
# installed some other way): then it is built below like any missing wheel.
if check_build && { [ -z "$WHEEL_PATH_ONLY" ] || [ -n "$(cached_wheel)" ]; }; then
  say "Horovod $BUILD_VERSION with PyTorch and Gloo${GPU_OPS:+ and NCCL} is already installed."
  [ -z "$WHEEL_PATH_ONLY" ] || cached_wheel >&3
  exit 0
fi

# For NCCL operations: the CUDA toolkit (nvcc may be a wrapper outside it), NCCL's header and
# library, and the architectures of Horovod's few kernels. Exports what Horovod's CMake reads.
configure_nccl_build() {
  local toolkit nccl archs
  toolkit=$("$PYTHON" - "$(dirname "$0")/../csrc" <<'PY'
import sys
sys.path.insert(0, sys.argv[1])
from setup_extension import find_toolkit
toolkit, why_not = find_toolkit()
print(toolkit or why_not)
sys.exit(0 if toolkit else 1)
PY
) || die "a CUDA torch and nvcc were found, but not the CUDA toolkit: $toolkit."
  # CUDA_HOME too: torch.utils.cpp_extension (which Horovod asks for the cudart to link) reads it.
  export CUDACXX="$toolkit/bin/nvcc" CUDAToolkit_ROOT="$toolkit" CUDA_HOME="$toolkit"
  if [ -z "${HOROVOD_NCCL_HOME:-}${HOROVOD_NCCL_INCLUDE:-}${HOROVOD_NCCL_LIB:-}" ]; then
    # torch's CUDA wheels bring NCCL as the nvidia-nccl package: nccl.h and libnccl.so.2 only,
    # while CMake's find_library wants libnccl.so; a link beside the build supplies it.
    nccl=$("$PYTHON" -c 'import nvidia.nccl, os; print(list(nvidia.nccl.__path__)[0])' 2>/dev/null) \
      && [ -f "$nccl/include/nccl.h" ] && [ -f "$nccl/lib/libnccl.so.2" ] \
      || die "NCCL was not found beside torch (the nvidia-nccl package); set HOROVOD_NCCL_HOME to an NCCL install with include/nccl.h and lib/libnccl.so."
    mkdir -p "$WORK/nccl-lib"
    ln -s "$nccl/lib/libnccl.so.2" "$WORK/nccl-lib/libnccl.so"
    export HOROVOD_NCCL_INCLUDE="$nccl/include" HOROVOD_NCCL_LIB="$WORK/nccl-lib" HOROVOD_NCCL_LINK=SHARED
  fi
  if [ -z "${HOROVOD_BUILD_CUDA_CC_LIST:-}" ]; then
    # Horovod's default is every architecture nvcc knows (a dozen on CUDA 13); torch's own list
    # is all that its tensors can run on anyway.
    archs=$("$PYTHON" -c '
import torch  # the build flags, not get_arch_list(): that is empty on a host without a GPU
flags = (torch._C._cuda_getArchFlags() or "").split()
print(",".join(sorted({a.split("_")[1] for a in flags if a.startswith("sm_")}, key=int)))')
    [ -n "$archs" ] || die "torch ${TORCH_VERSION} names no CUDA architectures; set HOROVOD_BUILD_CUDA_CC_LIST (for example 90)."
    export HOROVOD_BUILD_CUDA_CC_LIST=$archs
  fi
  say "NCCL from ${HOROVOD_NCCL_HOME:-${HOROVOD_NCCL_INCLUDE%/include}}; CUDA ${toolkit}; kernels for sm ${HOROVOD_BUILD_CUDA_CC_LIST}"
}

if ! ls "$WHEEL_DIR"/horovod-*.whl >/dev/null 2>&1; then
  # Check what the build needs before spending minutes on it.
  command -v patch >/dev/null || die "patch is missing; install it (apt-get install patch)."
  command -v cmake >/dev/null || die "cmake is missing; install it (apt-get install cmake, or pip install cmake)."
  command -v g++ >/dev/null || command -v c++ >/dev/null \
    || die "no C++ compiler; install g++ (apt-get install g++)."
  "$PYTHON" - <<'PY' || die "Python headers (Python.h) are missing; install python3-dev for this Python."
import os, sysconfig, sys
sys.exit(0 if os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")) else 1)
PY

  WORK=$(mktemp -d)
  trap 'rm -rf "$WORK"' EXIT
  if [ -n "${HOROVOD_SDIST:-}" ]; then
    [ -f "$HOROVOD_SDIST" ] || die "HOROVOD_SDIST=$HOROVOD_SDIST is not a file; point it at horovod-$HOROVOD_VERSION.tar.gz."
    say "using the sdist $HOROVOD_SDIST"
    cp "$HOROVOD_SDIST" "$WORK/horovod-$HOROVOD_VERSION.tar.gz"
  else
    say "downloading the horovod==$HOROVOD_VERSION sdist"
    "$PYTHON" -m pip download --quiet --no-deps --no-binary :all: "horovod==$HOROVOD_VERSION" -d "$WORK" \
      || die "could not download the horovod $HOROVOD_VERSION sdist from PyPI; check the network or pip's index settings (or set HOROVOD_SDIST to a downloaded horovod-$HOROVOD_VERSION.tar.gz)."
  fi
  tar xzf "$WORK/horovod-$HOROVOD_VERSION.tar.gz" -C "$WORK" \
    || die "could not unpack the horovod $HOROVOD_VERSION sdist; is it horovod-$HOROVOD_VERSION.tar.gz?"
  SRC="$WORK/horovod-$HOROVOD_VERSION"
  # torch 2.14's headers use C++20's operator<=> (std::strong_ordering); older ones build as C++17.
  CXX_STANDARD=$("$PYTHON" -c '
import torch
major, minor = (int(x) for x in torch.__version__.split(".")[:2])
print(20 if (major, minor) >= (2, 14) else 17)')
  sed -i "s/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD $CXX_STANDARD)/" \
    "$SRC/CMakeLists.txt" "$SRC/horovod/torch/CMakeLists.txt"
  grep -q 'CMAKE_CXX_STANDARD 14' "$SRC/CMakeLists.txt" "$SRC/horovod/torch/CMakeLists.txt" \
    && die "the C++$CXX_STANDARD patch did not apply; the sdist layout changed."
  patch --quiet -p1 -d "$SRC" <"$PATCH" || die "$PATCH did not apply to the horovod $HOROVOD_VERSION sdist."
  sed -i "s/^__version__ = '$HOROVOD_VERSION'/__version__ = '$BUILD_VERSION'/" "$SRC/horovod/__init__.py"
  grep -q "__version__ = '$BUILD_VERSION'" "$SRC/horovod/__init__.py" || die "could not set the build's version."

  if [ -n "$GPU_OPS" ]; then
    configure_nccl_build
  fi

  # Horovod's setup.py imports these at build time; --no-build-isolation means we provide them.
  "$PYTHON" -m pip install --quiet "setuptools<81" wheel packaging psutil pyyaml cloudpickle cffi

  LOG="$WORK/build.log"
  say "building Horovod (PyTorch + Gloo${GPU_OPS:+ + NCCL}); this takes a few minutes (about 2.5 on 2 cores here)."
  say "full build log: $LOG (kept on failure in $CACHE/horovod-build.log)"
  mkdir -p "$CACHE"
  set +e
  (
    # CMake 4 refuses projects that ask for policies older than 3.5, as Horovod's copy of Gloo
    # (2.8.12) does; this lets them configure (CMake 3 ignores it).
    export CMAKE_POLICY_VERSION_MINIMUM=3.5
    # GCC 13 on no longer brings headers along with others (<cstdint>, <string>, <stdexcept>,
    # <iterator>), and Gloo and Horovod relied on that: seen with GCC 13 on a GPU host.
    if [ "$("${CXX:-g++}" -dumpversion 2>/dev/null | cut -d. -f1)" -ge 13 ] 2>/dev/null; then
      export CXXFLAGS="${CXXFLAGS:-} -include cstdint -include string -include stdexcept -include iterator"
    fi
    export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1
    export HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1
    [ -n "$GPU_OPS" ] && export HOROVOD_GPU_OPERATIONS=$GPU_OPS
    export MAKEFLAGS="-j$(nproc)"
    "$PYTHON" -m pip wheel -v --no-deps --no-build-isolation -w "$WORK/dist" "$SRC"
  ) >"$LOG" 2>&1 &
  BUILD_PID=$!
  # Progress: CMake prints "[ NN%] Building CXX object ..."; show the percentage as it moves.
  last=""
  while kill -0 "$BUILD_PID" 2>/dev/null; do
    sleep 10
    pct=$(grep -oE '^ *\[ *[0-9]+%\]' "$LOG" 2>/dev/null | tail -1 | tr -d '[ ]' || true)
    if [ -n "$pct" ] && [ "$pct" != "$last" ]; then
      say "build ${pct} ($(date +%H:%M:%S))"; last=$pct
    fi
  done
  wait "$BUILD_PID"; rc=$?
  set -e
  if [ $rc -ne 0 ]; then
    cp "$LOG" "$CACHE/horovod-build.log"
    # The first errors say why; the log's tail is mostly pip cleaning up after them.
    grep -m 12 -E 'CMake Error|error:|Error [0-9]|No such file' "$LOG" >&2 || tail -25 "$LOG" >&2
    die "the Horovod build failed (exit $rc); the log is in $CACHE/horovod-build.log."
  fi
  mkdir -p "$WHEEL_DIR"
  cp "$WORK"/dist/horovod-*.whl "$WHEEL_DIR/"
  say "cached the wheel in $WHEEL_DIR"
else
  say "using the cached wheel in $WHEEL_DIR"
fi

# Horovod's own runtime requirements, then the wheel itself (--no-deps: pip would otherwise
# look for horovod's dependencies on an index that has no wheel for this build).
"$PYTHON" -m pip install --quiet cloudpickle psutil pyyaml packaging
"$PYTHON" -m pip install --quiet --force-reinstall --no-deps "$WHEEL_DIR"/horovod-*.whl
check_build || die "Horovod installed but 'horovodrun --check-build' does not show PyTorch and Gloo; see $CACHE/horovod-build.log."
say "Horovod $BUILD_VERSION is installed with PyTorch and Gloo${GPU_OPS:+ and NCCL}."
[ -z "$WHEEL_PATH_ONLY" ] || cached_wheel >&3
