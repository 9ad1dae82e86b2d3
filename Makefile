# `make run`: set up and run the quick suite on this machine, writing a report.
# `make test`: set up and run the test suite (slow paper-scale tests: `make test-slow`).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: setup setup-test setup-bench run test test-slow bench reproduce clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

# the system packages (testkit/tools.py lists them): installed where apt is usable
setup: $(STAMP)
	@PYTHON=$(PYTHON) scripts/ensure-deps.sh run

setup-test: $(STAMP)
	@PYTHON=$(PYTHON) scripts/ensure-deps.sh test

setup-bench: $(STAMP)
	@PYTHON=$(PYTHON) scripts/ensure-deps.sh bench

run: setup
	$(BIN)/zobench run --suite quick

# The bytecode is compiled first: the tests start a few hundred zobench processes, and where
# PYTHONDONTWRITEBYTECODE is set each of them would compile every module it imports again.
# A worker per core and one more: many tests wait (on an sshd board, a timeout, a lease), and
# the extra worker keeps the cores busy meanwhile (7:00 against 7:55 with a worker per core).
test: setup-test
	$(BIN)/python -m compileall -q harness workloads zobench reports testkit
	$(BIN)/python -m pytest -n $$(( $$(nproc) + 1 )) --dist loadfile --no-loadscope-reorder

test-slow: setup-test
	$(BIN)/python -m pytest -m slow

bench: setup-bench
	$(BIN)/python benchmarks/runtimes.py
	$(BIN)/python benchmarks/runtimes.py --model pointnet --steps 6
	$(BIN)/python benchmarks/int8.py
	$(BIN)/python benchmarks/int8.py --model pointnet --steps 6 --repeats 3
	$(BIN)/python benchmarks/kernel_paths.py
	$(BIN)/python benchmarks/a53_estimate.py
	$(BIN)/python benchmarks/farm_parallel.py
	$(BIN)/python benchmarks/compare_noise.py
	$(BIN)/python benchmarks/gpu.py
	$(BIN)/python benchmarks/memory_fit.py --malloc fixed
	$(BIN)/python benchmarks/memory_fit.py --models gpt2-4m gpt2-29m --contexts 256
	$(BIN)/python benchmarks/store_scale.py

# the suites named for the ElasticZO paper, as tuned, and docs/reproduction.md regenerated (hours)
reproduce: setup
	$(BIN)/python scripts/reproduce.py run

clean:
	rm -rf $(VENV) results .pytest_cache
