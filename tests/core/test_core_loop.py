"""The co-evolution loop on the light fake stack: hooks, rewards adjustment, evolution, resume after SIGKILL."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from populora_core import PluginError, hookimpl
from populora_core.api.lora import LoraFactors, LoraWeights
from populora_core.api.runview import RunView
from populora_core.recipe.validate import load_recipe
from populora_core.run.loop import execute, resume_run, start_run
from populora_core.run.phases import solve
from populora_core.run.run_dir import RunDir
from tests.cli_helpers import (
    POPULORA,
    REPO,
    fake_stack_manager,
    invoke_cli,
    kill_inside_step,
    run_cli,
    run_in_process,
)

TESTS = Path(__file__).resolve().parents[1]
FAKE = str(TESTS / "fake_stack.py")
RECIPE = TESTS / "recipes" / "fake_2t2s.yaml"


@pytest.fixture()
def env(tiny_model_dir, monkeypatch):
    monkeypatch.setenv("POPULORA_TEST_MODEL", str(tiny_model_dir))
    return {**os.environ, "POPULORA_TEST_MODEL": str(tiny_model_dir), "HF_HUB_OFFLINE": "1"}


class Recorder:
    """Implements every lifecycle hook and records what it saw."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict]] = []
        self.views: list[tuple[str, Any]] = []  # (hook, the run object it got)

    def _saw(self, name: str, run: Any) -> None:
        self.views.append((name, run))

    @hookimpl
    def on_run_start(self, run):
        self._saw("on_run_start", run)
        self.calls.append(("on_run_start", {"step": run.steps_done}))

    @hookimpl
    def on_run_end(self, run, status):
        self._saw("on_run_end", run)
        self.calls.append(("on_run_end", {"status": status}))

    @hookimpl
    def on_step_start(self, run, step):
        self._saw("on_step_start", run)
        self.calls.append(("on_step_start", {"step": step}))

    @hookimpl
    def after_matchmaking(self, run, step, matches):
        self._saw("after_matchmaking", run)
        self.calls.append(("after_matchmaking", {"step": step, "pairs": [(m.teacher, m.student) for m in matches]}))

    @hookimpl
    def after_rewards(self, run, step, rollouts):
        self._saw("after_rewards", run)
        self.calls.append(("after_rewards", {"step": step, "n": len(rollouts)}))

    @hookimpl
    def on_step_end(self, run, step, metrics):
        self._saw("on_step_end", run)
        self.calls.append(("on_step_end", {"step": step, "solve_rate": metrics["solve_rate"]}))

    @hookimpl
    def before_evolution(self, run, step, population):
        self._saw("before_evolution", run)
        self.calls.append(("before_evolution", {"step": step, "members": sorted(population.members)}))

    @hookimpl
    def after_evolution(self, run, step, events):
        self._saw("after_evolution", run)
        self.calls.append(("after_evolution", {"step": step, "events": events}))

    @hookimpl
    def on_checkpoint(self, run, step, path):
        self._saw("on_checkpoint", run)
        self.calls.append(("on_checkpoint", {"step": step, "exists": Path(path, "state.json").is_file()}))


def test_every_lifecycle_hook_is_called_in_order(env, tmp_path):
    rec = Recorder()
    directory = run_in_process(fake_stack_manager(rec), tmp_path / "run")
    names = [c[0] for c in rec.calls]
    assert names[0] == "on_run_start" and names[-1] == "on_run_end"
    assert rec.calls[-1][1] == {"status": "completed"}
    step1 = names[1 : names.index("on_step_end") + 1]
    assert step1 == ["on_step_start", "after_matchmaking", "after_rewards", "on_step_end"]
    evo = [c for c in rec.calls if c[0] == "after_evolution"]
    assert [c[1]["step"] for c in evo] == [2, 4]
    assert all(len(c[1]["events"]) == 2 for c in evo)  # one child per sub-population (fraction 0.5 of 2)
    checkpoints = [c[1] for c in rec.calls if c[0] == "on_checkpoint"]
    assert [c["step"] for c in checkpoints] == [1, 2, 3, 4, 5] and all(c["exists"] for c in checkpoints)
    # the run log agrees with what the hooks saw
    steps = [r for r in directory.read_log("events.jsonl") if r["event"] == "step"]
    assert [r["step"] for r in steps] == [1, 2, 3, 4, 5]
    pairs = [c[1]["pairs"] for c in rec.calls if c[0] == "after_matchmaking"]
    assert [[tuple(p) for p in r["matches"]] for r in steps] == pairs


def test_hooks_see_a_run_view_whose_population_is_a_copy_and_whose_emit_logs(env, tmp_path):
    """Hooks get RunView, never the loop's Run: steps_done as documented, a population copy an observer cannot
    change the run through, and emit into events.jsonl."""

    class Observer(Recorder):
        @hookimpl
        def after_matchmaking(self, run, step, matches):
            super().after_matchmaking(run, step, matches)
            for member in run.population.members.values():
                member.rating.mu = -1000.0  # a copy: the run's ratings must not move
            run.emit([{"event": "observer", "step": step, "members": sorted(run.population.members)}])

    observer = Observer()
    directory = run_in_process(fake_stack_manager(observer), tmp_path / "run", ["steps=3"])
    assert all(type(run) is RunView for _, run in observer.views), {type(run) for _, run in observer.views}
    seen = [(name, run.steps_done) for name, run in observer.views]
    names = [name for name, _ in seen]
    second = names.index("on_step_start", names.index("on_step_start") + 1)
    assert seen[second : second + 7] == [
        ("on_step_start", 1), ("after_matchmaking", 1), ("after_rewards", 1),
        ("before_evolution", 2), ("after_evolution", 2), ("on_step_end", 2), ("on_checkpoint", 2),
    ]  # fmt: skip
    assert seen[0] == ("on_run_start", 0) and seen[-1] == ("on_run_end", 3)
    logged = [r for r in directory.read_log("events.jsonl") if r["event"] == "observer"]
    assert [r["step"] for r in logged] == [1, 2, 3]
    members = json.loads((directory.path / "members.json").read_text())["members"]
    assert all(m["rating"]["mu"] > -100 for m in members), members


