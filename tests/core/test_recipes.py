"""Every shipped recipe validates (both passes), the 7B family is internally consistent, and each single-agent
baseline is compute-matched to one slot of its population (the budget ``populora validate`` prints)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from populora_core.cli.commands import cli
from populora_core.plugin.manager import PluginManager
from populora_core.recipe.validate import load_recipe

RECIPES = sorted((Path(__file__).resolve().parents[2] / "recipes").glob("*.yaml"))
SEVEN_B = [p for p in RECIPES if p.stem.endswith("_7b")]
RECIPE_DIR = RECIPES[0].parent
#: population recipe -> its compute-matched single-agent baseline
SINGLE_AGENT_OF = {"azr_7b": "single_agent_7b", "nano": "nano_single_agent"}


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
        "azr_llama3.1_8b.yaml",
    } <= names


@pytest.mark.parametrize("path", RECIPES, ids=[p.name for p in RECIPES])
def test_recipe_validates_and_says_what_it_reproduces(path, registry):
    assert path.read_text().startswith("# "), f"{path.name} needs a header comment saying what it reproduces"
    model, _ = load_recipe(path, [], registry)
    members = model.population.teachers + (0 if model.population.mode == "single_agent" else model.population.students)
    if model.engine.name == "vllm":
        assert model.engine.params["max_loras"] >= members, "all members should fit one vLLM batch"
        assert model.engine.params["max_lora_rank"] >= model.lora.rank


def test_7b_recipes_share_adapter_shape_and_rollout_settings():
    loaded = {p.stem: yaml.safe_load(p.read_text()) for p in SEVEN_B}
    reference = loaded["azr_7b"]
    assert reference["rollout"]["max_prompt_tokens"] == 6144  # AZR data.max_prompt_length
    for name, recipe in loaded.items():
        assert recipe["lora"] == reference["lora"], f"{name}: LoRA shape differs from azr_7b"
        expected = dict(reference["rollout"])
        if name == "single_agent_7b":  # one adapter of the population's 8: half the proposals (budget tests below)
            expected["proposals_per_teacher"] //= 2
        assert recipe["rollout"] == expected, f"{name}: rollout settings differ from azr_7b"
        assert recipe["trainer"] == reference["trainer"], f"{name}: trainer differs"
        assert recipe["engine"]["name"] == "vllm"
    assert loaded["single_agent_7b"]["population"]["mode"] == "single_agent"
    assert loaded["azr_coder_7b"]["base_model"] == "Qwen/Qwen2.5-Coder-7B"
    assert (
        loaded["populora_8t8s_7b"]["population"]["teachers"],
        loaded["populora_1t1s_7b"]["population"]["students"],
    ) == (8, 1)


def test_llama_recipe_is_azr_7b_with_llama_base_and_azr_llama_task_settings(registry):
    """AZR's llama.sh (and qwen3_4b.sh): reject_multiple_functions=False, f_replace_location=any_last."""
    llama = yaml.safe_load((RECIPE_DIR / "azr_llama3.1_8b.yaml").read_text())
    reference = yaml.safe_load((RECIPE_DIR / "azr_7b.yaml").read_text())
    assert llama["base_model"] == "meta-llama/Llama-3.1-8B"
    for key in set(reference) | set(llama):
        if key not in ("name", "base_model", "tasks"):
            assert llama.get(key) == reference.get(key), f"{key} differs from azr_7b"
    assert [t["name"] for t in llama["tasks"]] == [t["name"] for t in reference["tasks"]]
    for ours, theirs in zip(llama["tasks"], reference["tasks"], strict=True):
        params = dict(ours["params"])
        assert (params.pop("one_def"), params.pop("f_replace_location")) == (False, "any_last")
        assert params == theirs["params"]
    model, _ = load_recipe(RECIPE_DIR / "azr_llama3.1_8b.yaml", [], registry)
    task = registry.get("task", "deduction").build(model.tasks[0].params, executor=None, rng=0)
    assert (task.params.one_def, task.f_replace_location) == (False, "any_last")


def budget(path: Path) -> tuple[str, str]:
    """``populora validate``'s budget line: (per slot and step, slots)."""
    result = CliRunner().invoke(cli, ["validate", str(path)])
    assert result.exit_code == 0, result.output
    [line] = [row for row in result.output.splitlines() if row.startswith("  per slot and step: ")]
    per_slot, _, slots = line.removeprefix("  per slot and step: ").partition("; slots: ")
    return per_slot, slots


def test_validate_prints_the_per_slot_budget():
    assert budget(RECIPE_DIR / "azr_7b.yaml") == (
        "24 proposals, <= 192 solver samples, 0 buffer solves; <= 216 trained rollouts, <= 1,748,736 generated tokens",
        "8 (4T + 4S adapters)",
    )
    assert budget(RECIPE_DIR / "nano_single_agent.yaml") == (
        "9 proposals, <= 54 solver samples, 0 buffer solves; <= 63 trained rollouts, <= 6,624 generated tokens",
        "1 (1 adapter in both roles)",
    )


@pytest.mark.parametrize("population,single", sorted(SINGLE_AGENT_OF.items()))
def test_single_agent_budget_equals_one_slot_of_its_population(population, single):
    """The paper's per-adapter compute-matched baseline: the single agent's step costs what one population
    adapter's share does (proposals, solver samples, buffer solves, trained rollouts, generated tokens)."""
    pop_budget, pop_slots = budget(RECIPE_DIR / f"{population}.yaml")
    single_budget, single_slots = budget(RECIPE_DIR / f"{single}.yaml")
    assert single_budget == pop_budget
    assert single_slots == "1 (1 adapter in both roles)" and "T + " in pop_slots
    raw = yaml.safe_load((RECIPE_DIR / f"{single}.yaml").read_text())
    assert raw["population"]["mode"] == "single_agent"


