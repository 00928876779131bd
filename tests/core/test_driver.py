"""``populora_core.cli.driver``, the public entry for scripts: each function is the core's own with the process's
plugin manager passed, and a misuse is the same user error the ``populora`` command gives. The benchmarks' quick
modes drive real runs through it (``tests/benchmarks``); these pin its contract without a model."""

import json

import pytest

from populora_core.api.errors import RecipeError, UserError
from populora_core.cli import driver
from populora_core.services.gpu import GIB
from tests.cli_helpers import REPO


def test_every_exported_name_exists_and_says_what_it_is():
    for name in set(driver.__all__) - {"MODEL_PHASES"}:  # a tuple of names
        assert (getattr(driver, name).__doc__ or "").strip(), name
    assert "generate_solve" in driver.MODEL_PHASES


def test_load_recipe_applies_overrides_and_returns_the_typed_recipe_and_what_a_run_writes():
    recipe, resolved = driver.load_recipe(REPO / "recipes" / "nano.yaml", ["steps=3", "seed=7"])
    assert (recipe.steps, recipe.seed) == (3, 7)
    assert (resolved["steps"], resolved["seed"]) == (3, 7)
    assert json.loads(json.dumps(resolved)) == resolved  # what start_run writes to the run directory


def test_load_recipe_errors_name_the_key_and_the_file(tmp_path):
    with pytest.raises(RecipeError, match="stepz"):
        driver.load_recipe(REPO / "recipes" / "nano.yaml", ["stepz=3"])
    with pytest.raises(UserError, match=r"missing\.yaml"):
        driver.load_recipe(tmp_path / "missing.yaml")


def test_plan_recipe_plans_a_7b_recipe_for_one_gpu(qwen7b):
    recipe, _ = driver.load_recipe(REPO / "recipes" / "azr_7b.yaml")
    big, small = (driver.plan_recipe(recipe, qwen7b, gpu_bytes=gib * GIB) for gib in (141, 8))
    assert big["fits"] and big["peak_gib"] <= 141
    assert not small["fits"] and small["peak_gib"] > 8


def test_events_reads_a_run_directorys_log_in_order(tmp_path):
    log = tmp_path / "run" / "events.jsonl"
    log.parent.mkdir()
    records = [{"event": "step", "step": i} for i in range(3)] + [{"event": "probe", "step": 2}]
    log.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert driver.events(tmp_path / "run") == records
