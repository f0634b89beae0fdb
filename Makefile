# Two entry points for a fresh machine:
#   make demo  -- create .venv, install mmpos, run the quickstart recipe (CPU, ~3 min)
#   make test  -- create .venv, install mmpos with the test extra, run the tests
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin

.PHONY: demo test install install-test bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip

install: $(BIN)/python
	$(BIN)/pip install -e .

install-test: $(BIN)/python
	$(BIN)/pip install -e ".[test]"

demo: install
	$(BIN)/mmpos run quickstart

test: install-test
	$(BIN)/python -m pytest -n 2 --durations=15

bench: install-test
	$(BIN)/python benchmarks/vision.py
	$(BIN)/python benchmarks/irpe.py
	$(BIN)/python benchmarks/rope_index.py
	$(BIN)/python benchmarks/mrope.py

clean:
	rm -rf $(VENV) runs .pytest_cache
