"""``benchmarks.gpu_smoke``'s checks can fail, and a failed one fails the run: with two identical adapters the
"different greedy tokens" check fails, the last line names it, and the process exits 1. The run is
``--trainer-only`` in a fresh interpreter, which also shows that mode never imports vLLM (test_benchmarks.py runs
every check passing, at the same shapes, in ``--smoke`` and ``--smoke --vllm``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.cli_helpers import REPO


@pytest.mark.slow
def test_identical_adapters_fail_their_check_and_the_run_exits_1():
    code = (
        "import sys; import benchmarks.gpu_smoke as smoke; smoke.ADAPTER_SEEDS = (1, 1); "
        "sys.exit(smoke.main(['--smoke', '--trainer-only']))"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not result["passed"] and result["failed"] == ["adapters_hf"]
    check = result["checks"]["adapters_hf"]
    assert check["prompts_whose_tokens_differ"] == 0 and check["first_again_identical"]
    assert sorted(result["checks"]) == ["adapters_hf", "doctor", "trainer"]  # no run, no vLLM check
    assert result["vllm_imported"] is False
