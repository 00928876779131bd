"""Base models by registered name, local directory or hub id (through the Hugging Face cache, offline too)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from populora_core import UserError, get_registry
from tests.cli_helpers import run_cli

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "fake_2t2s.yaml"
FAKE = str(Path(__file__).resolve().parents[1] / "fake_stack.py")


def _cache_with(hub: Path, repo_id: str, model_dir: Path) -> Path:
    """A hub cache laid out as huggingface_hub lays it: refs/main -> snapshots/<commit>/<files>."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = hub / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    snapshot = repo / "snapshots" / commit
    shutil.copytree(model_dir, snapshot)
    return snapshot


@pytest.fixture()
def offline_cache(tmp_path, monkeypatch):
    from huggingface_hub import constants

    hub = tmp_path / "hub"
    hub.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return hub


def test_a_cached_hub_id_resolves_offline_to_its_snapshot(offline_cache, tiny_model_dir):
    snapshot = _cache_with(offline_cache, "someorg/tiny-llama", tiny_model_dir)
    model = get_registry().base_model("someorg/tiny-llama")
    assert Path(model.path) == snapshot and model.name == "someorg/tiny-llama"
    assert (Path(model.path) / "config.json").is_file()


def test_an_uncached_hub_id_offline_names_the_id_and_the_cache(offline_cache):
    with pytest.raises(UserError) as err:
        get_registry().base_model("Qwen/Qwen2.5-7B")
    message = str(err.value)
    assert "'Qwen/Qwen2.5-7B' not found in the Hugging Face cache" in message and str(offline_cache) in message
    assert "HF_HUB_OFFLINE=1" in message
    # the command it names is one the environment installs (huggingface_hub's `hf`; `huggingface-cli` is not)
    command = message.split("fetch it once with `", 1)[1].split("`", 1)[0]
    assert command == "hf download Qwen/Qwen2.5-7B"
    assert (Path(sys.executable).parent / command.split()[0]).is_file()


def test_local_directories_and_bad_names(tmp_path, tiny_model_dir):
    registry = get_registry()
    assert registry.base_model(str(tiny_model_dir)).path == str(tiny_model_dir)
    assert registry.base_model("nano").name == "nano"
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match=r"has no config\.json"):
        registry.base_model(str(tmp_path / "empty"))
    with pytest.raises(UserError, match="no such directory, and not a hub id"):
        registry.base_model(str(tmp_path / "missing" / "dir"))
    with pytest.raises(UserError, match="params are only accepted for a registered base model"):
        registry.base_model(str(tiny_model_dir), {"x": 1})


def test_run_with_an_uncached_hub_id_offline_exits_2_and_leaves_no_run(tmp_path):
    run_dir = tmp_path / "run"
    hub = tmp_path / "hub"
    hub.mkdir()
    env = {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(hub)}
    args = ["--plugin", FAKE, "run", str(RECIPE), "base_model=someorg/not-cached", "--run-dir", str(run_dir)]
    result = run_cli(*args, env=env)
    assert result.returncode == 2, result.stderr
    assert "base model 'someorg/not-cached' not found in the Hugging Face cache" in result.stderr
    assert "Traceback" not in result.stderr and not (run_dir / "recipe.yaml").exists()
