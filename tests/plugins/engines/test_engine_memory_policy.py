"""vLLM's memory settings chosen by the plan: ``engine.params.sleep: auto`` and ``gpu_memory_utilization: auto``.

The plan tries the engine's preferences in order (awake before asleep, the largest GPU share first) and keeps the
first whose peak leaves ``AUTO_MARGIN`` of the GPU free; ``populora run`` on a GPU builds the engine with that
choice (written to run.log), the CPU keeps ``auto`` (it means nothing there), and a GPU engine still given ``auto``
refuses to start rather than guess.
"""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import pytest

from populora_core.api.errors import UserError
from populora_core.api.memory import AUTO_MARGIN
from populora_core.run.plan import plan_recipe
from populora_core.services.gpu import GIB
from tests.cli_helpers import REPO

QWEN7B = REPO / "recipes" / "configs" / "Qwen__Qwen2.5-7B.json"


@pytest.fixture(scope="module")
def manager(plugins):
    return plugins


def _azr(manager, *overrides):
    from populora_core.recipe.validate import load_recipe

    return load_recipe(REPO / "recipes" / "azr_7b.yaml", list(overrides), manager.registry)


def _plan(manager, qwen7b, gib, *overrides):
    return plan_recipe(_azr(manager, *overrides)[0], qwen7b, gpu_bytes=gib * GIB, registry=manager.registry)


def _explicit(manager, qwen7b, gib, sleep, util):
    util_text = f"{util:.2f}"
    return _plan(
        manager, qwen7b, gib, f"engine.params.sleep={sleep}", f"engine.params.gpu_memory_utilization={util_text}"
    )


def test_the_recipes_leave_both_settings_to_the_plan(manager):
    vllm_recipes = [r for r in sorted((REPO / "recipes").glob("*.yaml")) if "name: vllm" in r.read_text()]
    assert len(vllm_recipes) >= 8
    for recipe in vllm_recipes:
        text = recipe.read_text()
        assert "enable_sleep_mode" not in text, recipe.name
        assert "sleep: auto" in text and "gpu_memory_utilization: auto" in text, recipe.name
    params = _azr(manager)[0].engine.build_params()
    assert (params.sleep, params.gpu_memory_utilization) == ("auto", "auto")


def test_an_h200_keeps_vllm_awake_with_the_largest_share_that_leaves_the_margin(manager, qwen7b):
    plan = _plan(manager, qwen7b, 141)
    chosen = plan["auto"]
    assert chosen["engine.params.sleep"] == "never"
    util = chosen["engine.params.gpu_memory_utilization"]
    assert plan["fits"] and plan["peak_gib"] <= (1 - AUTO_MARGIN) * 141
    # the largest: one step more leaves less than the margin, and the explicit settings plan the same peak
    more = _explicit(manager, qwen7b, 141, "never", util + 0.01)
    assert more["peak_gib"] > (1 - AUTO_MARGIN) * 141
    assert _explicit(manager, qwen7b, 141, "never", util)["peak_gib"] == plan["peak_gib"]
    assert "auto -> never" in plan["notes"][0] and f"auto -> {util:.2f}" in plan["notes"][0]
    # the KV cache is larger than the 0.45 the recipes used to set, asleep
    kv = {r["what"]: r["gib"] for r in plan["rows"]}["vLLM KV cache"]
    old = {r["what"]: r["gib"] for r in _explicit(manager, qwen7b, 141, "always", 0.45)["rows"]}["vLLM KV cache"]
    assert kv > old


def test_sleeps_only_where_engine_and_trainer_do_not_fit_together(manager, qwen7b):
    # 48 GiB: awake, no share leaves one 16k sequence of KV cache beside the trainer's peak; asleep, one does
    plan = _plan(manager, qwen7b, 48)
    assert plan["auto"]["engine.params.sleep"] == "always" and plan["fits"]
    for util in [u / 100 for u in range(10, 96)]:
        awake = _explicit(manager, qwen7b, 48, "never", util)
        assert not awake["fits"] or awake["peak_gib"] > (1 - AUTO_MARGIN) * 48
    # sleep given, the share still chosen
    given = _plan(manager, qwen7b, 141, "engine.params.sleep=always")
    assert list(given["auto"]) == ["engine.params.gpu_memory_utilization"]
    assert given["auto"]["engine.params.gpu_memory_utilization"] > plan["auto"]["engine.params.gpu_memory_utilization"]


