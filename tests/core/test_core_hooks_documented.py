"""Every hook is documented parameter by parameter in its hookspec (as pytest's are), CONTRIBUTING.md's hook
reference is those docstrings, and every hook fires: the core calls each one with its documented arguments (a
recording plugin on the fake stack), so removing a call fails here. ``register_commands`` is historic, and no
lifecycle hook stops at a first answer."""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path
from typing import Any

import click
import pytest

from populora_core import hookimpl
from populora_core.api.components import Match, Rollout
from populora_core.plugin import hookspecs
from populora_core.plugin.manager import PluginManager
from populora_core.plugin.registry import KINDS

REPO = Path(__file__).resolve().parents[2]
TESTS = Path(__file__).resolve().parents[1]
STEPS = 3  # evolution every 2 steps: one evolution, at step 2


def _hooks() -> dict[str, str]:
    names = PluginManager().hook_names()
    return {n: f"{n}({', '.join(inspect.signature(getattr(hookspecs, n)).parameters)})" for n in names}


def undocumented(spec: Any) -> list[str]:
    """What a hookspec's docstring leaves out: each parameter without its ``:param name:``, a ``:param`` of no
    parameter, and a missing ``:returns:``."""
    doc = inspect.getdoc(spec) or ""
    params = list(inspect.signature(spec).parameters)
    documented = re.findall(r"^:param (\w+):", doc, flags=re.M)
    problems = [f"{spec.__name__}: parameter {p!r} is not documented" for p in params if p not in documented]
    problems += [f"{spec.__name__}: documents {p!r}, not a parameter" for p in documented if p not in params]
    if not re.search(r"^:returns: \S", doc, flags=re.M):
        problems.append(f"{spec.__name__}: says nothing of its return value (:returns:)")
    return problems


def test_every_parameter_of_every_hook_is_documented_in_its_hookspec():
    problems = [p for name in _hooks() for p in undocumented(getattr(hookspecs, name))]
    assert not problems, problems


def test_the_docs_check_finds_a_planted_undocumented_parameter():
    @hookspecs.hookspec
    def on_synthetic(run, step, planted):
        """A synthetic hook.

        :param run: the run.
        :param step: the step.
        :param stale: a parameter the hook does not have.
        :returns: nothing.
        """

    @hookspecs.hookspec
    def on_silent(run):
        """A synthetic hook that says nothing of its parameter or its return value."""

    assert undocumented(on_synthetic) == [
        "on_synthetic: parameter 'planted' is not documented",
        "on_synthetic: documents 'stale', not a parameter",
    ]
    assert undocumented(on_silent) == [
        "on_silent: parameter 'run' is not documented",
        "on_silent: says nothing of its return value (:returns:)",
    ]


def reference(name: str) -> str:
    """A hook's entry in CONTRIBUTING.md's hook reference: its signature, then its hookspec's docstring (each
    ``:param x:`` and ``:returns:`` a list item)."""
    lines = []
    for line in (inspect.getdoc(getattr(hookspecs, name)) or "").splitlines():
        line = re.sub(r"^:param (\w+):", r"- ``\1``:", line)
        line = re.sub(r"^:returns:", "- returns:", line)
        lines.append(re.sub(r"^    ", "  ", line))
    return f"### `{_hooks()[name]}`\n\n" + "\n".join(lines) + "\n"


def test_contributing_s_hook_reference_is_the_hookspecs_docstrings():
    """Each hook's entry in CONTRIBUTING.md starts with its signature and docstring, word for word (notes on the
    built-in components may follow); no hook is missing and none is documented that does not exist."""
    docs = (REPO / "CONTRIBUTING.md").read_text()
    section = docs.split("## Hook reference\n", 1)[1].split("\n## ", 1)[0]
    entries = {m.group(1): m.group(0) for m in re.finditer(r"^### `(\w+)\(.*?(?=^###? |\Z)", section, re.M | re.S)}
    hooks = _hooks()
    assert sorted(entries) == sorted(hooks), "CONTRIBUTING.md's hook reference lists other hooks than hookspecs.py"
    differ = [name for name in hooks if not entries[name].startswith(reference(name))]
    assert not differ, f"entries that differ from the hookspecs' docstrings: {differ}\n" + "\n".join(
        reference(n) for n in differ
    )
    assert re.findall(r"^### `(\w+)\(", section, re.M) == _source_order(), "not in hookspecs.py's order"


def _source_order() -> list[str]:
    hooks = _hooks()
    return [name for name in vars(hookspecs) if name in hooks]


