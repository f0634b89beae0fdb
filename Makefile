# Two entry points for a fresh machine:
#   make demo  -- create .venv, install mmpos, run the quickstart recipe (CPU, ~3 min)
#   make test  -- create .venv, install mmpos with the test extra, lint (ruff), run the tests,
#                 run the Hugging Face tests (-m hf) again in $(VENV_OLD) on the oldest supported
#                 transformers, then build the sdist + wheel and run the wheel outside the checkout (wheel-check)
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
# the oldest transformers the hf extra supports (pyproject.toml); the test extra installs the newest tested 5.x
VENV_OLD ?= .venv-hf-oldest
HF_OLDEST ?= transformers==4.57.1

.PHONY: demo test test-hf-oldest lint wheel-check install install-test install-test-oldest bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip

install: $(BIN)/python
	$(BIN)/pip install -e .

install-test: $(BIN)/python
	$(BIN)/pip install -e ".[test]"

$(VENV_OLD)/bin/python:
	$(PYTHON) -m venv $(VENV_OLD)
	$(VENV_OLD)/bin/python -m pip install --upgrade pip

install-test-oldest: $(VENV_OLD)/bin/python
	$(VENV_OLD)/bin/pip install -e ".[test]" "$(HF_OLDEST)"

demo: install
	$(BIN)/mmpos run quickstart

test: install-test lint
	$(BIN)/python -m pytest -n 2 --durations=15
	$(MAKE) test-hf-oldest
	.ci/wheel_check.sh $(BIN)/python

# the tests marked hf, on the oldest supported transformers
test-hf-oldest: install-test-oldest
	$(VENV_OLD)/bin/python -m pytest -n 2 -m hf -p no:cacheprovider

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
