"""Recipes: two-pass validation, each kind of error message, overrides, JSON Schema."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from populora_core.api.errors import RecipeError, UserError
from populora_core.recipe.keys import recipe_json_schema
from populora_core.recipe.overrides import apply_overrides
from populora_core.recipe.validate import load_recipe
from tests.cli_helpers import fake_stack_manager, invoke_cli, run_cli

TESTS = Path(__file__).resolve().parents[1]
FAKE = str(TESTS / "fake_stack.py")


@pytest.fixture()
def manager():
    return fake_stack_manager()


def _write(tmp_path: Path, data: dict, name: str = "r.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def _base() -> dict:
    return yaml.safe_load((TESTS / "recipes" / "fake_2t2s.yaml").read_text())


def test_valid_recipe_and_overrides(manager, tmp_path):
    path = _write(tmp_path, _base())
    model, resolved = load_recipe(
        path, ["steps=9", "evolution.selector.params.keep=0.25", "engine.params.delay_s=0.5"], manager.registry
    )
    assert model.steps == 9 and model.evolution.selector.params == {"keep": 0.25, "mutate": 0.5}
    assert resolved["engine"] == {"name": "fake", "params": {"delay_s": 0.5}}


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda d: d.update(stepz=3), "stepz: unknown key (did you mean steps?)"),
        (
            lambda d: d["rollout"].update(solver_sample=3),
            "rollout.solver_sample: unknown key (did you mean solver_samples?)",
        ),
        (
            lambda d: d["evolution"]["selector"].update(zzz=1),
            "evolution.selector.zzz: unknown key (known: name, params)",
        ),
        (
            lambda d: d["population"].update(teachers=0),
            "population.teachers: Input should be greater than or equal to 1",
        ),
        (lambda d: d.update(engine="warp"), "at 'engine.name': unknown engine 'warp'"),
        (
            lambda d: d.update(trainer={"name": "fake", "params": {"lr": "fast"}}),
            "trainer.params.lr: Input should be a valid number",
        ),
        (
            lambda d: d.update(trainer={"name": "fake", "params": {"learning_rate": 1}}),
            "(component trainer 'fake' from plugin file:fake_stack): trainer.params.learning_rate: unknown key",
        ),
        (
            lambda d: d["evolution"]["operators"].append({"name": "test_noise", "params": {"std": -1}}),
            "evolution.operators.2.params.std: Input should be greater than 0",
        ),
        (lambda d: d.update(tasks=[]), "tasks: List should have at least 1 item"),
        (
            lambda d: d.update(population={"teachers": 2, "students": 3, "mode": "single_agent"}),
            "single_agent mode needs teachers == students",
        ),
        # evolution settings under which selection cannot select
        (  # a fraction that replaces everyone
            lambda d: d["evolution"].update(selector={"name": "truncation", "params": {"fraction": 1.0}}),
            "evolution.selector.params.fraction: Input should be less than 1",
        ),
        (  # 2 per role, 1 replaced: one survivor, one lineage after every selection
            lambda d: d["evolution"].update(selector={"name": "truncation", "params": {"fraction": 0.5}}),
            "selector 'truncation' with {'fraction': 0.5} replaces 1 of the 2 teachers at each selection and keeps "
            "1 line(s): the teachers would fall back to one lineage every time",
        ),
        (  # 5 steps, every 2: the last replacement is at step 4, a student has played at most 2 x 4 matches by then
            lambda d: d["evolution"].update(ready_after=9),
            "evolution.ready_after is 9 rated matches but the last replacement happens at step 4 (every 2, 5 steps), "
            "when a member has played at most 8",
        ),
        (
            lambda d: d.update(population={"teachers": 1, "students": 1}),
            "evolution.every is 2 but no sub-population",
        ),
    ],
)
def test_recipe_errors_name_file_path_component_and_plugin(manager, tmp_path, mutate, expected):
    data = _base()
    mutate(data)
    path = _write(tmp_path, data)
    with pytest.raises(RecipeError) as info:
        load_recipe(path, [], manager.registry)
    message = str(info.value)
    assert message.startswith(str(path)), message
    assert expected in message, message


def test_yaml_syntax_missing_file_and_bad_override(manager, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nsteps: [1, 2\n")
    with pytest.raises(RecipeError, match="not valid YAML"):
        load_recipe(bad, [], manager.registry)
    with pytest.raises(UserError, match="recipe not found"):
        load_recipe(tmp_path / "missing.yaml", [], manager.registry)
    with pytest.raises(RecipeError, match=r"is not key\.sub=value"):
        apply_overrides({}, ["steps"])
    with pytest.raises(RecipeError, match="no list item '7'"):
        apply_overrides({"tasks": ["a"]}, ["tasks.7=b"])


def test_overrides_on_the_typed_recipe_validate_what_they_change_and_share_the_rest():
    """What ``populora plan`` tries (``override_model``): the same ``key=value`` words as the command line's, each
    model on the path validated again, the sections it set and the override did not touch the same objects, what
    the recipe left unset still unset."""
    from pydantic import ValidationError

    from populora_core.api.schema import Recipe
    from populora_core.recipe.overrides import override_model

    recipe = Recipe.model_validate(
        {"name": "r", "steps": 2, "base_model": "nano", "engine": {"name": "vllm", "params": {"sleep": "auto"}}}
    )
    changed = override_model(
        recipe,
        [
            "rollout.solver_samples=2",
            "engine.params.sleep=always",
            'trainer.params.gradient_checkpointing="on"',  # quoted: YAML reads on as true
            "evolution.operators.1.weight=3",
        ],
    )
    assert changed.rollout.solver_samples == 2 and recipe.rollout.solver_samples == 8
    assert changed.engine.params == {"sleep": "always"} and recipe.engine.params == {"sleep": "auto"}
    assert changed.trainer.params == {"gradient_checkpointing": "on"}
    assert [o.weight for o in changed.evolution.operators] == [0.5, 3.0]
    assert changed.base_model is recipe.base_model and changed.lora == recipe.lora  # set: shared; unset: default
    assert "adapters" not in changed.model_fields_set and "keep" not in changed.adapters.model_fields_set
    with pytest.raises(ValidationError, match="solver_samples"):
        override_model(recipe, ["rollout.solver_samples=0"])
    with pytest.raises(RecipeError, match="no list item '7'"):
        override_model(recipe, ["evolution.operators.7.weight=1"])


def test_cli_validate_exits_2_without_traceback(tmp_path):
    data = _base()
    data["trainer"] = {"name": "fake", "params": {"lr": "fast"}}
    path = _write(tmp_path, data)
    result = run_cli("--plugin", FAKE, "validate", str(path))  # the console script itself, in a process
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert f"Error: {path}" in result.stderr and "trainer.params.lr" in result.stderr
    ok = invoke_cli("--plugin", FAKE, "validate", str(_write(tmp_path, _base(), "good.yaml")))
    assert ok.returncode == 0 and "ok (fake-2t2s, 2T-2S population" in ok.stdout
    override = invoke_cli("--plugin", FAKE, "validate", str(path), "trainer.params.lr=0.5")
    assert override.returncode == 0, override.stderr


def test_recipe_schema_includes_plugin_params(manager):
    schema = recipe_json_schema(manager.registry)
    components = schema["x-populora-components"]
    assert components["trainer"]["fake"]["properties"]["lr"]["type"] == "number"
    assert "pfsp" in components["matchmaker"]
    names = [o["properties"]["name"]["const"] for o in schema["properties"]["engine"]["anyOf"] if "properties" in o]
    assert "fake" in names
    result = invoke_cli("--plugin", FAKE, "recipe-schema")
    assert (
        result.returncode == 0
        and "weighting" in json.loads(result.stdout)["x-populora-components"]["matchmaker"]["pfsp"]["properties"]
    )


def test_a_key_given_twice_in_a_recipe_is_an_error_naming_both_lines(tmp_path):
    """PyYAML keeps the last of two equal keys silently; a recipe's second `trainer:` must not quietly win."""
    recipe = tmp_path / "twice.yaml"
    recipe.write_text("name: x\ntrainer:\n  name: trr++\n  params: {lr: 1.0e-3, lr: 2.0e-3}\n")
    with pytest.raises(RecipeError, match=r"key 'lr' appears twice in one mapping \(lines 4 and 4\)"):
        load_recipe(recipe)
    recipe.write_text("name: x\nsteps: 3\nseed: 1\nsteps: 4\n")
    with pytest.raises(RecipeError, match=r"twice\.yaml.*key 'steps' appears twice in one mapping \(lines 2 and 4\)"):
        load_recipe(recipe)


