# Two entry points for a fresh machine:
#   make demo  -- create .venv, install mmpos, run the quickstart recipe (CPU, ~3 min)
#   make test  -- create .venv, install mmpos with the test extra, lint (ruff), run the tests,
#                 then build the sdist + wheel and run the wheel outside the checkout (wheel-check)
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin

.PHONY: demo test lint wheel-check install install-test bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip

install: $(BIN)/python
	$(BIN)/pip install -e .

install-test: $(BIN)/python
	$(BIN)/pip install -e ".[test]"

demo: install
	$(BIN)/mmpos run quickstart

test: install-test lint
	$(BIN)/python -m pytest -n 2 --durations=15
	.ci/wheel_check.sh $(BIN)/python

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

clean:
	rm -rf $(VENV) runs .pytest_cache build dist