def test_no_choice_fits_is_a_verdict_that_says_so(manager, qwen7b):
    plan = _plan(manager, qwen7b, 24)  # two 7B copies (vLLM's and the trainer's) alone exceed 24 GiB
    assert not plan["fits"] and plan["verdict"].startswith("does not fit")
    assert "(no choice fits)" in plan["notes"][0]


def test_engine_params_refuse_the_removed_sleep_key(manager):
    component = manager.registry.get("engine", "vllm")
    with pytest.raises(Exception, match="enable_sleep_mode"):  # sleep: always|never|auto replaced it (CHANGELOG)
        component.parse_params({"enable_sleep_mode": True})
    with pytest.raises(Exception, match="gpu_memory_utilization"):
        component.parse_params({"gpu_memory_utilization": 1.5})


def test_a_gpu_engine_given_auto_refuses_to_guess(manager):
    from populora_engines.vllm_engine import _check_planned

    component = manager.registry.get("engine", "vllm")
    _check_planned(component.parse_params({"sleep": "never", "gpu_memory_utilization": 0.5}))
    with pytest.raises(UserError, match=r"engine.params.sleep: auto .* none reached it; set engine.params.sleep and"):
        _check_planned(component.parse_params({}))


class _GPUCluster:
    def __init__(self, gpu_bytes):
        self._bytes = gpu_bytes

    def gpu_bytes(self):
        return self._bytes


@pytest.fixture
def run_dir(tmp_path):
    from populora_core.run.run_dir import RunDir

    return RunDir(tmp_path / "run")


def _base(tmp_path: Path):
    from populora_core.api.components import BaseModel

    folder = tmp_path / "qwen7b"
    folder.mkdir(parents=True)
    shutil.copy(QWEN7B, folder / "config.json")
    return BaseModel(name="Qwen/Qwen2.5-7B", path=str(folder), dtype="bfloat16")


def test_run_builds_the_engine_with_the_plans_choice_for_its_gpu(manager, qwen7b, tmp_path, run_dir):
    from populora_core.run.assembly import planned_engine_params

    run_dir.path.mkdir(parents=True)
    model, _ = _azr(manager)
    params, _ = planned_engine_params(model, manager.registry, _base(tmp_path), _GPUCluster(80 * GIB), run_dir)
    planned = _plan(manager, qwen7b, 80)["auto"]
    assert params.sleep == planned["engine.params.sleep"]
    assert params.gpu_memory_utilization == planned["engine.params.gpu_memory_utilization"]
    log = (run_dir.path / "run.log").read_text()
    assert "plan: engine.params.sleep: auto -> " in log and "fits: peak" in log
    # no GPU (this machine, or a cluster of CPU workers): auto stays, the CPU engine ignores it
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kept, _ = planned_engine_params(model, manager.registry, _base(tmp_path / "b"), _GPUCluster(None), run_dir)
    assert (kept.sleep, kept.gpu_memory_utilization) == ("auto", "auto")
    # a GPU the recipe does not fit: the run's plan says so, once, as a warning
    with pytest.warns(UserWarning, match="populora plan: does not fit"):
        planned_engine_params(model, manager.registry, _base(tmp_path / "d"), _GPUCluster(24 * GIB), run_dir)
    # no plan can be made (no config.json): the params as written, and the vLLM engine on a GPU then refuses auto
    bare = tmp_path / "no-config"
    bare.mkdir()
    from populora_core.api.components import BaseModel

    unplanned, why = planned_engine_params(
        model, manager.registry, BaseModel(str(bare)), _GPUCluster(80 * GIB), run_dir
    )
    assert (unplanned.sleep, unplanned.gpu_memory_utilization) == ("auto", "auto")
    assert why is not None and "config.json" in why
    assert "plan: not made" in (run_dir.path / "run.log").read_text()
    # explicit settings are used as written, without a plan
    fixed, _ = _azr(manager, "engine.params.sleep=always", "engine.params.gpu_memory_utilization=0.45")
    same, _ = planned_engine_params(fixed, manager.registry, _base(tmp_path / "c"), _GPUCluster(80 * GIB), run_dir)
    assert (same.sleep, same.gpu_memory_utilization) == ("always", 0.45)
