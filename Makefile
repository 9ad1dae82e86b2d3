# `make run`: set up and run the quick suite on this machine, writing a report.
# `make test`: set up and run the test suite (slow paper-scale tests: `make test-slow`).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: setup data run test test-slow bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

setup: $(STAMP) data

data:
	@scripts/ensure-deps.sh

run: setup
	$(BIN)/zobench run --suite quick

test: setup
	$(BIN)/python -m pytest

test-slow: setup
	$(BIN)/python -m pytest -m slow

bench: setup
	$(BIN)/python benchmarks/runtimes.py
	$(BIN)/python benchmarks/int8.py
	$(BIN)/python benchmarks/farm_parallel.py
	$(BIN)/python benchmarks/compare_noise.py

clean:
	rm -rf $(VENV) results .pytest_cache
