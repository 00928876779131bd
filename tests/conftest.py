import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import pytest


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A tiny random Llama + tokenizer built offline once per test session."""
    from tests.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny_model"))


@pytest.fixture(scope="session")
def qwen7b():
    """Qwen2.5-7B's shape from its committed config (every projection targeted): what the 7B plans are made on."""
    from populora_core.api.architecture import load_arch
    from tests.cli_helpers import REPO

    targets = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    return load_arch(REPO / "recipes" / "configs" / "Qwen__Qwen2.5-7B.json", targets)


@pytest.fixture(scope="session")
def plugins():
    """The installed plugins' manager (its registry resolves recipes)."""
    from populora_core.plugin.manager import get_manager

    return get_manager()
