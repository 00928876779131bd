"""Plugin manager: entry points one by one, failures as rows, strict mode, selection, local files."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

import pytest

from populora_core import Params, hookimpl
from populora_core.api.components import UpdateJob
from populora_core.api.errors import PluginError
from populora_core.api.params import Component, NoParams
from populora_core.plugin.manager import PluginLoadWarning, PluginManager
from tests.cli_helpers import REPO, install_a_copy, invoke_cli, run_cli

TESTS = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory):
    """The example third-party plugin and a broken one, installed through real entry points."""
    root = tmp_path_factory.mktemp("site")
    install_a_copy(TESTS / "thirdparty_plugin", root)
    return install_a_copy(TESTS / "broken_plugin", root)


def _env(site: Path, **extra: str) -> dict[str, str]:
    return {"PYTHONPATH": os.pathsep.join([str(site), str(REPO)]), **extra}


def test_third_party_plugin_listed_with_components_and_hooks(plugin_site):
    result = run_cli("plugins", "--json", env=_env(plugin_site))
    assert result.returncode == 0, result.stderr
    rows = {r["name"]: r for r in json.loads(result.stdout)}
    example = rows["example_sink"]
    assert example["source"] == "populora-example-sink" and example["version"] == "0.3.0"
    assert example["components"] == ["sink:example_csv"]
    assert example["hooks"] == ["on_run_end", "register_sinks"]
    assert example["error"] is None
    # the built-in plugins register through the same entry-point group
    assert rows["matchmaking"]["source"] == "populora-toolkit"


def test_broken_plugin_warns_and_is_listed_but_cli_works(plugin_site):
    result = run_cli("plugins", env=_env(plugin_site))
    assert result.returncode == 0
    assert "broken_example (populora-broken-example 0.0.1) FAILED" in result.stdout
    assert "a_module_that_does_not_exist" in result.stdout
    assert "Warning: populora: plugin broken_example" in result.stderr
    assert "Traceback" not in result.stderr
    help_result = run_cli("--help", env=_env(plugin_site))
    assert help_result.returncode == 0 and "recipe-schema" in help_result.stdout


def test_a_registration_with_an_unknown_keyword_is_a_broken_plugin_row_naming_it(plugin_site):
    """``min_parent=`` for ``min_parents=``: refused when the plugin loads (not when a run first uses the
    operator), shown as a failed plugin, the CLI working."""
    result = run_cli("plugins", env=_env(plugin_site))
    assert result.returncode == 0 and "Traceback" not in result.stderr
    assert "misspelt_example (populora-broken-example 0.0.1) FAILED" in result.stdout
    assert "unknown keyword 'min_parent' (did you mean min_parents?)" in result.stdout
    rows = {r["name"]: r for r in json.loads(run_cli("plugins", "--json", env=_env(plugin_site)).stdout)}
    assert rows["misspelt_example"]["components"] == [] and "'min_parent'" in rows["misspelt_example"]["error"]


@pytest.mark.parametrize(
    ("keywords", "says"),
    [
        ({"min_parent": 1}, r"unknown keyword 'min_parent' \(did you mean min_parents\?\); operators take"),
        ({"parents": 2}, r"unknown keyword 'parents' \(did you mean min_parents\?\)"),  # plugin API 1's
        (
            {"min_parents": 1, "category": "code"},
            r"unknown keyword 'category'; operators take doctor, max_parents, min_parents besides",
        ),
        ({"min_parents": "two"}, r"register\(min_parents=\.\.\.\): Input should be a valid integer"),
        ({"max_parents": 2}, r"operator 'op' \(plugin typo\) does not declare how many parents it takes"),
        ({"min_parents": 3, "max_parents": 2}, r"operator 'op' \(plugin typo\): bad arity 3\.\.2"),
    ],
)
def test_registration_keywords_are_checked_when_the_plugin_loads(monkeypatch, keywords, says):
    class Plugin:
        @hookimpl
        def register_operators(self, register):
            register("op", lambda parents, params, generator: parents[0], **keywords)

    pm = PluginManager()
    with pytest.warns(PluginLoadWarning, match=rf"plugin typo \(local\) disabled: PluginError: .*{says}"):
        assert not pm.add_plugin(Plugin(), "typo")
    assert "op" not in pm.registry.names("operator") and pm.plugins["typo"].error  # a row, nothing registered
    monkeypatch.setenv("POPULORA_STRICT_PLUGINS", "1")
    with pytest.raises(PluginError, match=says):
        PluginManager().add_plugin(Plugin(), "typo")


def test_strict_mode_turns_a_broken_plugin_into_an_error(plugin_site):
    result = run_cli("plugins", env=_env(plugin_site, POPULORA_STRICT_PLUGINS="1"))
    assert result.returncode == 2
    assert "plugin broken_example (populora-broken-example)" in result.stderr
    assert "Traceback" not in result.stderr


def test_load_and_disable_env_vars_select_entry_points(plugin_site):
    only = json.loads(run_cli("plugins", "--json", env=_env(plugin_site, POPULORA_LOAD_PLUGINS="example_sink")).stdout)
    assert [r["name"] for r in only] == ["example_sink"]
    disabled = json.loads(
        run_cli(
            "plugins", "--json", env=_env(plugin_site, POPULORA_DISABLE_PLUGINS="broken_example,matchmaking")
        ).stdout
    )
    names = {r["name"] for r in disabled}
    assert "broken_example" not in names and "matchmaking" not in names and "example_sink" in names


def test_a_plugin_whose_declared_requirement_is_not_loaded_is_disabled_with_a_row():
    result = run_cli("plugins", "--json", env={"POPULORA_DISABLE_PLUGINS": "azr"})
    assert result.returncode == 0, result.stderr
    rows = {r["name"]: r for r in json.loads(result.stdout)}
    assert rows["nano"]["error"] == "needs plugin package(s) populora_azr, not loaded"
    assert rows["nano"]["components"] == [] and rows["engines"]["error"] is None
    assert "plugin nano (populora-toolkit) disabled" in result.stderr


def test_cli_startup_does_not_import_torch():
    code = (
        "import sys; from populora_core.plugin.manager import get_manager; get_manager(); "
        "import populora_core.cli.commands; heavy = [m for m in ('torch', 'transformers', 'vllm', 'trl', 'peft', "
        "'numba', 'llvmlite', 'ray', 'wandb', 'matplotlib') if m in sys.modules]; print(','.join(heavy))"
    )
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"plugins imported heavy libraries at load time: {out.stdout}"


def test_help_and_plugins_answer_fast():
    start = time.perf_counter()
    assert run_cli("--help").returncode == 0
    assert run_cli("plugins").returncode == 0
    # Generous bound (two cold process starts on a loaded 2-core box); the real figure is in the closing note.
    assert time.perf_counter() - start < 20


def test_misspelled_hookimpl_fails_loudly():
    class Typo:
        @hookimpl
        def register_operator(self, register):  # missing "s": no such hook
            pass

    pm = PluginManager()
    with pytest.warns(PluginLoadWarning, match="register_operator"):
        assert not pm.add_plugin(Typo(), "typo")
    assert pm.plugins["typo"].error and "register_operator" in pm.plugins["typo"].error
    os.environ["POPULORA_STRICT_PLUGINS"] = "1"
    try:
        with pytest.raises(PluginError, match="register_operator"):
            PluginManager().add_plugin(Typo(), "typo")
    finally:
        del os.environ["POPULORA_STRICT_PLUGINS"]


def test_duplicate_component_names_name_both_plugins():
    class P(Params):
        x: int = 1

    def make(name):
        class Plugin:
            @hookimpl
            def register_matchmakers(self, register):
                register("dup", lambda params: None, params=P)

        return Plugin()

    pm = PluginManager()
    assert pm.add_plugin(make("a"), "first")
    with pytest.warns(PluginLoadWarning, match="registered twice: by plugin first and by plugin second"):
        assert not pm.add_plugin(make("b"), "second")
    # the failed plugin left nothing behind and the first keeps its name
    assert pm.registry.get("matchmaker", "dup").plugin == "first"


def test_local_plugin_file_is_loaded_for_one_run(tmp_path):
    plugin = tmp_path / "my_local_plugin.py"
    plugin.write_text(
        "from populora_core import hookimpl\n"
        "@hookimpl\n"
        "def register_selectors(register):\n"
        "    def pick_nobody(params):\n"
        "        '''Never replaces anyone.'''\n"
        "    register('nobody', pick_nobody)\n"
    )
    result = invoke_cli("--plugin", str(plugin), "plugins", "--json")
    assert result.returncode == 0, result.stderr
    rows = {r["name"]: r for r in json.loads(result.stdout)}
    assert rows["file:my_local_plugin"]["components"] == ["selector:nobody"]
    missing = invoke_cli("--plugin", str(tmp_path / "nope.py"), "plugins")
    assert missing.returncode == 2 and "plugin file not found" in missing.stderr
    after = invoke_cli("plugins", "--json", "--plugin", str(plugin))  # typed after the command, as other CLIs allow
    assert after.returncode == 0, after.stderr
    assert {r["name"] for r in json.loads(after.stdout)} == set(rows)


@pytest.mark.parametrize(
    ("hook", "says"),
    [
        ("def after_reward(run, step, outcomes)", "unknown hook 'after_reward'.*did you mean after_rewards\\?"),
        ("def after_rewards(run, step, rewards, extra)", "after_rewards.*extra"),
    ],
)
def test_a_plugin_file_whose_hook_cannot_run_is_an_error_not_a_run_without_it(tmp_path, hook, says):
    """An installed plugin that fails is a warning (the CLI lives on); a file the user names is meant to act, so
    a misspelled hook or a wrong signature stops validate and run with exit 2 instead of starting without it."""
    plugin = tmp_path / "shaping.py"
    plugin.write_text(f"from populora_core import hookimpl\n@hookimpl\n{hook}:\n    pass\n")
    for command in (["validate", "recipes/nano.yaml"], ["run", "recipes/nano.yaml", "--run-dir", str(tmp_path / "r")]):
        result = invoke_cli("--plugin", str(plugin), *command)
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
        assert re.search(f"plugin file {plugin}: .*{says}", result.stderr), result.stderr
    assert not (tmp_path / "r").exists()


class EveryKind:
    """Registers one component of every kind, to pin each register_* hook and its provenance."""

    @hookimpl
    def register_tasks(self, register):
        register("k_task", lambda params, *, executor, rng: None)

    @hookimpl
    def register_executors(self, register):
        register("k_executor", lambda params: None)

    @hookimpl
    def register_trainers(self, register):
        register("k_trainer", lambda params, *, base_model, lora, seed: None)

    @hookimpl
    def register_engines(self, register):
        register("k_engine", lambda params, *, base_model, lora, seed: None)

    @hookimpl
    def register_matchmakers(self, register):
        register("k_matchmaker", lambda params: None)

    @hookimpl
    def register_selectors(self, register):
        register("k_selector", lambda params: None)

    @hookimpl
    def register_operators(self, register):
        def k_operator(parents, params, generator):
            """Identity."""
            return parents[0]

        register("k_operator", k_operator, min_parents=1, max_parents=1)

    @hookimpl
    def register_evaluators(self, register):
        register("k_evaluator", lambda params: None, description="an evaluator")

    @hookimpl
    def register_base_models(self, register):
        register("k_base_model", lambda params: None)

    @hookimpl
    def register_sinks(self, register):
        register("k_sink", lambda params, *, run_dir: None)

    @hookimpl
    def register_clusters(self, register):
        register("k_cluster", lambda params, *, run_dir: None)


def test_every_register_hook_records_name_plugin_version_and_params():
    from populora_core.api.params import NoParams
    from populora_core.plugin.registry import KINDS

    pm = PluginManager()
    assert pm.add_plugin(EveryKind(), "every-kind", source="tests", version="9.9")
    for kind in KINDS:
        comp = pm.registry.get(kind, f"k_{kind}")
        assert (comp.plugin, comp.version, comp.params_model) == ("every-kind", "9.9", NoParams)
    assert pm.registry.get("operator", "k_operator").meta == {"min_parents": 1, "max_parents": 1}
    assert pm.registry.get("operator", "k_operator").description == "Identity."
    assert pm.registry.get("evaluator", "k_evaluator").description == "an evaluator"
    assert len(pm.plugins["every-kind"].hooks) == len(KINDS)


def test_register_commands_adds_a_subcommand(tmp_path):
    plugin = tmp_path / "hello_cmd.py"
    plugin.write_text(
        "from populora_core import hookimpl\n"
        "@hookimpl\n"
        "def register_commands(cli):\n"
        "    @cli.command()\n"
        "    def hello():\n"
        "        '''Say hello.'''\n"
        "        print('hello from a plugin')\n"
    )
    result = run_cli("--plugin", str(plugin), "hello")
    assert result.returncode == 0 and result.stdout.strip() == "hello from a plugin"
    assert "Say hello." in run_cli("--plugin", str(plugin), "--help").stdout


def test_package_module_attr_reference_resolves_an_unregistered_component():
    from populora_core.plugin.registry import Registry

    comp = Registry().get("matchmaker", "tests.fake_stack:FakeEngine")
    assert comp.factory.__name__ == "FakeEngine" and comp.plugin == "tests.fake_stack"
    with pytest.raises(Exception, match=r"cannot import matchmaker 'tests\.nope:X'"):
        Registry().get("matchmaker", "tests.nope:X")


def test_third_party_plugin_is_usable_from_a_recipe(plugin_site, tiny_model_dir, tmp_path):
    run_dir = tmp_path / "run"
    recipe = TESTS / "recipes" / "fake_2t2s.yaml"
    result = run_cli(
        "--plugin",
        str(TESTS / "fake_stack.py"),
        "run",
        str(recipe),
        "steps=2",
        "sinks=[{name: example_csv, params: {keys: [step, solve_rate]}}]",
        "--run-dir",
        str(run_dir),
        "--no-progress",
        env=_env(plugin_site, POPULORA_TEST_MODEL=str(tiny_model_dir)),
    )
    assert result.returncode == 0, result.stderr
    rows = (run_dir / "metrics.csv").read_text().splitlines()
    assert rows[0] == "step,solve_rate" and [r.split(",")[0] for r in rows[1:]] == ["1", "2"]
    assert (run_dir / "example_sink_status.txt").read_text() == "completed"  # its on_run_end hook ran
    bad = run_cli(
        "--plugin",
        str(TESTS / "fake_stack.py"),
        "validate",
        str(recipe),
        "sinks=[{name: example_csv, params: {colour: red}}]",
        env=_env(plugin_site),
    )
    assert bad.returncode == 2
    assert "(component sink 'example_csv' from plugin example_sink): sinks.0.params.colour: unknown key" in bad.stderr


def test_a_component_missing_a_protocol_member_is_an_error_naming_it_before_the_run(tmp_path):
    """Optional capabilities are Protocol members with defaults (a component subclasses its Protocol); one built
    without subclassing and without a member is refused when the run is built, not in its first step."""
    from populora_core.api.components import RolloutEngine, Trainer
    from populora_core.run.assembly import check_implements

    class Bare:
        def update(self, member_id, adapter, rollouts, out_dir):
            raise NotImplementedError

    with pytest.raises(PluginError, match=r"trainer 'bare' \(Bare\) lacks .*update_many.*subclass populora_core"):
        check_implements(Bare(), Trainer, "trainer", "bare")

    class Subclassed(Trainer):
        def update(self, member_id, adapter, rollouts, out_dir):
            return member_id

        def copy_state(self, source_member, target_member): ...

        def forget(self, member_id): ...

        def save_state(self, directory): ...

        def load_state(self, directory): ...

    check_implements(Subclassed(), Trainer, "trainer", "subclassed")  # the defaults fill in the optional members
    trainer = Subclassed()
    assert not trainer.needs_sampling_logprobs
    jobs = [UpdateJob(m, None, [], tmp_path) for m in ("a", "b")]  # type: ignore[arg-type]
    assert trainer.update_many(jobs) == ["a", "b"]  # the default: update per member, in job order

    class Engine(RolloutEngine):
        def generate(self, requests, sampling):
            return []

        def sleep(self): ...

    assert not Engine().row_seeded and Engine().served_dtype is None and Engine().close() is None


def test_plugins_shows_each_operators_parents_as_its_registration_declares():
    """An operator's arity is stated once, at registration; ``populora plugins`` shows that statement."""
    from populora_core.api.operators import arity_text, operator_arity

    result = run_cli("plugins", "--json")
    assert result.returncode == 0, result.stderr
    listed = {r["name"]: r["operator_parents"] for r in json.loads(result.stdout)}
    installed = PluginManager()  # what the CLI's fresh process loads (this process may hold other tests' files)
    installed.load_entry_points()
    registered = [c for c in installed.registry if c.kind == "operator"]
    assert {c.name for c in registered} >= {"svd", "gaussian", "extrapolate"}
    for component in registered:
        low, high = operator_arity(component)
        assert listed[component.plugin][component.name] == {
            "min_parents": low,
            "max_parents": high,
            "text": arity_text(component),
        }
    assert listed["lora_ops"]["svd"]["text"] == "2 or more" and listed["lora_ops"]["gaussian"]["text"] == "exactly 1"
    text = run_cli("plugins").stdout
    assert "operator parents: clone exactly 1, " in text and "extrapolate exactly 2" in text


def test_a_task_factory_is_handed_only_the_run_context_it_declares():
    """The run builds every task with ``executor``, ``rng`` and ``tasks``: a factory naming ``params`` alone, one
    naming some of them and one taking ``**kwargs`` are each handed what they declare, nothing more."""
    seen: dict[str, Any] = {}

    def only_params(params):
        seen["only_params"] = params

    def some(params, *, rng):
        seen["some"] = rng

    def every(params, **context):
        seen["every"] = sorted(context)

    context = {"executor": object(), "rng": 7, "tasks": {}}
    for factory in (only_params, some, every):
        Component("task", factory.__name__, factory, NoParams, "p", "0").build(None, **context)
    assert isinstance(seen["only_params"], NoParams) and seen["some"] == 7
    assert seen["every"] == ["executor", "rng", "tasks"]
