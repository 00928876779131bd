import os
import sys
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import pytest


class ProcessStateLeak(UserWarning):
    """A test left the process changed; the fixture below put it back."""


#: the environment that decides what torch computes or where: CPU code paths, thread counts, the allocator,
#: visible devices (Ray workers and child processes inherit it). Libraries' own import-time settings are theirs.
NUMERIC_ENV_PREFIXES = ("ATEN_", "MKL_", "ONEDNN_", "OMP_", "KMP_", "PYTORCH_", "CUDA_VISIBLE_DEVICES")


@pytest.fixture(autouse=True)
def _process_state_restored(request):
    """Every test leaves the numeric environment and torch's thread count as it found them, and a warning names
    the one that did not. Both reach the numbers later tests compute: Ray workers and child processes inherit the
    environment (``ATEN_CPU_CAPABILITY``, ``MKL_CBWR``, thread counts), and torch's results depend on its threads.
    A leaked ``runtime.cpu_isa`` once made the Ray tests' bit-for-bit comparisons need a pytest process of their own."""
    env = {k: v for k, v in os.environ.items() if k.startswith(NUMERIC_ENV_PREFIXES)}
    threads = sys.modules["torch"].get_num_threads() if "torch" in sys.modules else None
    yield
    now = {k: v for k, v in os.environ.items() if k.startswith(NUMERIC_ENV_PREFIXES)}
    leaked = sorted(k for k in env.keys() | now.keys() if env.get(k) != now.get(k))
    for key in leaked:
        if key in env:
            os.environ[key] = env[key]
        else:
            del os.environ[key]
    torch = sys.modules.get("torch")
    if torch is not None and threads is not None and torch.get_num_threads() != threads:
        leaked.append(f"torch threads {torch.get_num_threads()} (was {threads})")
        from populora_core.services.runtime import set_torch_threads

        set_torch_threads(threads)
    if leaked:
        warnings.warn(f"{request.node.nodeid} changed {', '.join(leaked)}; restored", ProcessStateLeak, stacklevel=1)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A tiny random Llama + tokenizer built offline once per test session."""
    from benchmarks.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny_model"))


@pytest.fixture(scope="session")
def qwen7b():
    """Qwen2.5-7B's shape from its committed config (every projection targeted): what the 7B plans are made on."""
    from populora_core.services.architecture import load_arch
    from tests.cli_helpers import REPO

    targets = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    return load_arch(REPO / "recipes" / "configs" / "Qwen__Qwen2.5-7B.json", targets)


@pytest.fixture(scope="session")
def plugins():
    """The installed plugins' manager (its registry resolves recipes)."""
    from populora_core.plugin.manager import get_manager

    return get_manager()