class Recorder:
    """Implements every lifecycle hook (with its spec's exact arguments) and records each call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def _seen(self, name: str, args: dict[str, Any]) -> None:
        self.calls.append((name, {k: v for k, v in args.items() if k != "self"}))

    @hookimpl
    def on_run_start(self, run):
        self._seen("on_run_start", locals())

    @hookimpl
    def on_run_end(self, run, status):
        self._seen("on_run_end", locals())

    @hookimpl
    def on_step_start(self, run, step):
        self._seen("on_step_start", locals())

    @hookimpl
    def after_matchmaking(self, run, step, matches):
        self._seen("after_matchmaking", locals())

    @hookimpl
    def after_rewards(self, run, step, rollouts):
        self._seen("after_rewards", locals())

    @hookimpl
    def on_step_end(self, run, step, metrics):
        self._seen("on_step_end", dict(locals(), metrics=dict(metrics)))

    @hookimpl
    def before_evolution(self, run, step, population):
        self._seen("before_evolution", dict(locals(), members=sorted(population.members)))

    @hookimpl
    def after_evolution(self, run, step, events):
        self._seen("after_evolution", locals())

    @hookimpl
    def on_checkpoint(self, run, step, path):
        state = Path(path, "state.json")  # read now: older checkpoints are pruned later
        self._seen(
            "on_checkpoint", dict(locals(), saved_step=state.is_file() and json.loads(state.read_text())["step"])
        )


LIFECYCLE = sorted(n for n in _hooks() if not n.startswith("register_"))
REGISTRATION = sorted(n for n in _hooks() if n.startswith("register_"))


def test_the_recorder_implements_every_lifecycle_hook_with_its_documented_arguments():
    for name in LIFECYCLE:
        spec = list(inspect.signature(getattr(hookspecs, name)).parameters)
        assert list(inspect.signature(getattr(Recorder, name)).parameters)[1:] == spec, name
    assert set(REGISTRATION) == {*KINDS.values(), "register_commands"}, "a new registration hook needs a test below"


@pytest.fixture()
def fake_run(tiny_model_dir, monkeypatch, tmp_path):
    """A 3-step run of the fake stack with the recorder: (recorder, run directory)."""
    from populora_core.recipe.validate import load_recipe
    from populora_core.run.loop import execute, start_run
    from populora_core.run.run_dir import RunDir

    monkeypatch.setenv("POPULORA_TEST_MODEL", str(tiny_model_dir))
    pm = PluginManager()
    pm.load_entry_points()
    pm.load_file(TESTS / "fake_stack.py")
    recorder = Recorder()
    assert pm.add_plugin(recorder, "recorder")
    recipe, resolved = load_recipe(TESTS / "recipes" / "fake_2t2s.yaml", [f"steps={STEPS}"], pm.registry)
    directory = RunDir(tmp_path / "run")
    execute(start_run(recipe, resolved, directory, pm))
    return recorder, directory


def test_every_lifecycle_hook_fires_with_its_documented_arguments(fake_run):
    from populora_core.api.population import Population
    from populora_core.api.runview import RunView

    recorder, directory = fake_run
    calls = recorder.calls
    fired = {name for name, _ in calls}
    assert fired == set(LIFECYCLE), f"hooks the run never called: {sorted(set(LIFECYCLE) - fired)}"
    for name, args in calls:  # each with exactly its spec's arguments, the run object first
        assert set(args) >= set(inspect.signature(getattr(hookspecs, name)).parameters), name
        assert isinstance(args["run"], RunView), name
        assert "step" not in args or isinstance(args["step"], int), name

    def steps(name: str) -> list[int]:
        return [args["step"] for n, args in calls if n == name]

    assert calls[0][0] == "on_run_start" and calls[-1][0] == "on_run_end"
    assert calls[-1][1]["status"] == "completed"
    every_step = list(range(1, STEPS + 1))
    for name in ("on_step_start", "after_matchmaking", "after_rewards", "on_step_end", "on_checkpoint"):
        assert steps(name) == every_step, name
    first_step = [n for n, _ in calls[1:]][: [n for n, _ in calls].index("on_step_end")]
    assert first_step == ["on_step_start", "after_matchmaking", "after_rewards", "on_step_end"]
    assert steps("before_evolution") == steps("after_evolution") == [2]

    step_log = [r for r in directory.read_log("events.jsonl") if r["event"] == "step"]
    lineage = [r for r in directory.read_log("lineage.jsonl") if r["operator"] != "init"]
    for name, args in calls:
        if name == "after_matchmaking":  # the pairs the step log records
            assert args["matches"] and all(isinstance(m, Match) for m in args["matches"])
            logged = step_log[args["step"] - 1]["matches"]
            assert [[m.teacher, m.student] for m in args["matches"]] == logged
        elif name == "after_rewards":
            assert args["rollouts"] and all(isinstance(r, Rollout) for r in args["rollouts"])
        elif name == "on_step_end":  # the flat dict also written to the event log
            logged = step_log[args["step"] - 1]
            assert args["metrics"] and all(json.dumps(logged[k]) == json.dumps(v) for k, v in args["metrics"].items())
        elif name == "before_evolution":
            assert isinstance(args["population"], Population) and len(args["members"]) == 4
        elif name == "after_evolution":  # the lineage records of the children born
            born = [r for r in lineage if r["step"] == args["step"]]
            assert args["events"] and [e["member"] for e in args["events"]] == [r["member"] for r in born]
            assert all({"parents", "operator", "params", "seed"} <= set(e) for e in args["events"])
        elif name == "on_checkpoint":  # a complete checkpoint of that step, at ``path``
            assert isinstance(args["path"], str) and args["saved_step"] == args["step"]


def test_every_registration_hook_fires_and_what_it_registers_is_there(monkeypatch):
    """The core calls each ``register_*`` hook of a plugin as it is added; ``register_commands`` when the CLI
    lists its commands."""
    from populora_core.cli.group import PopuloraGroup

    class Registrar:
        pass

    for hook_name in KINDS.values():

        def register(register, _hook=hook_name):
            arity = {"min_parents": 1} if _hook == "register_operators" else {}  # an operator declares it
            register(f"probe_{_hook}", lambda params: None, **arity)

        register.__name__ = hook_name
        setattr(Registrar, hook_name, staticmethod(hookimpl(register)))

    @hookimpl
    def register_commands(cli):
        @cli.command("probe-command")
        def probe() -> None:
            """Registered by the test."""

    Registrar.register_commands = staticmethod(register_commands)  # type: ignore[attr-defined]

    pm = PluginManager()
    assert pm.add_plugin(Registrar(), "registrar")
    for kind, hook_name in KINDS.items():
        assert pm.registry.get(kind, f"probe_{hook_name}").plugin == "registrar", hook_name
    monkeypatch.setattr("populora_core.cli.group.get_manager", lambda plugin_files=(): pm)
    group = PopuloraGroup("probe")
    with click.Context(group) as ctx:
        assert "probe-command" in group.list_commands(ctx)


def _command_plugin(command: str, *, fails: bool = False) -> object:
    class Commands:
        @hookimpl
        def register_commands(self, cli):
            if fails:
                raise RuntimeError("no commands today")

            @cli.command(command)
            def added() -> None:
                """Registered by the test."""

    return Commands()


def test_register_commands_is_historic_a_plugin_added_later_still_adds_its_commands(monkeypatch):
    from populora_core.cli.group import PopuloraGroup

    assert hookspecs.register_commands.populora_spec["historic"]  # type: ignore[attr-defined]
    pm = PluginManager()
    assert pm.add_plugin(_command_plugin("early"), "early")
    monkeypatch.setattr("populora_core.cli.group.get_manager", lambda plugin_files=(): pm)
    group = PopuloraGroup("probe")
    with click.Context(group) as ctx:
        assert "early" in group.list_commands(ctx) and "late" not in group.list_commands(ctx)
        assert pm.add_plugin(_command_plugin("late"), "late")  # a --plugin file loaded into the same manager
        assert {"early", "late"} <= set(group.list_commands(ctx))
        # a late plugin whose command hook fails is a row of its own, and none of its hooks stays registered
        with pytest.warns(UserWarning, match="plugin broken .* disabled: .*no commands today"):
            assert not pm.add_plugin(_command_plugin("broken", fails=True), "broken")
        assert not pm.pm.has_plugin("broken") and pm.plugins["broken"].error
        assert "broken" not in group.list_commands(ctx)


def test_no_lifecycle_hook_stops_at_a_first_answer():
    """Every hookimpl of a lifecycle hook runs, in turn, whatever the others return (none is ``firstresult``: the
    loop reads no answer), so two observers of the same hook both see every call."""
    seen: list[tuple[str, str]] = []

    def observer(label: str) -> object:
        class Observer:
            pass

        for name in LIFECYCLE:

            def impl(_name: str = name) -> str:  # declares none of the hook's arguments, as a hookimpl may
                seen.append((label, _name))
                return label  # an answer the loop must not stop at

            setattr(Observer, name, staticmethod(hookimpl(specname=name)(impl)))
        return Observer()

    pm = PluginManager()
    assert pm.add_plugin(observer("first"), "first") and pm.add_plugin(observer("second"), "second")
    for name in LIFECYCLE:
        spec = getattr(hookspecs, name)
        assert not spec.populora_spec["firstresult"] and not spec.populora_spec["historic"], name
        kwargs = {p: None for p in inspect.signature(spec).parameters}
        assert sorted(getattr(pm.hook, name)(**kwargs)) == ["first", "second"], name
    assert sorted(seen) == sorted((label, name) for label in ("first", "second") for name in LIFECYCLE)