def test_a_misspelled_base_model_is_a_recipe_error_with_the_registered_name(tmp_path):
    """`nanoo` used to validate and then, at run time, get advice to download `nanoo` from the hub."""
    bad = invoke_cli("validate", "recipes/nano.yaml", "base_model=nanoo")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "base_model.name" in bad.stderr and "did you mean 'nano'?" in bad.stderr
    for fine in ("Qwen/Qwen2.5-7B", str(tmp_path)):  # a hub id, a local directory: resolved when the run starts
        assert invoke_cli("validate", "recipes/nano.yaml", f"base_model={fine}").returncode == 0


def test_population_settings_that_leave_one_line_or_replace_everyone_are_exit_2_naming_the_key():
    """A role that keeps one survivor falls back to one lineage at every selection; a fraction of 1 replaces all."""
    one_line = invoke_cli("validate", "recipes/nano_study.yaml", "population.students=2")
    assert one_line.returncode == 2 and "Traceback" not in one_line.stderr
    assert "at 'evolution.selector.params'" in one_line.stderr and "1 of the 2 students" in one_line.stderr
    everyone = invoke_cli("validate", "recipes/nano_study.yaml", "evolution.selector.params.fraction=1.0")
    assert everyone.returncode == 2 and "Traceback" not in everyone.stderr
    assert "evolution.selector.params.fraction: Input should be less than 1" in everyone.stderr


