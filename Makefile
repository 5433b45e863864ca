# Two commands do all the setup on a fresh machine:
#   make demo   installs what is missing, then runs the main job on the embedded digits data
#   make test   installs what is missing, then runs the tests
#   make check  the fast tier alone (no real jobs; minutes)
# On a GPU host, pick a CUDA build of torch: make install TORCH_SPEC="torch==2.13.0 --index-url <CUDA wheel index>"
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
PY := $(VENV)/bin/python
STAMP := $(VENV)/.transientvod-installed
PYTEST_ARGS ?=
# A CUDA build of torch in a venv of its own, kept between runs, for the test that builds the
# whole CUDA extension (tests/gradients/ops/test_cuda_extension_build.py); only where nvcc is on the PATH.
CUDA_VENV ?= $(HOME)/.cache/transientvod/venv-cuda-torch2.14.1
CUDA_TORCH_SPEC ?= torch==2.14.1

.PHONY: install browser testbed-tools cuda-env demo check test clean

install: $(STAMP)

$(STAMP): setup.py pyproject.toml launch/install_horovod.sh launch/horovod-0.28.1-transient.patch
	@test -x $(PY) || { echo "make: creating $(VENV)"; $(PYTHON) -m venv $(VENV); }
	@echo "make: installing $(TORCH_SPEC)"
	$(PY) -m pip install --quiet $(TORCH_SPEC) numpy
	PYTHON=$(PY) bash launch/install_horovod.sh
	@echo "make: installing transientvod and its dependencies"
	$(PY) -m pip install --quiet -e '.[test]'
	@touch $(STAMP)

demo: install
	$(VENV)/bin/transientvod demo

# Headless Chromium for the test that opens a run in MLflow's UI (Debian's package; as root
# with apt-get only: elsewhere that test is skipped and says why).
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "make: installing Debian's chromium (headless, for the MLflow UI test)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else echo "make: chromium is not installed and apt-get needs root: the MLflow UI test will be skipped"; fi; }

# Debian's sshd (and iproute2) for the testbed: namespaced hosts that horovodrun reaches over
# SSH (as root with apt-get only: elsewhere the testbed tests are skipped and say why).
# Installed only, never started: each testbed host runs its own sshd on its own address.
testbed-tools:
	@test -x /usr/sbin/sshd && command -v ip >/dev/null 2>&1 && command -v tc >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "make: installing Debian's openssh-server and iproute2 (for the testbed's hosts)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	      openssh-server openssh-client iproute2 >/dev/null; \
	  else echo "make: sshd or iproute2 is missing and apt-get needs root: the testbed tests will be skipped"; fi; }

cuda-env:
	@if ! command -v nvcc >/dev/null 2>&1 || [ "$$(uname -m)" != x86_64 ]; then \
	  echo "make: no nvcc on the PATH (or not x86_64): the CUDA extension build test will be skipped"; \
	elif [ ! -f $(CUDA_VENV)/.installed ]; then \
	  echo "make: installing $(CUDA_TORCH_SPEC) (a CUDA build, about 5.5 GB) into $(CUDA_VENV) for the extension build test; once, a few minutes"; \
	  $(PYTHON) -m venv $(CUDA_VENV) && \
	  $(CUDA_VENV)/bin/pip install --quiet $(CUDA_TORCH_SPEC) numpy setuptools wheel ninja > $(CUDA_VENV)/install.log 2>&1 || \
	    { tail -20 $(CUDA_VENV)/install.log; echo "make: installing $(CUDA_TORCH_SPEC) into $(CUDA_VENV) failed (log above)"; exit 1; }; \
	  touch $(CUDA_VENV)/.installed; echo "make: $(CUDA_VENV) is ready"; fi

# The tests in two tiers. The fast one (no real jobs) runs on two processes at once
# (pytest-xdist): one test at a time keeps one core busy. The slow tests (real horovodrun jobs,
# servers, a browser) already keep both busy, and the testbed's hosts share one subnet: those
# run one at a time. Exit status 5 is "no test selected" (a PYTEST_ARGS that picks none of a tier).
FAST_TIER := not slow and not testbed
tier = $(PY) -m pytest $(1) $(PYTEST_ARGS) || [ $$? = 5 ]

check: install testbed-tools
	$(call tier,-n 2 -m "$(FAST_TIER)")
	$(call tier,-m "testbed and not slow")

test: install browser testbed-tools cuda-env
	$(call tier,-n 2 -m "$(FAST_TIER)")
	$(call tier,-m "not ($(FAST_TIER))")

clean:
	rm -rf runs .pytest_cache
