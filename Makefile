# Two commands do all the setup on a fresh machine:
#   make demo   installs what is missing, then runs the main job on the embedded digits data
#   make test   installs what is missing, then runs the tests
# On a GPU host, pick a CUDA build of torch: make install TORCH_SPEC="torch==2.13.0 --index-url <CUDA wheel index>"
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
PY := $(VENV)/bin/python
STAMP := $(VENV)/.transientvod-installed
PYTEST_ARGS ?=

.PHONY: install demo test clean

install: $(STAMP)

$(STAMP): setup.py launch/install_horovod.sh
	@test -x $(PY) || { echo "make: creating $(VENV)"; $(PYTHON) -m venv $(VENV); }
	@echo "make: installing $(TORCH_SPEC)"
	$(PY) -m pip install --quiet $(TORCH_SPEC) numpy
	PYTHON=$(PY) bash launch/install_horovod.sh
	@echo "make: installing transientvod and its dependencies"
	$(PY) -m pip install --quiet -e '.[test]'
	@touch $(STAMP)

demo: install
	$(VENV)/bin/transientvod demo

test: install
	$(PY) -m pytest $(PYTEST_ARGS)

clean:
	rm -rf runs .pytest_cache