def test_before_evolution_sees_the_population_but_cannot_change_the_run_through_it(env, tmp_path):
    """before_evolution's ``population`` is the view's copy: members, ratings, matches and ages as selection is
    about to see them; a hookimpl that rewrites it (ratings, readiness, ages, members removed) changes nothing."""
    from populora_core.api.population import Population

    seen: list[tuple[int, Any, dict[str, Any]]] = []

    class Looks:
        @hookimpl
        def before_evolution(self, run, step, population):
            seen.append((step, population is run.population, population.to_dict()))

    class Meddles:
        @hookimpl
        def before_evolution(self, run, step, population):
            assert isinstance(population, Population) and population is run.population
            for member in population.members.values():
                member.rating.mu, member.rating.sigma = -1000.0, 0.001
                member.counters.matches, member.born_step = 0, 10**6
            population.members.pop(sorted(population.members)[0])

    looked = run_in_process(fake_stack_manager(Looks()), tmp_path / "looked")
    meddled = run_in_process(fake_stack_manager(Meddles()), tmp_path / "meddled")
    assert [step for step, _, _ in seen] == [2, 4] and all(same for _, same, _ in seen)
    for _, _, population in seen:  # what selection reads: roles, ratings moved by play, matches counted, ages
        members = population["members"]
        assert sorted(m["role"] for m in members) == ["student", "student", "teacher", "teacher"]
        assert all(m["counters"]["matches"] > 0 and m["rating"]["mu"] != 25.0 for m in members)
        assert all(isinstance(m["born_step"], int) for m in members)
    ids = [sorted(m["id"] for m in population["members"]) for _, _, population in seen]
    assert ids[0] != ids[1]  # step 2's children are members by step 4
    for name in ("lineage.jsonl", "members.json"):
        assert (meddled.path / name).read_bytes() == (looked.path / name).read_bytes(), name


def test_start_run_and_resume_run_apply_the_recipes_threads_without_the_cli(env, tmp_path, monkeypatch):
    """``runtime.threads`` is applied by start_run and resume_run themselves: a run started or resumed from Python
    (a benchmark, a notebook) runs on the recipe's thread count, not on whatever the caller's process had."""
    import torch

    before = torch.get_num_threads()
    threads = 2 if before == 1 else 1  # a count this process does not have already
    seen: list[tuple[int, int, str, str]] = []

    class Threads:
        @hookimpl
        def on_step_start(self, run, step):
            seen.append((step, torch.get_num_threads(), os.environ["OMP_NUM_THREADS"], os.environ["MKL_NUM_THREADS"]))

    def caller_has(count: int) -> None:  # the caller's process before each call: another count
        torch.set_num_threads(count)
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            monkeypatch.setenv(var, str(count))

    pm = fake_stack_manager(Threads())
    replaced = rf"runtime.threads={threads}: OMP_NUM_THREADS={before}, MKL_NUM_THREADS={before} in the environment"
    try:
        caller_has(before)
        with pytest.warns(UserWarning, match=replaced):
            run_in_process(pm, tmp_path / "run", ["steps=2", f"runtime.threads={threads}"])
        assert seen == [(step, threads, str(threads), str(threads)) for step in (1, 2)]
        caller_has(before)
        with pytest.warns(UserWarning, match=replaced):
            run = resume_run(RunDir(tmp_path / "run"), pm, ("steps=3",))
        assert torch.get_num_threads() == threads
        execute(run)
        assert seen[2:] == [(3, threads, str(threads), str(threads))]
    finally:
        torch.set_num_threads(before)


def test_after_rewards_adjustment_is_what_the_trainer_sees(env, tmp_path):
    seen: list[float] = []

    class Shaper:
        @hookimpl
        def after_rewards(self, run, step, rollouts):
            for r in rollouts:
                r.reward = 42.0

    pm = fake_stack_manager(Shaper())
    trainer_cls = pm.registry.get("trainer", "fake").factory
    original = trainer_cls.update

    def spy(self, member_id, adapter, rollouts, out_dir):
        seen.extend(r.reward for r in rollouts)
        return original(self, member_id, adapter, rollouts, out_dir)

    trainer_cls.update = spy
    try:
        run_in_process(pm, tmp_path / "run", ["steps=1"])
    finally:
        trainer_cls.update = original
    assert seen and set(seen) == {42.0}


def test_evolution_lineage_counters_and_problem_dataset(env, tmp_path):
    directory = run_in_process(fake_stack_manager(), tmp_path / "run")
    lineage = directory.read_log("lineage.jsonl")
    born = [e for e in lineage if e["operator"] != "init"]
    assert len(born) == 4 and all(e["rank"] == 4 for e in born)
    members = json.loads((directory.path / "members.json").read_text())["members"]
    ids = {m["id"] for m in members}
    assert {e["member"] for e in born if e["step"] == 4} <= ids
    assert not [e for e in born if e["step"] == 5], "no child is born at the last step"
    for m in members:
        assert m["counters"]["updates"] == 5 - m["born_step"]
    # every adapter version a member ever had is on disk, none overwritten
    for m in members:
        for v in range(m["version"] + 1):
            assert (directory.adapters / f"{m['id']}@v{v}" / "adapter_model.safetensors").is_file()
    import datasets

    problems = datasets.load_dataset("json", data_files=str(directory.path / "tasks" / "problems.jsonl"), split="train")
    assert len(problems) == 5 * 2 * 3  # steps x teachers x proposals
    assert {"proposer", "matched_student", "solve_rate", "valid", "signature", "metric_loc"} <= set(
        problems.column_names
    )


def test_single_agent_baseline_runs_through_the_same_loop(env, tmp_path):
    directory = run_in_process(
        fake_stack_manager(),
        tmp_path / "run",
        ["population.mode=single_agent", "population.teachers=1", "population.students=1"],
    )
    steps = [r for r in directory.read_log("events.jsonl") if r["event"] == "step"]
    assert all(r["matches"] == [["a0", "a0"]] for r in steps)
    last = steps[-1]
    # the one adapter is counted as proposer and solver: rollouts of both roles, one update per step
    assert last["member/a0/counters/updates"] == 5
    assert last["member/a0/counters/estimation_rollouts"] > 0
    assert not directory.read_log("lineage.jsonl")[1:]  # no evolution with a single agent


def _adapters(directory: Path) -> dict[str, dict]:
    from safetensors.torch import load_file

    return {p.name: load_file(str(p / "adapter_model.safetensors")) for p in sorted((directory / "adapters").iterdir())}


ARGS = ["--plugin", FAKE, "run", str(RECIPE), "steps=6", "--no-progress"]


def _reference_run(env, directory: Path) -> float:
    start = time.perf_counter()
    subprocess.run([POPULORA, *ARGS, "--run-dir", str(directory)], env=env, cwd=REPO, check=True, capture_output=True)
    return time.perf_counter() - start


@pytest.fixture(scope="module")
def reference(tiny_model_dir, tmp_path_factory) -> Path:
    """One uninterrupted ``populora run`` of ARGS (6 steps) for the module: what the kill-and-resume tests compare
    with, read only (a test that changes a run works on a copy)."""
    env = {**os.environ, "POPULORA_TEST_MODEL": str(tiny_model_dir), "HF_HUB_OFFLINE": "1"}
    directory = tmp_path_factory.mktemp("reference") / "reference"
    _reference_run(env, directory)
    return directory


