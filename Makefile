# `make run`: set up and run the quick suite on this machine, writing a report.
# `make test`: set up and run the test suite (slow paper-scale tests: `make test-slow`).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: setup setup-test setup-bench lock run test test-slow bench reproduce clean

# the system packages (testkit/tools.py lists them; apt where it is usable), the venv filled from the lock
# (lock/ARCH.txt, with uv, else pip) and the C++ binaries, side by side; nothing but a check once the venv
# holds the lock (scripts/setup.py)
setup:
	@$(PYTHON) scripts/setup.py run --venv $(VENV)
setup-test:
	@$(PYTHON) scripts/setup.py test --venv $(VENV)
setup-bench:
	@$(PYTHON) scripts/setup.py bench --venv $(VENV)

# the lock anew from pyproject.toml, for every host arch (after a change of a requirement there)
lock:
	@$(PYTHON) scripts/setup.py lock

run: setup
	$(BIN)/zobench run --suite quick

# The bytecode is compiled first: the tests start a few hundred zobench processes, and where
# PYTHONDONTWRITEBYTECODE is set each of them would compile every module it imports again.
# A worker per core and one more: many tests wait (on an sshd board, a timeout, a lease), and
# the extra worker keeps the cores busy meanwhile (7:00 against 7:55 with a worker per core).
# Each worker more costs CPU as well (contention): pytest on a set-up clone of 9824c50, quiet,
# 2-core Zen 4 VM, 2026-12-05, wall / CPU seconds of pytest and all it started: -n 2 7:20 / 699,
# -n 3 7:13 / 783 (in another -n 3 run the cores were busy 97% of the time, /proc/stat read each
# second), -n 4 7:45 / 870.
# At d692c63 (the test farm's boards without this machine's ~/.bashrc), the same way, one after
# the other: -n 2 7:06 / 669, -n 3 6:39 / 722.
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
	g++ -O3 -march=native -fopenmp-simd -pthread -Iworkloads/cpp benchmarks/fc_tile.cpp -o build/fc_tile && OMP_NUM_THREADS=1 build/fc_tile
	$(BIN)/python benchmarks/threads.py
	$(BIN)/python benchmarks/threads.py --model pointnet --steps 6 --repeats 3
	$(BIN)/python benchmarks/omp_contention.py --policy auto
	$(BIN)/python benchmarks/late_load.py
	$(BIN)/python benchmarks/mezo_peer.py
	$(BIN)/python benchmarks/zo_optimizers.py
	$(BIN)/python benchmarks/a53_estimate.py
	$(BIN)/python benchmarks/fig7.py
	$(BIN)/python benchmarks/farm_parallel.py
	$(BIN)/python benchmarks/pool_scale.py
	$(BIN)/python benchmarks/pool_scale.py --real
	$(BIN)/python benchmarks/compare_noise.py
	$(BIN)/python benchmarks/gpu.py
	$(BIN)/python benchmarks/memory_fit.py --malloc fixed
	$(BIN)/python benchmarks/memory_fit.py --models gpt2-4m gpt2-29m --contexts 256
	$(BIN)/python benchmarks/store_scale.py
	$(BIN)/python benchmarks/setup_time.py

# the suites named for the ElasticZO paper, as tuned, their records written to
# docs/reproduction/records.jsonl.gz and docs/reproduction.md regenerated from them (hours);
# ARGS="--target T --store postgresql://USER@HOST/DB": on a target of the inventory, each run pushed
# to the shared store as it ends (scripts/reproduce.py --help)
reproduce: setup
	$(BIN)/python scripts/reproduce.py run $(ARGS)

clean:
	rm -rf $(VENV) results .pytest_cache