def test_every_7b_population_has_the_baselines_per_slot_budget():
    """populora_1t1s_7b, populora_8t8s_7b, the Coder and Llama recipes: the same per-slot budget as azr_7b,
    so single_agent_7b is their compute-matched baseline too."""
    reference, _ = budget(RECIPE_DIR / "azr_7b.yaml")
    for path in [*SEVEN_B, RECIPE_DIR / "azr_llama3.1_8b.yaml"]:
        assert budget(path)[0] == reference, path.name


def _without_threads(section):
    """A component section less its thread counts (parallel_batches, parallel_updates: never the results)."""
    if not isinstance(section, dict) or not isinstance(section.get("params"), dict):
        return section
    params = {k: v for k, v in section["params"].items() if k not in ("parallel_batches", "parallel_updates")}
    return {**section, "params": params}


@pytest.mark.parametrize(
    ("ray_recipe", "base"),
    [
        ("nano_ray", "nano"),
        ("azr_7b_ray_node", "azr_7b"),
        ("populora_8t8s_7b_ray_nodes", "populora_8t8s_7b"),
    ],
)
def test_ray_recipes_are_their_base_recipe_on_a_ray_cluster(ray_recipe, base, registry):
    """Where a run computes never changes what it computes: only the name, the cluster section and the thread
    counts differ (a worker has its own cores)."""
    on_ray = yaml.safe_load((RECIPE_DIR / f"{ray_recipe}.yaml").read_text())
    reference = yaml.safe_load((RECIPE_DIR / f"{base}.yaml").read_text())
    assert on_ray["cluster"]["name"] == "ray" and "cluster" not in reference
    for key in set(on_ray) | set(reference):
        if key not in ("name", "cluster"):
            assert _without_threads(on_ray.get(key)) == _without_threads(reference.get(key)), f"{ray_recipe}: {key}"
    model, _ = load_recipe(RECIPE_DIR / f"{ray_recipe}.yaml", [], registry)
    params = registry.get("cluster", "ray").parse_params(model.cluster.params)
    members = model.population.teachers + model.population.students
    assert members % params.workers == 0, "every worker should own the same number of members"


@pytest.mark.parametrize(
    ("long", "base"), [("nano_long", "nano_study"), ("nano_long_single_agent", "nano_single_agent")]
)
def test_long_study_recipes_are_the_study_recipes_run_longer(long, base):
    """The long study changes how many steps a run takes and how it is measured (the probe with power:
    600 problems, 8 samples each, which the quickstart cannot afford), so its arms compare as the short study's do."""
    longer = yaml.safe_load((RECIPE_DIR / f"{long}.yaml").read_text())
    reference = yaml.safe_load((RECIPE_DIR / f"{base}.yaml").read_text())
    differ = {k for k in set(longer) | set(reference) if longer.get(k) != reference.get(k)}
    assert differ == {"name", "steps", "probe"}
    assert longer["probe"] == {**reference["probe"], "problems_per_type": 200, "samples": 8, "temperature": 1.0}
    assert longer["steps"] == 120 > reference["steps"]


def test_the_study_recipe_is_the_quickstart_with_a_population_that_can_evolve(registry):
    """nano_study.yaml: nano.yaml's run at 4T-4S, at most a quarter of each role replaced per interval."""
    study = yaml.safe_load((RECIPE_DIR / "nano_study.yaml").read_text())
    quick = yaml.safe_load((RECIPE_DIR / "nano.yaml").read_text())
    differ = {k for k in set(study) | set(quick) if study.get(k) != quick.get(k)}
    assert differ == {"name", "population", "evolution", "matchmaker"}
    for name in ("nano_study", "nano_long"):
        model, _ = load_recipe(RECIPE_DIR / f"{name}.yaml", [], registry)
        assert min(model.population.teachers, model.population.students) >= 4
        assert model.evolution.selector.params["fraction"] <= 0.25
        assert model.evolution.child_rating == "widen" and model.evolution.readiness > model.evolution.every


EVOLVING = [p for p in RECIPES if "every: 0" not in p.read_text() and "single_agent" not in p.name]


@pytest.mark.parametrize("path", EVOLVING, ids=[p.name for p in EVOLVING])
def test_every_shipped_recipe_selects_rather_than_killing_the_newest_child(path):
    """The recipe's own matchmaker, selector, readiness and child rating on simulated members of equal skill:
    the youngest members die about as often as chance says (fresh children under mu - 3 sigma: ~95 %)."""
    from benchmarks.research.selection import measure, recipe_settings

    settings = recipe_settings(path)
    assert settings is not None
    settings.pop("key")
    result = measure({**settings, "steps": min(settings["steps"], 8 * settings["evolution"].every + 1)}, trials=6)
    assert result["youngest_share"] <= result["youngest_share_by_chance"] + 0.15, result
    assert result["survivor_change_share"] >= 0.3, result


def test_a_teacher_reward_out_of_range_is_a_recipe_error_naming_the_key(registry, tmp_path):
    from populora_core.api.errors import RecipeError

    with pytest.raises(RecipeError) as info:
        load_recipe(RECIPE_DIR / "nano.yaml", ["tasks.1.params.unsolved_reward=-2"], registry)
    assert "tasks.1.params.unsolved_reward: Input should be greater than or equal to -1" in str(info.value)
    assert "plugin populora_azr" in str(info.value) or "populora-azr" in str(info.value) or "azr" in str(info.value)