def _resume(env, directory: Path) -> None:
    resumed = invoke_cli("--plugin", FAKE, "resume", str(directory), "--no-progress", env=env)
    assert resumed.returncode == 0, resumed.stderr


def _assert_same_run(reference: Path, resumed: Path) -> None:
    """Adapters bit for bit, every log record but timings, and the final members."""
    ref_adapters, got_adapters = _adapters(reference), _adapters(resumed)
    assert ref_adapters.keys() == got_adapters.keys()
    for name, tensors in ref_adapters.items():
        for key, value in tensors.items():
            assert (got_adapters[name][key] == value).all(), f"{name} {key} differs"
    for log in ("events.jsonl", "lineage.jsonl", "tasks/problems.jsonl"):
        ref = [json.loads(x) for x in (reference / log).read_text().splitlines()]
        got = [json.loads(x) for x in (resumed / log).read_text().splitlines()]
        strip = lambda rows: [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]  # noqa: E731
        assert strip(got) == strip(ref), f"{log} differs after resume"
    assert json.loads((resumed / "members.json").read_text()) == json.loads((reference / "members.json").read_text())


def test_sigkill_mid_run_then_resume_equals_uninterrupted_run(env, reference, tmp_path):
    killed = tmp_path / "killed"
    kill_inside_step([*ARGS, "--run-dir", str(killed)], env, 4, tmp_path / "paused")
    assert int((killed / "checkpoints" / "LATEST").read_text()) == 3
    _resume(env, killed)
    _assert_same_run(reference, killed)


def test_sigkill_before_the_first_checkpoint_then_resume_starts_over_to_the_same_run(env, reference, tmp_path):
    killed = tmp_path / "killed"
    kill_inside_step([*ARGS, "--run-dir", str(killed)], env, 1, tmp_path / "paused")
    assert not (killed / "checkpoints" / "LATEST").exists() and (killed / "adapters" / "s0@v0").is_dir()
    _resume(env, killed)
    _assert_same_run(reference, killed)


@pytest.mark.slow
def test_sigkill_at_any_instant_then_resume_equals_uninterrupted_run(env, tmp_path):
    """Kills at instants spread over the whole run (start-up and initialisation included), no pause points. Its own
    reference run: the kills are timed by its duration, measured now (the box's load then was the kills' too)."""
    reference = tmp_path / "reference"
    duration = _reference_run(env, reference)
    resumed = []
    for k, fraction in enumerate((0.15, 0.3, 0.5, 0.7, 0.9)):
        killed = tmp_path / f"killed{k}"
        proc = subprocess.Popen(
            [POPULORA, *ARGS, "--run-dir", str(killed)],
            env=env,
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(fraction * duration)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if not (killed / "recipe.yaml").exists():  # killed before the run existed: there is nothing to resume
            continue
        _resume(env, killed)
        _assert_same_run(reference, killed)
        resumed.append(fraction)
    assert len(resumed) >= 3, f"too few kills landed inside the run: {resumed}"


def test_probe_evaluation_writes_base_and_student_accuracy(env, tmp_path):
    probe = tmp_path / "probe.jsonl"
    probe.write_text(
        "\n".join(
            json.dumps(
                {"task_type": "count", "program": str(d), "inputs": [str(d)], "outputs": [str(d)], "extra_field": 1}
            )
            for d in range(1, 7)
        )
    )
    directory = run_in_process(
        fake_stack_manager(),
        tmp_path / "run",
        ["probe.enabled=true", f"probe.file={probe}", "probe.problems_per_type=5"],
    )
    records = directory.read_log("probe.jsonl")
    assert {(r["step"], r["member"]) for r in records if r["member"] == "base"} == {(0, "base")}
    final = [r for r in records if r["step"] == 5]
    members = json.loads((directory.path / "members.json").read_text())["members"]
    assert sorted(r["member"] for r in final) == sorted(m["id"] for m in members if m["role"] == "student")
    assert all(r["n"] == 5 and 0 <= r["accuracy"] <= 1 and r["task_type"] == "count" for r in records)
    # per-problem outcomes in probe order, consistent with the accuracy (what paired comparisons read)
    assert all(len(r["correct"]) == 5 and sum(r["correct"]) / 5 == pytest.approx(r["accuracy"]) for r in records)
    events = [e for e in directory.read_log("events.jsonl") if e["event"] == "probe"]
    assert [{k: v for k, v in e.items() if k != "event"} for e in events] == [
        {k: v for k, v in r.items() if k != "correct"} for r in records
    ]  # events.jsonl does not repeat the lists
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json}\n")
    with pytest.raises(Exception, match=r"bad\.jsonl:1: not a Problem record"):
        run_in_process(fake_stack_manager(), tmp_path / "run2", ["probe.enabled=true", f"probe.file={bad}"])


def test_solve_grades_each_attempt_as_the_students_rollouts(env, tmp_path):
    pm = fake_stack_manager()
    recipe, resolved = load_recipe(RECIPE, [], pm.registry)
    run = start_run(recipe, resolved, RunDir(tmp_path / "run"), pm)
    try:
        from tests.fake_stack import CountProblem

        s0, s1 = run.population.students[:2]
        problems = [CountProblem("count", str(d), [str(d)], [str(d)], valid=True, signature=f"sig{d}") for d in (3, 5)]
        tokens_before = s0.counters.tokens
        solved = solve(run.components, [("count", s0, problems[0]), ("count", s1, problems[1])], 1, "sample/solve", n=4)
        answers = solved.answers
        assert [len(a) for a in answers] == [4, 4]
        for student, problem, scored in zip((s0, s1), problems, answers):
            assert {(r.member_id, r.group) for r in scored} == {(student.id, "count/solve")}
            # the fake engine's answer is in the completion tokens; graded by the task against the program
            assert [r.info["correct"] for r in scored] == [
                r.completion_token_ids[0] == int(problem.program) for r in scored
            ]
            assert all(
                r.reward == (1.0 if r.info["correct"] else -0.5 if r.completion_token_ids[0] else -1.0) for r in scored
            )
            assert (student.id, problem.signature) in solved.covered
        assert s0.counters.tokens == tokens_before + 4 * 2
        assert solve(run.components, [], 1, "sample/solve", n=4).answers == []
    finally:
        run.close()


def test_a_new_runs_members_start_at_the_matchmakers_prior(env, tmp_path):
    pm = fake_stack_manager()
    recipe, resolved = load_recipe(RECIPE, ["matchmaker.params.mu=40", "matchmaker.params.sigma=5"], pm.registry)
    run = start_run(recipe, resolved, RunDir(tmp_path / "run"), pm)
    try:
        assert {(m.rating.mu, m.rating.sigma) for m in run.population.members.values()} == {(40.0, 5.0)}
    finally:
        run.close()