def test_keys_lists_every_recipe_key_with_its_default_and_each_components_params():
    """`populora keys` is the readable reference: generated from the models, so no key can be missing."""
    from populora_core.api.schema import Recipe
    from populora_core.recipe.keys import model_keys

    every = invoke_cli("keys")
    assert every.returncode == 0, every.stderr
    listed = {line.split()[0] for line in every.stdout.splitlines() if line and not line.startswith(" ")}
    assert {key for key, *_ in model_keys(Recipe)} <= listed
    assert "evolution.child_rating" in listed and "runtime.cpu_isa" in listed
    rollout = invoke_cli("keys", "rollout").stdout
    assert "rollout.solver_samples" in rollout and "int  default 8" in rollout and "lora.rank" not in rollout
    trainers = invoke_cli("keys", "trainer").stdout
    assert "trainer trr++ (plugin trainers)" in trainers and "trainer grpo (plugin trainers)" in trainers
    trr = invoke_cli("keys", "trr++").stdout
    assert "params.lr " in trr and "AdamW learning rate" in trr and "params.parallel_updates" in trr
    typo = invoke_cli("keys", "rolout")
    assert typo.returncode == 2 and "did you mean 'rollout'?" in typo.stderr and "Traceback" not in typo.stderr


def test_dry_run_prints_the_resolved_recipe_and_its_plan_and_writes_nothing(tmp_path):
    """`populora run --dry-run`: every default filled in (what recipe.yaml of the run would hold), the plan, no run."""
    run_dir = tmp_path / "would-be"
    recipe = TESTS.parent / "recipes" / "nano.yaml"
    dry = invoke_cli("run", str(recipe), "steps=3", "trainer.params.lr=2.0e-4", "--run-dir", str(run_dir), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    header, _, rest = dry.stdout.partition("\n")
    assert f"-> {run_dir} (dry run" in header
    resolved_text, _, plan = rest.partition("# plan (populora plan)")
    resolved = yaml.safe_load(resolved_text)
    assert resolved["steps"] == 3 and resolved["trainer"]["params"]["lr"] == 2.0e-4
    assert resolved["runtime"] == {"cpu_isa": "avx2", "threads": 1}  # defaults appear too
    assert resolved["rollout"]["solver_samples"] == load_recipe(recipe)[0].rollout.solver_samples
    assert not run_dir.exists()
    # no GPU here, so no GPU terms: the run would use the CPU; the disk it needs and the command to plan a GPU stay
    assert "runs on the CPU here" in plan and f"populora plan {recipe} --gpu-memory 80GiB" in plan
    assert "# disk:" in plan and "GiB  detail" not in plan and "AdamW" not in plan
    # the output, not the process, is checked from here on: in this process (a fresh one imports torch, ~5 s each)
    gpu = invoke_cli("run", str(recipe), "engine.params.device=cuda", "--dry-run")  # a GPU recipe: its plan
    assert gpu.returncode == 0 and "# fits: peak" in gpu.stdout and "trainer AdamW moments" in gpu.stdout, gpu.stderr
    # the quickstart, the README and a bare `populora run recipes/nano.yaml` use one directory: runs/nano
    assert (
        "populora run recipes/nano.yaml -> runs/nano (dry run"
        in invoke_cli("run", "recipes/nano.yaml", "--dry-run").stdout
    )
    bad = invoke_cli("run", str(recipe), "trainer.params.lr=-1", "--dry-run")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    # the override set the bad value, so the error names it, not the recipe file that holds a good one
    assert (
        bad.stderr.startswith(f"Error: override trainer.params.lr=-1 (on {recipe})")
        and "trainer.params.lr:" in bad.stderr
    )
    assert len(bad.stderr.strip().splitlines()) == 1


def test_shell_completion_script_and_recipe_keys_complete(tmp_path):
    """`populora completion SHELL` prints click's script; after a recipe, overrides complete to the recipe's keys."""
    script = invoke_cli("completion", "bash")
    assert script.returncode == 0 and "_POPULORA_COMPLETE=bash_complete" in script.stdout
    assert invoke_cli("completion", "tcsh").returncode == 2
    words = {"COMP_WORDS": "populora run recipes/nano.yaml rollout.sol", "COMP_CWORD": "3"}
    done = invoke_cli(env={**words, "_POPULORA_COMPLETE": "bash_complete"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["plain,rollout.solver_samples", "plain,rollout.solve_max_tokens"]
    commands = invoke_cli(env={"COMP_WORDS": "populora do", "COMP_CWORD": "1", "_POPULORA_COMPLETE": "bash_complete"})
    assert commands.stdout.split() == ["plain,doctor"]
    for command in ("run", "validate", "plan", "seed"):  # a RECIPE: the shipped names, then the shell's files
        named = invoke_cli(
            env={"COMP_WORDS": f"populora {command} nano_s", "COMP_CWORD": "2", "_POPULORA_COMPLETE": "bash_complete"}
        )
        assert named.stdout.split() == ["plain,nano_single_agent", "plain,nano_study", "file,nano_s"], named.stdout


def test_every_command_help_shows_an_example():
    """Each `populora CMD --help` (the core's and the built-in plugins') has a line that runs the command."""
    listed = invoke_cli("--help").stdout
    commands = [line.split()[0] for line in listed.split("Commands:")[1].splitlines() if line.strip()]
    assert {"run", "resume", "runs", "export", "eval", "evolve", "report", "sandbox"} <= set(commands)
    missing = []
    for command in commands:
        help_text = invoke_cli(command, "--help").stdout
        examples = [line for line in help_text.splitlines() if line.strip().startswith(f"populora {command}")]
        if not examples:
            missing.append(command)
    assert not missing, f"--help without an example: {missing}"


def test_the_recipe_keys_page_is_current_and_documents_every_key():
    """docs/recipe-keys.md is generated from the params models (`python -m populora_core.recipe.keys`): a key,
    default or description changed without regenerating it fails here, and every section key says what it does."""
    from populora_core.api.schema import Recipe
    from populora_core.plugin.manager import get_manager
    from populora_core.recipe.keys import builtin_plugins, model_keys, reference_markdown

    page = Path(__file__).resolve().parents[2] / "docs" / "recipe-keys.md"
    expected = reference_markdown(get_manager().registry, builtin_plugins())
    assert page.read_text() == expected, "docs/recipe-keys.md is stale: run python -m populora_core.recipe.keys"
    assert {"engines", "trainers", "azr", "lora_ops"} <= builtin_plugins()
    assert "### `trr++` (plugin trainers)" in expected and "`trainer.params.lr`" in expected
    undocumented = [key for key, _, _, text in model_keys(Recipe) if not text]
    assert not undocumented, f"recipe keys without a description: {undocumented}"
    printed = invoke_cli("keys", "--markdown")  # the installed plugins' page: the built-ins' sections at least
    assert printed.returncode == 0 and printed.stdout.startswith("# Recipe keys") and "### `trr++`" in printed.stdout
    refused = invoke_cli("keys", "--markdown", "trainer")
    assert refused.returncode == 2 and "--markdown prints the whole reference" in refused.stderr


def test_shipped_recipes_by_name_from_any_folder_list_show_copy_and_unknown_names(tmp_path):
    """`populora recipes` lists what ships (one line each), `show` prints one, `copy` writes an editable copy; a name
    that is neither a file nor shipped is exit 2 with did-you-mean and the list; a file of that name wins."""
    from populora_core.recipe.shipped import SHIPPED_DIR, shipped_recipes

    listed = invoke_cli("recipes", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert [line.split()[0] for line in lines] == list(shipped_recipes()) and len(lines) >= 14
    assert any(line.startswith("nano ") and "quickstart" in line for line in lines)
    shown = invoke_cli("recipes", "show", "azr_7b", cwd=tmp_path)
    assert shown.returncode == 0 and shown.stdout == (SHIPPED_DIR / "azr_7b.yaml").read_text()

    assert invoke_cli("validate", "nano", cwd=tmp_path).returncode == 0  # by name, from a folder without recipes/
    assert invoke_cli("validate", "nano.yaml", cwd=tmp_path).returncode == 0
    for args in (("run", "nanoo", "--dry-run"), ("validate", "azr_7bb"), ("recipes", "show", "nano_studdy")):
        wrong = invoke_cli(*args, cwd=tmp_path)
        assert wrong.returncode == 2 and "Traceback" not in wrong.stderr, wrong.stderr
        every = f"shipped recipes: {', '.join(shipped_recipes())}"
        assert "did you mean" in wrong.stderr and every in wrong.stderr, wrong.stderr
    outside = invoke_cli("run", "recipes/nano.yaml", "--dry-run", cwd=tmp_path)  # the clone's path, outside a clone
    assert outside.returncode == 2 and "`populora run nano` runs the shipped recipe" in outside.stderr

    copied = invoke_cli("recipes", "copy", "nano", cwd=tmp_path)
    assert copied.returncode == 0 and (tmp_path / "nano.yaml").read_text() == (SHIPPED_DIR / "nano.yaml").read_text()
    again = invoke_cli("recipes", "copy", "nano", cwd=tmp_path)
    assert again.returncode == 2 and "exists" in again.stderr and "--force" in again.stderr
    (tmp_path / "mine").mkdir()
    assert invoke_cli("recipes", "copy", "nano_study", "mine", cwd=tmp_path).returncode == 0
    assert (tmp_path / "mine" / "nano_study.yaml").is_file()
    (tmp_path / "nano.yaml").write_text((tmp_path / "nano.yaml").read_text().replace("steps: 32", "steps: 5"))
    dry = invoke_cli("run", "nano.yaml", "--dry-run", cwd=tmp_path)  # the local file wins over the shipped name
    assert dry.returncode == 0 and "\nsteps: 5\n" in dry.stdout


def test_short_runs_warn_that_evolution_makes_no_child_and_name_the_smallest_steps_that_do(tmp_path):
    """nano (every 4, ready_after 8): steps=4 has no selection before its last step, steps=8 selects at step 4 when
    nobody has played 8 matches; both warn in `validate` and the dry run, naming steps=9; steps=9 does not warn."""
    for steps in (4, 8):
        for args in (("validate", "nano", f"steps={steps}"), ("run", "nano", f"steps={steps}", "--dry-run")):
            result = invoke_cli(*args, cwd=tmp_path)
            assert result.returncode == 0, result.stderr
            assert f"warning: evolution will make no child in {steps} steps" in result.stderr, result.stderr
            assert "steps=9 or more makes a child" in result.stderr
    for steps in (9, 32):
        quiet = invoke_cli("validate", "nano", f"steps={steps}", cwd=tmp_path)
        assert quiet.returncode == 0 and "warning" not in quiet.stderr, quiet.stderr
    fast = invoke_cli("validate", "nano", "steps=4", "evolution.every=1", "evolution.ready_after=2", cwd=tmp_path)
    assert fast.returncode == 0 and "warning" not in fast.stderr  # selects at steps 2 and 3: a child
    assert "steps=3 or more" in invoke_cli("validate", "nano", "steps=2", "evolution.every=1", cwd=tmp_path).stderr
    single = invoke_cli("validate", "nano_single_agent", "steps=2", cwd=tmp_path)  # never evolves: nothing to warn
    assert single.returncode == 0 and "warning" not in single.stderr


def test_the_readmes_short_run_examples_make_a_child():
    """Every `populora run RECIPE ... steps=N` in the README leaves evolution a chance (no short-run warning)."""
    from populora_core.recipe.validate import evolution_warning

    readme = (TESTS.parent / "README.md").read_text()
    examples = [
        line.split("#", 1)[0].split()
        for line in readme.splitlines()
        if "populora run " in line and " steps=" in line and not line.startswith("|")
    ]
    assert len(examples) >= 2, examples
    for words in examples:
        recipe = words[words.index("run") + 1]
        recipe = {"my.yaml": "nano"}.get(recipe, recipe)  # the README's copy of nano
        overrides = [w for w in words if "=" in w and not w.startswith("-")]
        model, _ = load_recipe(recipe if "/" not in recipe else TESTS.parent / recipe, overrides)
        assert evolution_warning(model) is None, words


@pytest.mark.parametrize(
    ("overrides", "path", "said"),
    [
        (
            ["rollout.top_p=0.9"],
            "rollout.top_p",
            "rollout.top_p is 0.9, and trainer 'grpo' reads the engine's log-probs",
        ),
        (["rollout.temperature=0.7"], "trainer.params.temperature", "rollout.temperature is 0.7 and trainer.params"),
    ],
)
def test_sampling_that_biases_a_trainers_rollout_logprobs_is_a_recipe_error(overrides, path, said):
    """grpo with use_rollout_logprobs divides its log-probs by the engine's: top-p or another temperature makes them
    differ, which biases every importance ratio; the same sampling without that trainer setting is fine."""
    from populora_core.api import get_registry

    recipe = str(Path(__file__).resolve().parents[2] / "recipes" / "nano.yaml")
    reads = ['trainer={"name": "grpo", "params": {"use_rollout_logprobs": true}}']
    with pytest.raises(RecipeError) as err:
        load_recipe(recipe, [*reads, *overrides], get_registry())
    assert err.value.path == path and said in str(err.value), err.value
    assert "trainer.params.use_rollout_logprobs: false" in str(err.value) and "biased" in str(err.value)
    load_recipe(recipe, ['trainer={"name": "grpo"}', *overrides], get_registry())  # recomputes the old log-probs
    equal = [
        "rollout.temperature=0.7",
        'trainer={"name": "grpo", "params": {"use_rollout_logprobs": true, "temperature": 0.7}}',
    ]
    load_recipe(recipe, equal, get_registry())
