"""The core's cluster seam on the fake stack: a recipe ``cluster`` builds the engine and trainer, the loop hands a
trainer with ``update_many`` the whole step, the cluster is closed with the run, and resume may move a run
between clusters (nothing else of the recipe may change)."""

from __future__ import annotations

import os
from typing import Any, ClassVar

import pytest
import yaml

from populora_core import Params, RecipeError, UserError, hookimpl
from populora_core.api.components import Cluster
from populora_core.recipe.validate import load_recipe
from populora_core.run.loop import execute, resume_run, start_run
from populora_core.run.run_dir import RunDir
from tests.cli_helpers import (
    FAKE_RECIPE,
    FAKE_STACK,
    adapter_hashes,
    as_if_killed_after,
    fake_stack_manager,
    run_in_process,
)


@pytest.fixture()
def env(tiny_model_dir, monkeypatch):
    monkeypatch.setenv("POPULORA_TEST_MODEL", str(tiny_model_dir))
    return {**os.environ, "POPULORA_TEST_MODEL": str(tiny_model_dir), "HF_HUB_OFFLINE": "1"}


class InProcessParams(Params):
    fail: bool = False  # the cluster cannot start (an unreachable address, say)


class InProcessCluster(Cluster):
    """Builds the components in this process and wraps the trainer with ``update_many``: what the seam asks."""

    opened: ClassVar[list[InProcessCluster]] = []

    def __init__(self, params: InProcessParams, *, run_dir: Any, plugin_files: list[str]) -> None:
        if params.fail:
            raise UserError("cluster.params.fail: this cluster cannot start")
        self.run_dir, self.plugin_files = run_dir, plugin_files
        self.batches: list[list[str]] = []
        self.closed = 0
        self.registry: Any = None
        InProcessCluster.opened.append(self)

    def engine(self, name: str, params: dict[str, Any], context: dict[str, Any]) -> Any:
        return self.registry.get("engine", name).build(params, **context)

    def trainer(self, name: str, params: dict[str, Any], context: dict[str, Any]) -> Any:
        inner = self.registry.get("trainer", name).build(params, **context)
        cluster = self

        class ManyAtOnce:
            needs_sampling_logprobs = inner.needs_sampling_logprobs

            def update_many(self, jobs):
                cluster.batches.append([j.member_id for j in jobs])
                return [inner.update(j.member_id, j.adapter, j.rollouts, j.out_dir) for j in jobs]

            def __getattr__(self, attr):
                return getattr(inner, attr)

        return ManyAtOnce()

    def close(self) -> None:
        self.closed += 1


class ClusterPlugin:
    def __init__(self) -> None:
        self.manager: Any = None

    @hookimpl
    def register_clusters(self, register):
        plugin = self

        def factory(params: InProcessParams, *, run_dir: Any, plugin_files: list[str]) -> InProcessCluster:
            cluster = InProcessCluster(params, run_dir=run_dir, plugin_files=plugin_files)
            cluster.registry = plugin.manager.registry
            return cluster

        register("in_process", factory, params=InProcessParams)


def _manager_with_cluster():
    plugin = ClusterPlugin()
    pm = fake_stack_manager(plugin)
    plugin.manager = pm
    return pm


def test_a_cluster_builds_the_components_and_gets_every_update_of_a_step_at_once(env, tmp_path):
    pm = _manager_with_cluster()
    InProcessCluster.opened.clear()
    local = run_in_process(pm, tmp_path / "local", ["steps=3"])
    clustered = run_in_process(pm, tmp_path / "cluster", ["steps=3", "cluster=in_process"])
    (cluster,) = InProcessCluster.opened
    assert cluster.closed == 1
    assert cluster.plugin_files == [str(FAKE_STACK)]  # the fake stack's --plugin file
    assert len(cluster.batches) == 3 and all(sorted(b) == sorted(set(b)) and len(b) == 4 for b in cluster.batches)
    assert adapter_hashes(local.path) == adapter_hashes(clustered.path)
    assert (local.path / "lineage.jsonl").read_text() == (clustered.path / "lineage.jsonl").read_text()
    assert yaml.safe_load((clustered.path / "recipe.yaml").read_text())["cluster"] == {
        "name": "in_process",
        "params": {},
    }


def test_resume_moves_a_run_to_another_cluster_and_only_the_cluster_may_change(env, tmp_path):
    pm = _manager_with_cluster()
    reference = run_in_process(pm, tmp_path / "reference", ["steps=4"])
    moved = run_in_process(pm, tmp_path / "moved", ["steps=4", "cluster=in_process"])
    as_if_killed_after(moved.path, 3)
    with pytest.raises(UserError, match="only the cluster section and steps may change"):
        resume_run(moved, pm, ("seed=9",))
    run = resume_run(moved, pm, ("cluster=local",))
    assert run.step == 3 and run.components.cluster is None
    execute(run)
    assert yaml.safe_load((moved.path / "recipe.yaml").read_text())["cluster"] == {"name": "local", "params": {}}
    assert adapter_hashes(moved.path) == adapter_hashes(reference.path)
    assert (moved.path / "lineage.jsonl").read_text() == (reference.path / "lineage.jsonl").read_text()


def test_cluster_settings_errors_and_a_failed_start_leaves_no_run_directory(env, tmp_path):
    pm = _manager_with_cluster()
    with pytest.raises(RecipeError, match=r"cluster 'local' .* takes no params"):
        load_recipe(FAKE_RECIPE, ["cluster=local", "cluster.params.workers=2"], pm.registry)
    with pytest.raises(RecipeError, match="unknown cluster 'nowhere'"):
        load_recipe(FAKE_RECIPE, ["cluster=nowhere"], pm.registry)
    recipe, resolved = load_recipe(FAKE_RECIPE, ["cluster=in_process", "cluster.params.fail=true"], pm.registry)
    with pytest.raises(UserError, match=r"cluster\.params\.fail"):
        start_run(recipe, resolved, RunDir(tmp_path / "never"), pm)
    assert not (tmp_path / "never").exists()