def test_seed_command_then_a_seeded_run_starts_from_those_problems(env, tmp_path):
    """`populora seed` (AZR's seeding stage, base model only) writes N distinct valid problems per task;
    `seeds.enabled` puts them in each task's buffer before step 1 and logs how many."""
    seeds = tmp_path / "seeds.jsonl"
    done = invoke_cli("--plugin", FAKE, "seed", str(RECIPE), "--out", str(seeds), "--per-type", "4", env=env)
    assert done.returncode == 0, done.stderr
    assert "round 1: count" in done.stderr
    records = [json.loads(line) for line in seeds.read_text().splitlines()]
    assert len(records) == 4 and all(r["task_type"] == "count" and r["valid"] for r in records)
    assert len({r["program"] for r in records}) == 4 and all(r["proposer"] == "base" for r in records)

    pm = fake_stack_manager()
    recipe, resolved = load_recipe(RECIPE, ["seeds.enabled=true", f"seeds.file={seeds}"], pm.registry)
    run = start_run(recipe, resolved, RunDir(tmp_path / "run"), pm)
    try:
        assert [p.program for p in run.components.tasks["count"].buffer] == [r["program"] for r in records]
    finally:
        run.close()
    logged = [r for r in RunDir(tmp_path / "run").read_log("events.jsonl") if r["event"] == "seeds"]
    assert logged == [{"event": "seeds", "step": 0, "file": str(seeds), "seeds/count": 4}]


def test_seed_errors_name_what_is_missing(env, tmp_path):
    # the fake task has at most six distinct valid proposals (digits 1-6)
    seed_args = ["seed", str(RECIPE), "--out", str(tmp_path / "s.jsonl"), "--per-type", "9", "--max-rounds", "3"]
    done = invoke_cli("--plugin", FAKE, *seed_args, env=env)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "short of 9 valid seeds: count" in done.stderr and not (tmp_path / "s.jsonl").exists()
    with pytest.raises(Exception, match=r"fake_2t2s\.yaml.*seeds\.enabled is true but seeds\.file is empty"):
        run_in_process(fake_stack_manager(), tmp_path / "run", ["seeds.enabled=true"])
    other = tmp_path / "other.jsonl"
    other.write_text(
        json.dumps({"task_type": "deduction", "program": "p", "inputs": ["1"], "outputs": ["1"], "valid": True}) + "\n"
    )
    with pytest.raises(Exception, match=r"other\.jsonl: no valid problem of the recipe's task types \(count\)"):
        run_in_process(fake_stack_manager(), tmp_path / "run2", ["seeds.enabled=true", f"seeds.file={other}"])


class RankChangingOperator:
    """A third-party operator whose children have another rank than their parents."""

    @hookimpl
    def register_operators(self, register):
        def halve_rank(parents, params, generator):
            (p,) = parents
            return LoraWeights(
                {n: LoraFactors(f.A[:2].clone(), f.B[:, :2].clone(), f.scale) for n, f in p.modules.items()},
                {**p.config, "r": 2},
            )

        register("halve_rank", halve_rank, min_parents=1, max_parents=1)


def test_the_loop_refuses_a_third_party_child_before_saving_it(env, tmp_path):
    operators = "evolution.operators=[{name: halve_rank, weight: 1.0}]"
    with pytest.raises(PluginError, match=r"operator 'halve_rank' .*changed r: "):
        run_in_process(fake_stack_manager(RankChangingOperator()), tmp_path / "run", [operators])
    saved = sorted(p.name for p in (tmp_path / "run" / "adapters").iterdir())
    assert saved and all(name.endswith(("@v0", "@v1", "@v2")) for name in saved)
    born = [e for e in (tmp_path / "run" / "lineage.jsonl").read_text().splitlines() if '"init"' not in e]
    assert born == []


class MiscountingMatchmakers:
    """Third-party matchmakers that break the one-match-per-teacher contract: the first teacher twice, or never."""

    @hookimpl
    def register_matchmakers(self, register):
        from populora_core.api.components import Match, Matchmaker

        class Miscounting(Matchmaker):
            def __init__(self, params, twice):
                self.twice = twice

            def pair(self, teachers, students, rng):
                matches = [Match(t.id, students[0].id) for t in teachers]
                return [matches[0], *matches] if self.twice else matches[1:]

            def update_ratings(self, outcomes, members):
                pass

            def state_dict(self):
                return None

            def load_state_dict(self, state):
                pass

        register("twice", lambda params: Miscounting(params, True))
        register("forgets", lambda params: Miscounting(params, False))


@pytest.mark.parametrize(("name", "what"), [("twice", "2 matches"), ("forgets", "no match")])
def test_a_matchmaker_that_gives_a_teacher_two_matches_or_none_is_a_plugin_error(env, tmp_path, name, what):
    with pytest.raises(PluginError, match=rf"matchmaker '{name}' \(plugin test-plugin-0\) gave teacher 't0' {what}"):
        run_in_process(fake_stack_manager(MiscountingMatchmakers()), tmp_path / "run", [f"matchmaker={name}"])


class DoublingHook:
    """An after_matchmaking hookimpl that breaks the one-match rule: it gives the first teacher a second match."""

    @hookimpl
    def after_matchmaking(self, run, step, matches):
        matches.append(matches[0])


def test_an_after_matchmaking_hook_that_gives_a_teacher_two_matches_is_a_plugin_error(env, tmp_path):
    broken = r"hook after_matchmaking \(plugin test-plugin-0\) gave teacher 't0' 2 matches"
    with pytest.raises(PluginError, match=broken):
        run_in_process(fake_stack_manager(DoublingHook()), tmp_path / "run")


def test_prompts_over_the_limit_are_dropped_counted_and_never_trained_on(env, tmp_path):
    """The fake task's proposer prompts are 'propose N' (9 or 10 characters): a limit of 9 drops N >= 10."""
    directory = run_in_process(fake_stack_manager(), tmp_path / "run", ["rollout.max_prompt_tokens=9", "steps=2"])
    problems = directory.read_log("tasks/problems.jsonl")
    dropped = [p for p in problems if p["error"] == "not generated: prompt_too_long"]
    assert dropped and len(dropped) < len(problems) and not any(p["valid"] for p in dropped)
    steps = [r for r in directory.read_log("events.jsonl") if r["event"] == "step"]
    assert sum(s.get("rollout/dropped/prompt_too_long", 0) for s in steps) == len(dropped)
    for teacher in ("t0", "t1"):  # a teacher trains on its generated proposals only (no evolution in 2 steps)
        generated = [p for p in problems if p["proposer"] == teacher and p not in dropped]
        assert steps[-1][f"member/{teacher}/counters/rollouts"] == len(generated)


