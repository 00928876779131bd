"""Every shipped recipe validates (both passes) and the 7B family is internally consistent."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from populora_core.plugins import PluginManager
from populora_core.recipe import load_recipe

RECIPES = sorted((Path(__file__).resolve().parents[1] / "recipes").glob("*.yaml"))
SEVEN_B = [p for p in RECIPES if p.stem.endswith("_7b")]


@pytest.fixture(scope="module")
def registry():
    pm = PluginManager()
    pm.load_entry_points()
    assert not [p.error for p in pm.plugins.values() if p.error], "a built-in plugin failed to load"
    return pm.registry


def test_the_recipe_family_is_complete():
    names = {p.name for p in RECIPES}
    assert {
        "azr_7b.yaml",
        "azr_coder_7b.yaml",
        "single_agent_7b.yaml",
        "populora_1t1s_7b.yaml",
        "populora_8t8s_7b.yaml",
    } <= names


@pytest.mark.parametrize("path", RECIPES, ids=[p.name for p in RECIPES])
def test_recipe_validates_and_says_what_it_reproduces(path, registry):
    assert path.read_text().startswith("# "), f"{path.name} needs a header comment saying what it reproduces"
    model, _ = load_recipe(path, [], registry)
    members = model.population.teachers + (0 if model.population.mode == "single_agent" else model.population.students)
    if model.engine.name == "vllm":
        assert model.engine.params["max_loras"] >= members, "all members should fit one vLLM batch"
        assert model.engine.params["max_lora_rank"] >= model.lora.rank


def test_7b_recipes_share_adapter_shape_and_per_adapter_compute():
    loaded = {p.stem: yaml.safe_load(p.read_text()) for p in SEVEN_B}
    reference = loaded["azr_7b"]
    for name, recipe in loaded.items():
        assert recipe["lora"] == reference["lora"], f"{name}: LoRA shape differs from azr_7b"
        assert recipe["rollout"] == reference["rollout"], f"{name}: per-adapter rollout budget differs"
        assert recipe["trainer"] == reference["trainer"], f"{name}: trainer differs"
        assert recipe["engine"]["name"] == "vllm"
    assert loaded["single_agent_7b"]["population"]["mode"] == "single_agent"
    assert loaded["azr_coder_7b"]["base_model"] == "Qwen/Qwen2.5-Coder-7B"
    assert (
        loaded["populora_8t8s_7b"]["population"]["teachers"],
        loaded["populora_1t1s_7b"]["population"]["students"],
    ) == (8, 1)
