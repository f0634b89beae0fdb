# Two entry points for a fresh machine:
#   make demo  -- create .venv, install mmpos with the recipes extra, run the quickstart recipe (CPU, ~4 min)
#   make test  -- create .venv, install mmpos with the test extra, lint (ruff), run the tests,
#                 run the integration tests (-m "hf or timm or open_clip or pyg") again in $(VENV_OLD) on the
#                 oldest supported transformers, timm, open_clip_torch and torch-geometric (test-oldest),
#                 then build the sdist + wheel and run the wheel outside the checkout (wheel-check)
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
# the oldest job: the floors pyproject.toml declares for the libraries mmpos plugs into (hf extra: transformers;
# core: timm, open_clip_torch, torch-geometric), pinned by .ci/oldest_pins.py; .venv gets the newest releases
VENV_OLD ?= .venv-oldest
OLDEST  ?= $(shell $(PYTHON) .ci/oldest_pins.py)
OLDEST_MARKERS = hf or timm or open_clip or pyg

.PHONY: demo test test-oldest test-hf-oldest lint wheel-check install install-test install-test-oldest bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip

install: $(BIN)/python
	$(BIN)/pip install -e ".[recipes]"  # the runner and the shipped recipes (the core alone: pip install -e .)

install-test: $(BIN)/python
	$(BIN)/pip install -e ".[test]"

$(VENV_OLD)/bin/python:
	$(PYTHON) -m venv $(VENV_OLD)
	$(VENV_OLD)/bin/python -m pip install --upgrade pip

install-test-oldest: $(VENV_OLD)/bin/python
	@test -n "$(OLDEST)" || { echo "no oldest pins (see .ci/oldest_pins.py)"; exit 1; }
	$(VENV_OLD)/bin/pip install -e ".[test]" $(OLDEST)

demo: install
	$(BIN)/mmpos run quickstart

test: install-test lint
	@echo "pytest: starting 2 workers (each imports torch and the integrations first; up to a minute or two on a loaded machine)"
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -n 2 --durations=15
	$(MAKE) test-oldest
	.ci/wheel_check.sh $(BIN)/python

# the integration tests on the oldest supported releases of the libraries they plug into (one thread per worker)
test-oldest: install-test-oldest
	@echo "pytest (oldest releases): starting 2 workers"
	OMP_NUM_THREADS=1 $(VENV_OLD)/bin/python -m pytest -n 2 -m "$(OLDEST_MARKERS)" -p no:cacheprovider --durations=5

test-hf-oldest: test-oldest  # the former name

lint: install-test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# python -m build + twine check, then the wheel in a fresh venv outside the checkout runs
# mmpos list / list recipes / info / run quickstart profile=smoke (see the script's header)
wheel-check: install-test
	.ci/wheel_check.sh $(BIN)/python

bench: install-test
	$(BIN)/python benchmarks/vision.py
	$(BIN)/python benchmarks/irpe.py
	$(BIN)/python benchmarks/rope_index.py
	$(BIN)/python benchmarks/mrope.py
	$(BIN)/python benchmarks/export.py
	$(BIN)/python benchmarks/media.py

clean:
	rm -rf $(VENV) $(VENV_OLD) runs .pytest_cache build dist