def test_steps_log_cut_off_proposals_input_length_entropy_and_distinct_programs(env, tmp_path):
    """The fake engine cuts off its '6' proposals (finish reason "length") and gives log-probs only when asked."""
    directory = run_in_process(fake_stack_manager(), tmp_path / "run", ["steps=3", "evolution.every=0"])
    problems = directory.read_log("tasks/problems.jsonl")
    steps = [r for r in directory.read_log("events.jsonl") if r["event"] == "step"]
    assert {p["finish_reason"] for p in problems} == {"stop", "length"}
    assert not any("teacher_program" in p for p in problems)  # a task's own field, and the fake task writes none
    for rec in steps:
        mine = [p for p in problems if p["step"] == rec["step"]]
        valid = [p for p in mine if p["valid"]]
        assert rec["task/count/cut_off"] == rec["teacher/cut_off"] == sum(p["finish_reason"] == "length" for p in mine)
        assert rec["task/count/cut_off_rate"] == pytest.approx(rec["task/count/cut_off"] / len(mine))
        # the task's own metric, and the loop's distinct problems (a count problem is its digit)
        assert (
            rec["task/count/distinct_programs"]
            == rec["teacher/distinct_problems"]
            == len({p["program"] for p in valid})
        )
        assert rec["task/count/input_chars"] == pytest.approx(1.0)  # one digit
        assert rec["teacher/token_nll"] == pytest.approx(0.3)  # the proposals were sampled with log-probs
        assert rec["task/count/prompt_tokens"] == 3


def test_adapter_retention_keeps_what_resume_and_eval_need(env, tmp_path):
    directory = run_in_process(fake_stack_manager(), tmp_path / "run", ["adapters.keep=needed", "steps=6"])
    kept = {p.name for p in directory.adapters.iterdir()}
    members = json.loads((directory.path / "members.json").read_text())["members"]
    living = {f"{m['id']}@v{m['version']}" for m in members} | {f"{m['id']}@v0" for m in members}
    checkpointed = set()
    for path in directory.complete_checkpoints():
        state = directory.read_checkpoint(path)
        checkpointed |= {f"{m['id']}@v{m['version']}" for m in state["population"]["members"]}
    assert living | checkpointed == kept  # everything else went, nothing needed did
    everything = {
        p.name for p in run_in_process(fake_stack_manager(), tmp_path / "all", ["steps=6"]).adapters.iterdir()
    }
    assert kept < everything


def test_a_local_run_on_a_node_with_several_gpus_is_refused_with_both_ways_out(env, tmp_path, monkeypatch):
    """cluster: local on 4 visible GPUs would use GPU 0 alone: an error naming the Ray placement that uses all
    four and CUDA_VISIBLE_DEVICES for one; no run directory is left. One visible GPU (or none) is not refused."""
    import torch

    from populora_core import UserError
    from populora_core.run.assembly import refuse_idle_gpus

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    recipe, resolved = load_recipe(RECIPE, [], fake_stack_manager().registry)
    with pytest.raises(UserError, match=r"4 GPUs are visible.*cluster=ray cluster\.params\.workers=4 .*CUDA_VISIBLE"):
        start_run(recipe, resolved, RunDir(tmp_path / "run"), fake_stack_manager())
    assert not (tmp_path / "run").exists()
    for visible in (0, 1):
        refuse_idle_gpus(visible)


def test_resume_of_a_finished_run_changes_nothing_and_says_so(env, reference, tmp_path):
    """Resuming a completed run used to print 'wall time 0 s' and overwrite summary.json: now exit 0, a line that
    says it finished, and every file as it was."""
    run_dir = tmp_path / "done"
    shutil.copytree(reference, run_dir, symlinks=True)  # the module's finished run, copied: this test changes it
    (run_dir / "summary.json").write_text('{"wall_s": 195.5}\n')  # the record a finished run leaves
    before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    resumed = invoke_cli("--plugin", FAKE, "resume", str(run_dir), "--no-progress", env=env)
    assert resumed.returncode == 0, resumed.stderr
    assert f"{run_dir} already finished at step 6" in resumed.stdout
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == before


def test_a_run_dir_that_is_a_file_or_holds_other_files_is_a_one_line_error(env, tmp_path):
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine\n")
    other = tmp_path / "photos"
    other.mkdir()
    (other / "cat.jpg").write_bytes(b"\xff\xd8")
    for target, says in ((a_file, "is a file, not a directory"), (other, "holds other files and no run")):
        result = invoke_cli("--plugin", FAKE, "run", str(RECIPE), "--run-dir", str(target), "--no-progress", env=env)
        assert result.returncode == 2 and says in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert a_file.read_text() == "mine\n" and sorted(p.name for p in other.iterdir()) == ["cat.jpg"]
    empty = tmp_path / "empty"
    empty.mkdir()
    run_in_process(fake_stack_manager(), empty, ["steps=1"])  # what `populora run` calls, in this process
    assert (empty / "checkpoints" / "LATEST").read_text().strip() == "00000001"


def test_ctrl_c_names_the_command_that_continues_the_run(env, tmp_path):
    """SIGINT mid-step: no 'Aborted!', the resume command, exit 130; and that command continues the run."""
    run_dir = tmp_path / "stopped"
    code, stderr = kill_inside_step([*ARGS, "--run-dir", str(run_dir)], env, 3, tmp_path / "paused", sig=signal.SIGINT)
    assert code == 130 and "Traceback" not in stderr and "Aborted!" not in stderr, stderr
    assert f"populora run {RECIPE} -> {run_dir} (" in stderr  # the start-up line: where the run goes
    assert f"interrupted after step 2: `populora resume {run_dir}` continues from its last checkpoint" in stderr
    _resume(env, run_dir)
    assert int((run_dir / "checkpoints" / "LATEST").read_text()) == 6
    # RUN/run.log: what the terminal showed, without the bar, across the interruption and the resume
    logged = [line.split(" ", 1)[1] for line in (run_dir / "run.log").read_text().splitlines()]
    sources = [line for line in logged if line.startswith("components: ")]  # each session's plugins and packages
    assert len(sources) == 2 and all("trainer fake (file:fake_stack: " in line for line in sources), sources
    logged = [line for line in logged if line not in sources]
    assert logged[0].startswith(f"populora run {RECIPE} -> {run_dir} (")
    assert [line.split(" solve")[0] for line in logged if line.startswith("step ")] == [
        "step 1/6", "step 2/6", "step 3/6", "step 4/6", "step 5/6", "step 6/6",
    ]  # fmt: skip
    assert logged[3] == f"interrupted after step 2: `populora resume {run_dir}` continues from its last checkpoint"
    assert logged[4] == f"resuming {run_dir} at step 2" and logged[-1] == "run complete"


