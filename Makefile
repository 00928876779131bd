# Two commands do everything on a fresh CPU machine:
#   make quickstart   set up .venv, then run the main job (the nano recipe) into runs/nano
#   make test         set up .venv, then run the test suite (what CI runs)
# POPULORA_CPU_VENV=1 (a GPU machine): setup.sh builds the CPU stack in .venv-cpu, and every target uses it
VENV := $(if $(filter 1,$(POPULORA_CPU_VENV)),.venv-cpu,.venv)
PY := $(VENV)/bin/python
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: setup quickstart test lint static-checks bench

setup:
	@bash scripts/setup.sh

# nano's runtime.threads (1) is applied by the run itself (start_run); the populora command sets runtime.cpu_isa
# before torch loads
quickstart: setup
	$(VENV)/bin/populora run recipes/nano.yaml --run-dir runs/nano

# scripts/run_tests.sh: the main group on every core (pytest-xdist, a file's tests on one worker so its module
# fixtures are built once; the Ray tests are in it, tests/conftest.py restoring the numeric environment a test
# leaves changed), and beside it the vLLM group in its own process and the static checks (why: in the script).
test: setup
	@bash scripts/install_chromium.sh
	@PY=$(PY) bash scripts/run_tests.sh

lint: setup
	@$(MAKE) --no-print-directory static-checks

static-checks:
	$(PY) -m ruff check populora_core plugins tests benchmarks
	$(PY) -m ruff format --check populora_core plugins tests benchmarks
	$(PY) -m mypy

bench: setup
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -m "not vllm" tests/benchmarks/test_benchmarks.py
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -m vllm tests/benchmarks/test_benchmarks.py