def test_runs_lists_each_runs_status_and_a_run_in_use_is_refused_a_second_process(env, tmp_path):
    """`populora runs`: finished, stopped (resume continues it), running (its process holds RUN/.lock); a second
    `resume` of a running run is an exit-2 error naming the process, not two processes writing one run."""
    import shutil
    import sys

    root = tmp_path / "runs"
    run_in_process(fake_stack_manager(), root / "done", ["steps=2"])
    shutil.copytree(root / "done", root / "stopped")
    recipe = root / "stopped" / "recipe.yaml"
    recipe.write_text(recipe.read_text().replace("steps: 2\n", "steps: 3\n"))  # as `resume ... steps=3` leaves it
    shutil.copytree(root / "stopped", root / "busy")
    hold = "from populora_core.run.run_dir import RunDir; import sys, time; RunDir(sys.argv[1]).lock(); print('locked', flush=True); time.sleep(120)"  # noqa: E501
    holder = subprocess.Popen([sys.executable, "-c", hold, str(root / "busy")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        listed = run_cli("runs", str(root), "--json")
        assert listed.returncode == 0, listed.stderr
        rows = {Path(r["path"]).name: r for r in json.loads(listed.stdout)}
        assert (rows["done"]["status"], rows["done"]["steps_done"], rows["done"]["steps"]) == ("finished", 2, 2)
        assert (rows["stopped"]["status"], rows["stopped"]["steps_done"], rows["stopped"]["steps"]) == ("stopped", 2, 3)
        assert rows["busy"]["status"] == f"running (pid {holder.pid})"
        second = run_cli("--plugin", FAKE, "resume", str(root / "busy"), "--no-progress", env=env)
        assert second.returncode == 2 and f"in use by another populora process (pid {holder.pid})" in second.stderr
        assert "Traceback" not in second.stderr
        table = run_cli("runs", str(root)).stdout.splitlines()
        assert table[0].split()[:5] == ["run", "recipe", "seed", "steps", "status"]
        assert any(line.startswith(str(root / "done")) and " 2/2 " in line and "finished" in line for line in table)
    finally:
        holder.kill()
        holder.wait()
    # the lock went with it
    resumed = invoke_cli("--plugin", FAKE, "resume", str(root / "busy"), "--no-progress", env=env)
    assert resumed.returncode == 0, resumed.stderr
    assert run_cli("runs", str(tmp_path / "nowhere")).returncode == 2


def test_export_writes_a_peft_folder_with_its_card_and_a_merged_model_that_computes_the_same(env, tmp_path):
    """`populora export RUN MEMBER`: PEFT loads the folder on the base; `--merge` is a full model whose logits are
    the base + adapter's; the card names lineage, rating and probe; mistakes are exit-2 errors."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    run_dir = tmp_path / "run"
    run_in_process(fake_stack_manager(), run_dir, ["steps=3"])  # a replacement at step 2: s-children with lineage
    members = {m["id"]: m for m in json.loads((run_dir / "members.json").read_text())["members"]}
    child = next(m for m in members.values() if m["lineage"]["operator"] != "init" and m["role"] == "student")
    adapter_out, merged_out = tmp_path / "adapter", tmp_path / "merged"
    done = invoke_cli("--plugin", FAKE, "export", str(run_dir), child["id"], "--out", str(adapter_out), env=env)
    assert done.returncode == 0, done.stderr
    merged = invoke_cli(
        "--plugin", FAKE, "export", str(run_dir), child["id"], "--out", str(merged_out), "--merge", env=env
    )
    assert merged.returncode == 0, merged.stderr
    version = f"{child['id']}@v{child['version']}"
    card = (adapter_out / "README.md").read_text()
    assert card.startswith(f"# {version} from the PopuLoRA run `run`") and "## Lineage" in card
    assert child["lineage"]["parents"][0] in card and "rating mu" in card and "vllm serve" in card

    ids = torch.tensor([[1, 5, 9, 13, 2, 7]])
    base = AutoModelForCausalLM.from_pretrained(env["POPULORA_TEST_MODEL"], dtype=torch.float32)
    with torch.no_grad():
        plain = base(ids).logits
        with_adapter = PeftModel.from_pretrained(base, str(adapter_out))(ids).logits
        full = AutoModelForCausalLM.from_pretrained(str(merged_out), dtype=torch.float32)(ids).logits
    assert not torch.equal(with_adapter, plain)  # a trained adapter changes the model
    torch.testing.assert_close(full, with_adapter, rtol=1e-4, atol=1e-4)
    for folder in (adapter_out, merged_out):  # each card's snippet runs as written (offline: no hub) ...
        snippet = (folder / "README.md").read_text().split("```python\n", 1)[1].split("```", 1)[0]
        scope: dict[str, Any] = {}
        exec(snippet, scope)
        with torch.no_grad():  # ... and loads this member: the logits of base + adapter
            torch.testing.assert_close(scope["model"](ids).logits, with_adapter, rtol=1e-4, atol=1e-4)
        assert scope["tokenizer"]("def f(x):")["input_ids"]

    again = invoke_cli("--plugin", FAKE, "export", str(run_dir), child["id"], "--out", str(adapter_out), env=env)
    assert again.returncode == 2 and "not an empty folder" in again.stderr
    nobody = invoke_cli("--plugin", FAKE, "export", str(run_dir), "s99", "--out", str(tmp_path / "x"), env=env)
    assert nobody.returncode == 2 and "member 's99' is not in" in nobody.stderr and "Traceback" not in nobody.stderr
    pruned = invoke_cli("--plugin", FAKE, "export", str(run_dir), "s0@v99", "--out", str(tmp_path / "y"), env=env)
    assert pruned.returncode == 2 and "kept versions of s0" in pruned.stderr


def test_an_export_names_its_base_portably_and_its_card_loads_it_from_another_folder(env, tmp_path):
    """adapter_config.json's base_model_name_or_path is the registered name (``nano``), never the clone's path of it;
    the card says who registers it and its snippet, run in a fresh process from another folder, loads this member."""
    import sys

    import torch
    from peft import PeftModel
    from populora_nano import MODEL_DIR
    from transformers import AutoModelForCausalLM

    run_dir = tmp_path / "run"
    run_in_process(fake_stack_manager(), run_dir, ["steps=1", "base_model=nano"])
    out = tmp_path / "exports" / "s0"
    done = invoke_cli("--plugin", FAKE, "export", str(run_dir), "s0", "--out", str(out), env=env)
    assert done.returncode == 0, done.stderr
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == "nano"
    card = (out / "README.md").read_text()
    assert "- base model: `nano`, a name registered by plugin nano (populora-toolkit " in card
    assert str(MODEL_DIR) not in card  # no path of this clone's (or site-packages') copy of the base

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    snippet = card.split("```python\n", 1)[1].split("```", 1)[0]
    probe = "\nimport torch\nprint(model(torch.tensor([[1, 5, 9, 13, 2, 7]])).logits.double().sum().item())\n"
    loaded = subprocess.run(
        [sys.executable, "-c", snippet + probe], capture_output=True, text=True, cwd=elsewhere, env=env, timeout=300
    )
    assert loaded.returncode == 0, loaded.stderr
    with torch.no_grad():
        base = AutoModelForCausalLM.from_pretrained(str(MODEL_DIR), dtype=torch.float32)
        expected = PeftModel.from_pretrained(base, str(out))  # this member: base + the exported adapter
        want = expected(torch.tensor([[1, 5, 9, 13, 2, 7]])).logits.double().sum().item()
    assert float(loaded.stdout.split()[-1]) == pytest.approx(want, rel=1e-5)

    local = tmp_path / "local-run"
    run_in_process(
        fake_stack_manager(), local, ["steps=1", f"base_model={env['POPULORA_TEST_MODEL']}"]
    )  # a base that is a folder
    local_out = tmp_path / "local-export"
    assert invoke_cli("--plugin", FAKE, "export", str(local), "s0", "--out", str(local_out), env=env).returncode == 0
    folder = str(Path(env["POPULORA_TEST_MODEL"]).resolve())
    assert json.loads((local_out / "adapter_config.json").read_text())["base_model_name_or_path"] == folder
    assert (
        f"the local folder `{folder}`: a path on the machine that made this export"
        in (local_out / "README.md").read_text()
    )


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_every_file_a_run_or_an_export_writes_follows_the_umask(env, tmp_path, umask):
    """safetensors writes its files 0600; what a run or an export publishes gets the mode open() gives (0644 under
    umask 022), so colleagues can read a shared results folder, and 0600 under 077."""
    import stat

    run_dir, adapter_out, merged_out = tmp_path / "run", tmp_path / "adapter", tmp_path / "merged"
    old = os.umask(umask)
    try:
        run_in_process(fake_stack_manager(), run_dir, ["steps=2"])
        for out, more in ((adapter_out, []), (merged_out, ["--merge"])):  # the command runs under it
            done = invoke_cli("--plugin", FAKE, "export", str(run_dir), "s0", "--out", str(out), *more, env=env)
            assert done.returncode == 0, done.stderr
    finally:
        os.umask(old)
    paths = [p for top in (run_dir, adapter_out, merged_out) for p in [top, *top.rglob("*")]]
    modes = {oct(stat.S_IMODE(p.stat().st_mode)) for p in paths if p.is_file()}
    assert modes == {oct(0o666 & ~umask)}, sorted(
        (oct(stat.S_IMODE(p.stat().st_mode)), str(p)) for p in paths if p.is_file()
    )[:5]
    assert {oct(stat.S_IMODE(p.stat().st_mode)) for p in paths if p.is_dir()} == {oct(0o777 & ~umask)}
    assert any(p.name == "adapter_model.safetensors" for p in paths) and any(
        p.name == "model.safetensors" for p in paths
    )


def test_resume_steps_extends_a_finished_run_to_what_a_longer_run_computes(env, reference, tmp_path):
    """`populora resume RUN steps=N`: a run of 4 steps (its last-step evolution left out) extended to 6 equals a
    run planned for 6: adapters bit for bit, lineage, problems; the step-4 log line and the final probe differ."""
    short, planned = tmp_path / "short", reference  # planned: the module's `populora run ... steps=6`
    # what `populora run` calls, in this process: the resume is the CLI's
    run_in_process(fake_stack_manager(), short, ["steps=4"])
    assert not [r for r in RunDir(short).read_log("lineage.jsonl") if r["step"] == 4]  # evolution every 2: left out
    shorter = invoke_cli("--plugin", FAKE, "resume", str(short), "steps=3", env=env)
    assert shorter.returncode == 2 and "never shorten it" in shorter.stderr
    other = invoke_cli("--plugin", FAKE, "resume", str(short), "seed=9", env=env)
    assert other.returncode == 2 and "only the cluster section and steps may change" in other.stderr
    extended = invoke_cli("--plugin", FAKE, "resume", str(short), "steps=6", "--no-progress", env=env)
    assert extended.returncode == 0, extended.stderr
    assert yaml_steps(short) == 6
    assert _adapters(short).keys() == _adapters(planned).keys()
    for name, tensors in _adapters(planned).items():
        assert all((_adapters(short)[name][k] == v).all() for k, v in tensors.items()), name
    for log in ("lineage.jsonl", "tasks/problems.jsonl"):
        assert RunDir(short).read_log(log) == RunDir(planned).read_log(log), log
    assert json.loads((short / "members.json").read_text()) == json.loads((planned / "members.json").read_text())


def yaml_steps(run_dir: Path) -> int:
    import yaml

    return int(yaml.safe_load((run_dir / "recipe.yaml").read_text())["steps"])


def test_init_from_starts_each_member_from_a_runs_adapters_of_its_role(env, tmp_path):
    """`populora run --init-from RUN`: version 0 of each member is the source run's current member of its role, in
    turn, with lineage saying so; a folder of PEFT folders works too; adapters of another shape are an exit-2 error."""
    source = tmp_path / "source"
    run_in_process(fake_stack_manager(), source, ["steps=2"])
    recorded = json.loads((source / "members.json").read_text())["members"]
    by_role = {r: [f"{m['id']}@v{m['version']}" for m in recorded if m["role"] == r] for r in ("teacher", "student")}
    warm = tmp_path / "warm"
    args = ["--plugin", FAKE, "run", str(RECIPE), "steps=1", "--no-progress", "--run-dir", str(warm)]
    done = invoke_cli(*args, "--init-from", str(source), env=env)
    assert done.returncode == 0, done.stderr
    src, got = _adapters(source), _adapters(warm)
    births = [r for r in RunDir(warm).read_log("lineage.jsonl") if r["step"] == 0]
    assert {r["operator"] for r in births} == {"init_from"}
    for birth in births:
        role = "teacher" if birth["member"].startswith("t") else "student"
        origin = Path(birth["params"]["from"]).name
        assert origin in by_role[role]
        assert all(torch_equal(got[birth["child"]][k], v) for k, v in src[origin].items()), birth
    folder = tmp_path / "folder"
    folder.mkdir()
    import shutil

    shutil.copytree(source / "adapters" / by_role["student"][0], folder / "only")
    from_folder = invoke_cli(*args[:-1], str(tmp_path / "warm2"), "--init-from", str(folder), env=env)
    assert from_folder.returncode == 0, from_folder.stderr
    wrong = invoke_cli(*args[:-1], str(tmp_path / "warm3"), "lora.rank=2", "--init-from", str(source), env=env)
    assert wrong.returncode == 2 and "population.init_from" in wrong.stderr and "Traceback" not in wrong.stderr
    assert not (tmp_path / "warm3").exists()  # a failed start leaves no stub that blocks the path
    nowhere = invoke_cli(*args[:-1], str(tmp_path / "warm4"), "--init-from", str(tmp_path / "nope"), env=env)
    assert nowhere.returncode == 2 and "neither a run directory nor a folder" in nowhere.stderr
    assert not (tmp_path / "warm4").exists()
    (tmp_path / "mine").mkdir()  # a folder the user made empty stays, empty
    again = invoke_cli(*args[:-1], str(tmp_path / "mine"), "lora.rank=2", "--init-from", str(source), env=env)
    assert again.returncode == 2 and sorted((tmp_path / "mine").iterdir()) == []
    assert invoke_cli(*args[:-1], str(tmp_path / "warm3"), "--init-from", str(source), env=env).returncode == 0


def torch_equal(a, b) -> bool:
    return bool((a == b).all())


def test_a_display_hears_the_steps_are_over_before_on_run_end_observers_print(env, tmp_path):
    """The live bar stops on ``on_steps_done``, before the report plugin's summary (an ``on_run_end``
    observer) prints: otherwise the bar is redrawn below the summary on a terminal."""
    rec = Recorder()
    pm = fake_stack_manager(rec)
    recipe, resolved = load_recipe(RECIPE, ["steps=1"], pm.registry)
    run = start_run(recipe, resolved, RunDir(tmp_path / "run"), pm)
    execute(run, on_steps_done=lambda: rec.calls.append(("steps_done", {})))
    names = [name for name, _ in rec.calls]
    assert names[-2:] == ["steps_done", "on_run_end"] and names.count("steps_done") == 1


def test_on_a_terminal_the_bar_ends_before_the_run_summary(env, tmp_path):
    """Through the CLI on a pseudo-terminal: the live bar is drawn, stopped (cursor shown again) before the report
    plugin's summary prints, and never redrawn below it."""
    import os
    import pty
    import subprocess

    from tests.cli_helpers import POPULORA

    primary, secondary = pty.openpty()
    args = [POPULORA, "--plugin", FAKE, "run", str(RECIPE), "steps=2", "--run-dir", str(tmp_path / "run")]
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", **env}
    proc = subprocess.Popen(args, stdin=secondary, stdout=secondary, stderr=secondary, env=full_env, close_fds=True)
    os.close(secondary)
    out = b""
    while True:
        try:
            chunk = os.read(primary, 4096)
        except OSError:  # the terminal closed with the process
            break
        if not chunk:
            break
        out += chunk
    os.close(primary)
    assert proc.wait(timeout=300) == 0, out.decode(errors="replace")
    text = out.decode(errors="replace")
    summary = text.index("wall time")  # the report plugin's summary
    assert "\x1b[2K" in text[:summary], "no live bar was drawn"
    assert "\x1b[?25h" in text[:summary], "the bar was not stopped before the summary"
    assert "\x1b[2K" not in text[summary:], "the bar was redrawn below the summary"


@pytest.mark.parametrize("cross_evaluation", [True, False])
def test_cross_evaluation_off_rewards_each_teacher_by_its_own_answers(env, tmp_path, monkeypatch, cross_evaluation):
    """The ablation: teachers answer their own valid proposals (stream sample/self, trained on by nobody) and their
    reward is the learnability of that rate; with it on, the matched student's rate, and teachers answer nothing."""
    from populora_core.run import phases

    own_calls: list[list[str]] = []
    rewards: list[float] = []
    solve_original = phases.solve

    def solve_spy(c, attempts, step, stream, **kw):
        if stream == "sample/self":
            own_calls.append([member.id for _, member, _ in attempts])
        return solve_original(c, attempts, step, stream, **kw)

    class Rewards:
        @hookimpl
        def after_rewards(self, run, step, rollouts):
            rewards.extend(r.reward for r in rollouts if r.group.endswith("/propose") and r.info["valid"])

    monkeypatch.setattr(phases, "solve", solve_spy)
    if not cross_evaluation:  # every teacher "solves" 1 of 4 of its own: its reward is 1 - 0.25 on each valid one
        monkeypatch.setattr(
            phases,
            "solve_own_proposals",
            lambda c, pop, proposals, step, timer: [0.25] * sum(p.valid for p in proposals),
        )
    directory = run_in_process(
        fake_stack_manager(Rewards()),
        tmp_path / "run",
        [f"population.cross_evaluation={str(cross_evaluation).lower()}", "steps=2"],
    )
    records = [json.loads(x) for x in (directory.path / "tasks" / "problems.jsonl").read_text().splitlines()]
    valid = [r for r in records if r["valid"]]
    assert valid and len(rewards) == len(valid)
    if cross_evaluation:
        assert own_calls == []
        expected = [1 - r["solve_rate"] if 0 < r["solve_rate"] < 1 else -0.5 for r in valid]
        assert rewards == pytest.approx(expected)
    else:
        assert rewards == pytest.approx([0.75] * len(valid))
        # the matched student still answered them: its rate is recorded, and differs from the teacher's
        assert all(r["solve_rate"] is not None for r in valid)


def test_cross_evaluation_off_lets_each_teacher_answer_its_own_valid_proposals(env, tmp_path, monkeypatch):
    from populora_core.run import phases

    own: list[tuple[str, str]] = []
    solve_original = phases.solve

    def solve_spy(c, attempts, step, stream, **kw):
        if stream == "sample/self":
            own.extend((member.id, problem.proposer) for _, member, problem in attempts)
        return solve_original(c, attempts, step, stream, **kw)

    monkeypatch.setattr(phases, "solve", solve_spy)
    run_in_process(fake_stack_manager(), tmp_path / "run", ["population.cross_evaluation=false", "steps=1"])
    assert own and all(proposer.startswith(member + "@") for member, proposer in own)


def test_cross_evaluation_off_is_refused_in_a_single_agent_run(env):
    with pytest.raises(Exception, match="cross_evaluation: false is a population ablation"):
        load_recipe(
            RECIPE, ["population.mode=single_agent", "population.cross_evaluation=false"], fake_stack_manager().registry
        )
