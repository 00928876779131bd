"""`populora report`: figures and a self-contained HTML page rendered from recorded run logs.

The runs are recorded by the real loop on the cheap fake stack (tests/fake_stack.py); probe.jsonl
is written here with known numbers so the summary's probe statistics can be checked exactly.
"""

from __future__ import annotations

import base64
import html
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from populora_report.data import load_run, load_runs
from populora_report.figures.population import _lanes
from populora_report.render import render_report
from populora_report.summary import run_summary

from populora_core import UserError
from populora_core.plugin.manager import PluginManager
from populora_core.recipe.validate import load_recipe
from populora_core.run.loop import execute, start_run
from populora_core.run.run_dir import RunDir
from tests.cli_helpers import invoke_cli
from tests.synthetic_runs import write_run

TESTS = Path(__file__).resolve().parents[2]
RECIPE = TESTS / "recipes" / "fake_2t2s.yaml"
FIGURE_IDS = (
    "fig-headline",
    "fig-arms",
    "fig-solve-rates",
    "fig-complexity",
    "fig-proposals",
    "fig-references",
    "fig-coverage",
    "fig-ratings",
    "fig-lineage",
    "fig-probe",
)
PNGS = (
    "headline.png",
    "arms.png",
    "solve_rates.png",
    "complexity.png",
    "proposals.png",
    "references.png",
    "coverage.png",
    "ratings.png",
    "lineage.png",
    "probe.png",
)


def _record(pm: PluginManager, run_dir: Path, overrides: list[str]) -> Path:
    recipe, resolved = load_recipe(RECIPE, overrides, pm.registry)
    execute(start_run(recipe, resolved, RunDir(run_dir), pm))
    return run_dir


def _write_probe(run_dir: Path, rows: list[tuple[int, str, str, str, str, float, int]]) -> None:
    """Probe records with their per-problem outcomes (the first accuracy x n problems solved), as the probe writes."""
    with open(run_dir / "probe.jsonl", "w") as fh:
        for step, member, version, role, task_type, accuracy, n in rows:
            record = {"step": step, "member": member, "version": version, "role": role, "task_type": task_type}
            correct = [1] * round(accuracy * n) + [0] * (n - round(accuracy * n))
            fh.write(json.dumps({**record, "accuracy": accuracy, "n": n, "correct": correct}) + "\n")


@pytest.fixture(scope="module")
def runs(tiny_model_dir, tmp_path_factory):
    """A 2T-2S population run with evolution and probe, its single-agent baseline, and a bare run."""
    root = tmp_path_factory.mktemp("report_runs")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("POPULORA_TEST_MODEL", str(tiny_model_dir))
        mp.setenv("HF_HUB_OFFLINE", "1")
        pm = PluginManager()
        pm.load_entry_points()
        pm.load_file(str(TESTS / "fake_stack.py"))
        pop = _record(pm, root / "pop", ["steps=4"])
        single = _record(
            pm,
            root / "single",
            ["steps=4", "population.mode=single_agent", "population.teachers=1", "population.students=1"],
        )
        bare = _record(pm, root / "bare", ["steps=2", "evolution.every=0"])
    alive = {m["id"] for m in json.loads((pop / "members.json").read_text())["members"] if m["role"] == "student"}
    s_a, s_b = sorted(alive)
    _write_probe(
        pop,
        [
            (0, "base", "base", "base", "deduction", 0.40, 10),
            (0, "base", "base", "base", "induction", 0.20, 30),
            (4, s_a, f"{s_a}@v1", "student", "deduction", 0.60, 10),
            (4, s_a, f"{s_a}@v1", "student", "induction", 0.40, 30),
            (4, s_b, f"{s_b}@v4", "student", "deduction", 0.20, 10),
            (4, s_b, f"{s_b}@v4", "student", "induction", 0.10, 30),
        ],
    )
    _write_probe(
        single,
        [
            (0, "base", "base", "base", "deduction", 0.40, 10),
            (0, "base", "base", "base", "induction", 0.20, 30),
            (4, "a0", "a0@v4", "both", "deduction", 0.30, 10),
            (4, "a0", "a0@v4", "both", "induction", 0.10, 30),
        ],
    )
    return {"pop": pop, "single": single, "bare": bare, "students": (s_a, s_b)}


@pytest.fixture(scope="module")
def multi(runs, tmp_path_factory):
    """The three runs side by side through the real console script, default output dir (./report)."""
    cwd = tmp_path_factory.mktemp("multi")
    res = invoke_cli("report", str(runs["pop"]), str(runs["single"]), str(runs["bare"]), cwd=cwd)
    assert res.returncode == 0, res.stderr
    return cwd, res


def _assert_self_contained(page: str, out_dir: Path, pngs: tuple[str, ...] = PNGS) -> None:
    refs = re.findall(r"""(?:src|href)\s*=\s*["']([^"']*)["']""", page, flags=re.I)
    assert refs, "the page embeds its figures"
    assert all(r.startswith("data:") or r.startswith("#") for r in refs), [r[:40] for r in refs]
    assert "<link" not in page.lower() and "<script" not in page.lower() and "url(" not in page
    # every figure is embedded byte for byte
    embedded = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    files = {(out_dir / name).read_bytes() for name in pngs}
    assert {base64.b64decode(e) for e in embedded} == files


def test_single_run_report_default_out_dir(runs):
    html_file = render_report([runs["pop"]])
    out = runs["pop"] / "report"
    assert html_file == out / "report.html" and html_file.is_file()
    for name in PNGS:
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, name
    page = html_file.read_text()
    _assert_self_contained(page, out)
    for fig_id in FIGURE_IDS:
        assert f'<section id="{fig_id}">' in page and f'id="{fig_id}-img" alt="' in page, fig_id
    for title in (
        "Change against the base model",
        "Arms side by side: the four dynamics",
        "Student solve rates over time",
        "Teacher program complexity over time",
        "Teacher proposals per step",
        "References shown to the teachers",
        "Cumulative problem-space coverage",
        "Rating curves per member",
        "Lineage tree with operators",
        "Probe accuracy per student vs base and baseline",
    ):
        assert f"<h2>{title}</h2>" in page
    assert 'id="summary-table"' in page and "test_noise" in page  # evolution events table names the operator


def test_summary_numbers_match_the_logs(runs, multi):
    s_a, _ = runs["students"]
    pop, single, bare = json.loads((multi[0] / "report" / "summary.json").read_text())
    assert (pop["mode"], single["mode"]) == ("population", "single_agent")
    # probe: n-weighted over task types at the last probe step
    acc_a, acc_b, base = (0.6 * 10 + 0.4 * 30) / 40, (0.2 * 10 + 0.1 * 30) / 40, (0.4 * 10 + 0.2 * 30) / 40
    assert pop["probe_step"] == 4
    assert pop["probe_best"] == pytest.approx(acc_a) and pop["probe_weakest"] == pytest.approx(acc_b)
    assert pop["probe_mean"] == pytest.approx((acc_a + acc_b) / 2)
    assert pop["base_accuracy"] == pytest.approx(base)
    assert pop["best_minus_base"] == pytest.approx(acc_a - base)
    assert pop["probe_best_member"] == f"{s_a}@v1"
    head = run_summary(runs["pop"])  # the changes and intervals of the run's terminal summary
    for key in ("student_changes", "best_minus_base_interval", "best_within_noise", "probe_problems"):
        assert pop[key] == head[key], key
    assert pop["probe_problems"] == 40 and pop["best_minus_base_interval"][0] > 0
    assert pop["baseline_accuracy"] == pytest.approx((0.3 * 10 + 0.1 * 30) / 40)
    assert single["probe_best"] == pytest.approx((0.3 * 10 + 0.1 * 30) / 40) and "baseline_accuracy" not in single
    # structure and compute counters agree with the run directory
    lineage = [json.loads(x) for x in (runs["pop"] / "lineage.jsonl").read_text().splitlines()]
    steps = [json.loads(x) for x in (runs["pop"] / "events.jsonl").read_text().splitlines()]
    steps = [r for r in steps if r["event"] == "step"]
    assert pop["final_step"] == 4 and single["final_step"] == 4
    assert pop["children_born"] == sum(r["operator"] != "init" for r in lineage) == 2
    assert single["children_born"] == 0 and bare["children_born"] == 0 and bare["probe_best"] is None
    # the loop's end of run wrote the run's own summary.json (before this test wrote probe.jsonl)
    end_of_run = json.loads((runs["pop"] / "summary.json").read_text())
    assert (end_of_run["steps"], end_of_run["children_born"], end_of_run["students"]) == (4, 2, {})
    assert (pop["members"], pop["teachers"], pop["students"]) == (4, 2, 2)
    members = json.loads((runs["pop"] / "members.json").read_text())["members"]
    for m in members:
        assert pop["counters_per_member"][m["id"]] == m["counters"]
    dead = {r["replaced"] for r in lineage if r.get("replaced")}
    for member in dead:  # replaced members keep the counters of their last logged step
        last = [r for r in steps if f"member/{member}/counters/tokens" in r][-1]
        assert pop["counters_per_member"][member]["tokens"] == last[f"member/{member}/counters/tokens"]
    assert pop["counters_total"]["tokens"] == sum(c["tokens"] for c in pop["counters_per_member"].values())
    single_tokens = single["counters_total"]["trained_tokens"]
    assert pop["per_slot_vs_baseline"] == pytest.approx(pop["counters_total"]["trained_tokens"] / 4 / single_tokens)


def test_multi_run_side_by_side_through_the_cli(runs, multi):
    cwd, res = multi
    out = cwd / "report"  # several runs: ./report by default
    assert res.stdout.strip() == str(Path("report") / "report.html")
    page = (out / "report.html").read_text()
    _assert_self_contained(page, out)
    for fig_id in FIGURE_IDS:
        assert f'<section id="{fig_id}">' in page
    for label in ("pop (fake-2t2s)", "single (fake-2t2s)", "bare (fake-2t2s)"):
        assert page.count(label) >= 3, label  # run list, summary row, counters table
    assert "the single-agent baseline" in page
    assert "bare (fake-2t2s): no probe.jsonl" in page  # the probe figure says which run has none
    # side by side: every per-run figure is much wider with three runs than with one
    from matplotlib.image import imread

    single_out = runs["pop"] / "report"
    if not (single_out / "report.html").exists():
        render_report([runs["pop"]])
    for name in ("solve_rates.png", "complexity.png", "coverage.png", "ratings.png", "lineage.png"):
        assert imread(out / name).shape[1] > 2 * imread(single_out / name).shape[1], name


def test_runs_with_missing_pieces_render_and_say_what_is_absent(runs, tmp_path):
    # a run that has written nothing but its recipe yet
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    shutil.copy(runs["bare"] / "recipe.yaml", fresh / "recipe.yaml")
    # a run killed mid-write: the torn last line is skipped and reported
    torn = tmp_path / "torn"
    shutil.copytree(runs["bare"], torn)
    with open(torn / "events.jsonl", "a") as fh:
        fh.write('{"event": "step", "step": 3, "member/t0/rew')
    run = load_run(torn)
    assert run.final_step == 2 and "events.jsonl: skipped 1 unreadable line(s)" in run.notes
    # with no probe.jsonl and no evolution: still every figure, and the page says what is missing
    out = tmp_path / "out"
    page = render_report([runs["bare"], fresh, torn], out).read_text()
    assert all(f'<section id="{i}">' in page for i in FIGURE_IDS)
    assert all((out / name).is_file() for name in PNGS)
    assert "no probe.jsonl: probe evaluation was not run" in page
    assert "bare (fake-2t2s): no evolution events (no children born)" in page
    assert "no events.jsonl" in page and "no members.json" in page
    assert "fresh (fake-2t2s): no student solve rates" in page
    assert "skipped 1 unreadable line" in page


def test_lineage_lanes_put_every_child_below_its_parent(runs):
    run = load_run(runs["pop"])
    order = _lanes(run)
    children = run.children()
    assert sorted(order) == sorted(run.member_ids()) and len(children) == 2  # steps 2 (none at the last step, 4)
    for rec in children:
        parent = rec["parents"][0].split("@")[0]
        assert order.index(rec["member"]) > order.index(parent)
    assert set(run.deaths()) == {r["replaced"] for r in children}
    assert all(run.births()[r["member"]] == r["step"] for r in children)


def test_duplicate_run_names_get_distinct_labels(runs, tmp_path):
    copy = tmp_path / "x" / "pop"
    shutil.copytree(runs["pop"], copy)
    labels = [r.label for r in load_runs([runs["pop"], copy])]
    assert len(set(labels)) == 2


def test_not_a_run_directory_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="is not a run directory"):
        load_run(tmp_path)
    res = invoke_cli("report", str(tmp_path))
    assert res.returncode == 2
    assert f"{tmp_path} is not a run directory (no recipe.yaml)" in res.stderr and "Traceback" not in res.stderr
    res = invoke_cli("report", str(tmp_path / "missing"))
    assert res.returncode == 2 and "no such run directory" in res.stderr
    (tmp_path / "recipe.yaml").write_text("- just\n- a list\n")
    with pytest.raises(UserError, match="not a recipe mapping"):
        load_run(tmp_path)


def test_problem_metrics_and_coverage_come_from_valid_proposals_only(tmp_path):
    from populora_report.data import RunData

    problems = [
        {"step": 1, "valid": True, "signature": "a", "metric_ast_depth": 2, "metric_loc": 3},
        {"step": 1, "valid": True, "signature": "b", "metric_ast_depth": 4, "metric_loc": 5},
        {"step": 1, "valid": False, "signature": "c", "metric_ast_depth": 40},
        {"step": 2, "valid": True, "signature": "a", "metric_ast_depth": 6, "metric_loc": None},
        {"step": 3, "valid": True, "signature": "d", "metric_ast_depth": 1},
    ]
    run = RunData(tmp_path, "r", "r", "population", {}, problems=problems)
    assert run.problem_metric_mean("ast_depth") == ([1, 2, 3], [3.0, 6.0, 1.0])
    assert run.problem_metric_mean("loc") == ([1], [4.0])
    assert run.proposal_coverage() == ([1, 2, 3], [2, 2, 3])


def test_proposal_series_come_from_the_step_records_and_induction_stays_out_of_complexity(runs):
    run = load_run(runs["pop"])
    steps = [r for r in RunDir(runs["pop"]).read_log("events.jsonl") if r["event"] == "step"]
    assert run.task_names("cut_off_rate") == ["count"] and run.task_names("references/shown") == []
    for metric in ("cut_off_rate", "input_chars", "distinct_programs", "valid_proposals", "token_nll"):
        xs, ys = run.task_series(metric)["count"]
        assert xs == [r["step"] for r in steps] and ys == [r[f"task/count/{metric}"] for r in steps], metric
    assert all(p["task_type"] == "count" and "teacher_program" not in p for p in run.problems or [])
    # the black complexity line leaves out what the teachers did not write
    run.problems = [*(run.problems or []), {"step": 1, "valid": True, "teacher_program": False, "metric_loc": 99}]
    assert 99 not in run.problem_metric_mean("loc")[1]


def test_references_figure_reads_the_reference_metrics_and_counts_overflows(tmp_path):
    run_dir = write_run(tmp_path / "refs", steps=6)
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    for rec in events:
        for task in ("deduction", "abduction"):
            rec |= {f"task/{task}/references/shown": 6.0, f"task/{task}/references/drawn": 6.0}
            rec |= {f"task/{task}/references/program_chars": 60.0, f"task/{task}/buffer/program_chars": 61.0}
            rec |= {f"task/{task}/references/over_budget": 1 if rec["step"] % 3 == 0 else 0}
            rec |= {f"task/{task}/prompt_tokens": 380.0, f"task/{task}/prompt_tokens_max": 480}
    (run_dir / "events.jsonl").write_text("".join(json.dumps(r) + "\n" for r in events))
    old = write_run(tmp_path / "old", steps=6)  # logs from before the proposal metrics
    run = load_run(run_dir)
    assert run.task_names("references/shown") == ["deduction", "abduction"]
    assert run.task_series("references/over_budget")["abduction"] == (list(range(1, 7)), [0, 0, 1, 0, 0, 1])
    page = render_report([run_dir, old], tmp_path / "out").read_text()
    assert "refs (synthetic-2t2s): 4 proposer prompts could not hold their K references in the budget" in page
    assert "old (synthetic-2t2s): no reference metrics in events.jsonl" in page
    assert "old (synthetic-2t2s): no proposal metrics in events.jsonl" in page
    assert all((tmp_path / "out" / name).is_file() for name in PNGS)


def test_two_arms_side_by_side_pool_their_seeds(tmp_path):
    """Runs differing only in seed are one arm; the page and dynamics.json give each arm's pooled measures."""
    from populora_report.dynamics import measure_run, pool
    from populora_report.render import dynamics_rows

    pop = [
        write_run(tmp_path / f"pop-{s}", seed=s, depth_slope=0.02, swing=0.15, students={"s0": 0.3 + 0.02 * s})
        for s in range(3)
    ]
    single = [
        write_run(tmp_path / f"single-{s}", name="synthetic-single", mode="single_agent", seed=s, students={"a0": 0.2})
        for s in range(3)
    ]
    res = invoke_cli("report", *map(str, pop + single), "--out", str(tmp_path / "out"))
    assert res.returncode == 0, res.stderr
    page = (tmp_path / "out" / "report.html").read_text()
    _assert_self_contained(page, tmp_path / "out")
    assert '<section id="fig-arms">' in page and "id='dynamics-table'" in page
    assert "synthetic-2t2s: 3 run(s), seeds 0, 1, 2" in page
    rows = json.loads((tmp_path / "out" / "dynamics.json").read_text())
    assert [(r["arm"], len(r["runs"])) for r in rows] == [("synthetic-2t2s", 3), ("synthetic-single", 3)]
    population, baseline = rows
    expected = pool([measure_run(r.steps, r.problems, r.probe) for r in map(load_run, pop)])
    assert population["pooled"].keys() == expected.keys()
    for key, stat in expected.items():
        assert population["pooled"][key] == pytest.approx(stat), key
    assert population["pooled"]["probe/mean"]["mean"] == pytest.approx(0.32)
    assert population["pooled"]["complexity_slope/ast_depth"]["low"] > 0  # the planted rise, seen in every seed
    assert population["pooled"]["oscillation/swings"]["mean"] > 3  # the planted swings
    assert baseline["pooled"]["oscillation/swings"]["mean"] == 0  # none planted
    assert baseline["pooled"]["probe/weakest"] == pytest.approx({"mean": 0.2, "low": 0.2, "high": 0.2, "n": 3})
    # different settings (here: steps) are different arms even under one recipe name
    other = write_run(tmp_path / "pop-short", steps=30)
    assert [r["arm"] for r in dynamics_rows(load_runs([pop[0], other]))] == [
        "pop-0 (synthetic-2t2s)",
        "pop-short (synthetic-2t2s)",
    ]


@pytest.fixture
def drawn(monkeypatch):
    """Every figure the report saves, by file name: the matplotlib Figure, to read its axes and texts."""
    from populora_report.figures import canvas

    saved = {}
    save = canvas.save

    def keep(fig, out_dir, name):
        save(fig, out_dir, name)
        saved[name] = fig

    monkeypatch.setattr(canvas, "save", keep)
    return saved


@pytest.fixture(scope="module")
def pair(runs, tmp_path_factory):
    """The report of the population run beside its single-agent baseline (report.html's path)."""
    return render_report([runs["pop"], runs["single"]], tmp_path_factory.mktemp("pair"))


def test_the_page_answers_in_the_terminal_summary_units(runs, pair):
    """Accuracies in %, changes in points with their 95 % intervals: the numbers `populora run` prints."""
    from populora_report.summary import _pct, _points

    page = pair.read_text()
    head = run_summary(runs["pop"])
    assert head["best_minus_base"] == pytest.approx(0.2) and head["best_minus_base_interval"] is not None
    headline = page[page.index("<section id='headline'>") : page.index("<section id='summary'>")]
    for version, change in head["student_changes"].items():
        assert change["interval"] is not None
        row = f"<td class='l'>{version}</td><td>{_pct(head['students'][version])}</td>"
        assert f"{row}<td>{_points(change['change'], change['interval'])}</td>" in headline
    best = _points(head["best_minus_base"], head["best_minus_base_interval"])
    assert f"<td class='l'>best − base</td><td></td><td>{best}</td><td class='l'>beyond noise</td>" in headline
    assert best in page[page.index('id="summary-table"') :]  # the summary table in points too
    assert "+20.0 points [" in best and "0.200" not in page and "0.450" not in page
    text = re.sub(r'src="data:[^"]*"', "", page)  # the words, not the embedded figures' bytes
    assert re.search(r"\bissue\b|target quantity|\bTODO\b", text, flags=re.I) is None


def test_population_vs_single_agent_shows_the_compute_ratio_and_warns_when_unfair(runs, pair, tmp_path, drawn):
    from populora_report.compare import compare

    def trained(run_dir):
        return sum(c["trained_tokens"] for c in load_run(run_dir).counters().values())

    pop, single = load_runs([runs["pop"], runs["single"]])
    found = compare(pop, single)
    ratio = trained(runs["pop"]) / 4 / trained(runs["single"])  # four slots, one adapter
    assert found.per_slot_ratio == pytest.approx(ratio) and found.steps == (4, 4)
    assert found.best_minus_agent == pytest.approx(0.45 - 0.15)  # the same probe problems: paired
    assert found.best_minus_agent_interval is not None
    page = pair.read_text()
    table = page[page.index("id='comparison-table'") :]
    assert f"<td>4 vs 4</td><td>{ratio:.2f}×</td>" in table
    assert ("not compute-matched" in page) == (abs(ratio - 1) > 0.1) and "different lengths" not in page
    # a baseline of 2 steps beside the 4-step population: a warning on the page and on each comparing figure
    short = tmp_path / "short"
    shutil.copytree(runs["single"], short)
    events = [json.loads(x) for x in (short / "events.jsonl").read_text().splitlines()]
    (short / "events.jsonl").write_text("".join(json.dumps(r) + "\n" for r in events if r.get("step", 0) <= 2))
    page = render_report([runs["pop"], short], tmp_path / "out").read_text()
    warning = "pop (fake-2t2s) vs short (fake-2t2s): different lengths: pop (fake-2t2s) ran 4 steps, short"
    assert "id='comparison-warnings'" in page and warning in page
    for name in ("headline.png", "probe.png", "arms.png"):
        assert warning in drawn[name]._supxlabel.get_text().replace("\n", " "), name


def test_compare_warns_on_steps_compute_and_base_model(tmp_path):
    from populora_report.compare import compare

    def run(name, steps=8, tokens=100.0, base_model="nano", slots=1):
        mode = "single_agent" if slots == 1 else "population"
        run_dir = write_run(tmp_path / name, mode=mode, steps=steps, students={f"s{i}": 0.3 for i in range(slots)})
        recipe = yaml.safe_load((run_dir / "recipe.yaml").read_text()) | {"base_model": base_model}
        (run_dir / "recipe.yaml").write_text(yaml.safe_dump(recipe))
        events = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
        events[-1] |= {f"member/s{i}/counters/trained_tokens": tokens for i in range(slots)}
        (run_dir / "events.jsonl").write_text("".join(json.dumps(r) + "\n" for r in events))
        return load_run(run_dir)

    pop = run("pop", slots=4)
    assert compare(pop, run("matched", tokens=105.0)).warnings == []
    assert compare(pop, run("matched", tokens=105.0)).per_slot_ratio == pytest.approx(100 / 105)
    assert [w.split(":")[0] for w in compare(pop, run("short", steps=2)).warnings] == ["different lengths"]
    assert [w.split(":")[0] for w in compare(pop, run("less", tokens=80.0)).warnings] == ["not compute-matched"]
    assert compare(pop, run("less", tokens=80.0)).total_ratio == pytest.approx(400 / 80)
    assert [w.split(":")[0] for w in compare(pop, run("other", base_model="x")).warnings] == ["different base models"]


def test_every_panel_is_labelled_and_the_ratings_name_every_member(runs, tmp_path, drawn):
    render_report([runs["pop"], runs["single"], runs["bare"]], tmp_path / "out")
    assert set(drawn) == set(PNGS)
    for name, fig in drawn.items():
        for ax in fig.axes:
            if not ax.axison:  # a panel that says why it is empty
                continue
            assert ax.get_ylabel(), (name, ax.get_title())
            assert ax.get_xlabel() or not ax.xaxis.get_visible(), (name, ax.get_title())  # a twin shares its x
    pop = load_run(runs["pop"])
    rated = {m for m in pop.member_ids() if pop.member_series(m, "rating_mu")[0]}
    assert len(rated) == 6  # four initial members and two children
    for ax in drawn["ratings.png"].axes[::3]:  # the population's column, both panels
        assert {t.get_text() for t in ax.texts} == rated


def test_line_end_labels_do_not_overlap():
    """18 lines ending close together: each named once, in its colour, no two labels overlapping."""
    from matplotlib.text import Text
    from populora_report.figures.canvas import END_LABEL, figure, label_ends

    fig, axes = figure(1, 1, 5, 3)
    ax = axes[0][0]
    for i in range(18):
        ax.plot([0, 10 + (i % 2)], [0, 1 + 0.01 * i], color=f"C{i % 10}", label=f"m{i}", gid=END_LABEL)
    ax.plot([0, 10], [0, 5], label="not a member")
    label_ends(fig)
    fig.draw_without_rendering()
    boxes = [Text.get_window_extent(t) for t in ax.texts]  # the label, without its leader line
    assert sorted(t.get_text() for t in ax.texts) == sorted(f"m{i}" for i in range(18))
    for i, a in enumerate(boxes):
        assert all(not a.overlaps(b) for b in boxes[i + 1 :])
        assert ax.get_window_extent().contains(a.x1 - 1, (a.y0 + a.y1) / 2)  # inside the panel, not cut off


def test_probe_axes_span_the_data_so_a_point_shows(tmp_path, drawn):
    """Students at 30 and 31 % against a base at 29 %: axes in percent spanning a few points, not 0-100 %."""
    run_dir = write_run(tmp_path / "close", students={"s0": 0.31, "s1": 0.30}, base=0.29)
    render_report([run_dir], tmp_path / "out")
    top, over_steps = drawn["probe.png"].axes
    for ax in (top, over_steps):
        low, high = ax.get_ylim()
        assert 20 < low < 29 and 31 < high < 40 and ax.get_ylabel().endswith("(%)")
    low, high = drawn["arms.png"].axes[-1].get_ylim()
    assert 20 < low < 29 and 31 < high < 40


LEVEL_PNGS = ("difficulty.png", "solve_rate_by_level.png")


def _titled(fig, title: str):
    (ax,) = [ax for ax in fig.axes if ax.get_title() == title]
    return ax


def _lines(ax) -> dict[str, tuple[list[float], list[float]]]:
    return {str(ln.get_label()): (list(ln.get_xdata()), list(ln.get_ydata())) for ln in ax.get_lines()}


def test_difficulty_figures_draw_every_member_of_a_population_beside_its_single_agent(tmp_path, drawn):
    """Teachers' proposal difficulty (a line each, all teachers in black) and each student's solve rate per level
    (a panel each, a line per level), one column per run: the numbers of events.jsonl, drawn as logged."""
    pop = write_run(tmp_path / "pop", steps=12, levels=4)
    agent = {"name": "synthetic-single", "mode": "single_agent", "students": {"a0": 0.2}}
    single = write_run(tmp_path / "single", steps=12, levels=4, **agent)
    out = tmp_path / "out"
    page = render_report([pop, single], out).read_text()
    _assert_self_contained(page, out, PNGS + LEVEL_PNGS)
    assert '<section id="fig-difficulty">' in page and '<section id="fig-solve-rate-by-level">' in page
    assert "<h2>Teachers&#x27; proposal difficulty over time</h2>" in page
    steps = [json.loads(line) for line in (pop / "events.jsonl").read_text().splitlines()]
    xs = [r["step"] for r in steps]

    teachers = _lines(_titled(drawn["difficulty.png"], "pop (synthetic-2t2s)"))
    assert set(teachers) == {"t0", "t1", "all teachers"}
    assert teachers["t0"] == (xs, [r["member/t0/difficulty"] for r in steps])
    assert teachers["all teachers"] == (xs, [r["teacher/difficulty"] for r in steps])
    assert set(_lines(_titled(drawn["difficulty.png"], "single (synthetic-single)"))) == {"a0", "all teachers"}

    by_level = drawn["solve_rate_by_level.png"]
    panels = {ax.get_title() for ax in by_level.axes if ax.axison}
    assert panels == {"pop (synthetic-2t2s): s0", "pop (synthetic-2t2s): s1", "single (synthetic-single): a0"}
    s1 = _lines(_titled(by_level, "pop (synthetic-2t2s): s1"))
    assert list(s1) == ["level 1", "level 2", "level 3", "level 4"]
    assert s1["level 2"] == (xs, [r["member/s1/solve_rate_at_level/2"] for r in steps])
    assert s1["level 4"][0] == [x for x in xs if x % 2 == 0]  # a step with none of a level has no point
    colours = [ln.get_color() for ln in _titled(by_level, "single (synthetic-single): a0").get_lines()]
    assert colours == [ln.get_color() for ln in _titled(by_level, "pop (synthetic-2t2s): s0").get_lines()]
    assert len(set(map(str, colours))) == 4  # the levels as colours, the same in every panel


def test_difficulty_figures_are_left_out_of_runs_that_logged_no_difficulty(tmp_path, drawn):
    with_levels, without = write_run(tmp_path / "levels", steps=6, levels=3), write_run(tmp_path / "plain", steps=6)
    out = tmp_path / "out"
    page = render_report([with_levels, without], out).read_text()
    assert "plain (synthetic-2t2s): no proposal difficulty in events.jsonl" in page  # beside a run that has it
    assert "plain (synthetic-2t2s): no solve rates per level in events.jsonl" in page
    assert all((out / name).is_file() for name in LEVEL_PNGS)
    drawn.clear()
    page = render_report([without], out).read_text()  # rendered again into the same directory
    assert "fig-difficulty" not in page and "fig-solve-rate-by-level" not in page and "difficulty level" not in page
    assert "proposal difficulty over time" not in page
    assert not any((out / name).exists() for name in LEVEL_PNGS) and set(drawn) == set(PNGS)
    _assert_self_contained(page, out)


def test_difficulty_of_several_tasks_is_drawn_per_task(tmp_path, drawn):
    """Two tasks declaring levels log under their names (``member/<id>/<task>/difficulty``): a row per task."""
    run_dir = write_run(tmp_path / "two", steps=4)
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    for rec in events:
        for task, level in (("add", 1.0), ("mul", 2.0)):
            rec |= {f"member/t0/{task}/difficulty": level, f"teacher/{task}/difficulty": level}
            rec |= {f"member/s0/{task}/solve_rate_at_level/{lv}": 0.5 for lv in (1, 2, 10)}
    (run_dir / "events.jsonl").write_text("".join(json.dumps(r) + "\n" for r in events))
    run = load_run(run_dir)
    assert run.difficulty_scopes() == ["add/", "mul/"] and run.level_members("mul/") == {"s0": [1, 2, 10]}
    assert run.level_members("") == {}
    render_report([run_dir], tmp_path / "out")
    for task, level in (("add", 1.0), ("mul", 2.0)):
        lines = _lines(_titled(drawn["difficulty.png"], f"two (synthetic-2t2s) ({task})"))
        assert lines["t0"] == ([1, 2, 3, 4], [level] * 4)
        panel = _titled(drawn["solve_rate_by_level.png"], f"two (synthetic-2t2s): s0 ({task})")
        assert list(_lines(panel)) == ["level 1", "level 2", "level 10"]


BROWSER = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
# The page has no script of its own: this one, put into a copy, says after loading which images did not decode
# and how wide the page is, where --dump-dom prints it.
CHECKER = """<script>window.addEventListener("load", () => {
  const broken = [...document.images].filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.id);
  document.body.setAttribute("data-broken", JSON.stringify(broken));
  document.body.setAttribute("data-width", document.documentElement.scrollWidth);
});</script>"""


def _browser(*args: str) -> subprocess.CompletedProcess:
    flags = ("--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--enable-logging=stderr", "--v=0")
    return subprocess.run([BROWSER, *flags, *args], capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(BROWSER is None, reason="no chromium to look at the page with (apt-get install chromium)")
def test_the_report_in_a_real_browser(pair, tmp_path):
    """The page of a population and its single-agent baseline, opened in headless Chromium: it renders (a
    screenshot with content), logs nothing to the console, decodes every figure and fits the window's width."""
    from matplotlib.image import imread

    page = pair
    shot = tmp_path / "report.png"
    res = _browser("--window-size=1400,2400", f"--screenshot={shot}", page.as_uri())
    assert res.returncode == 0, res.stderr[-2000:]
    console = [line for line in res.stderr.splitlines() if ":CONSOLE" in line]
    assert console == [], console
    pixels = imread(shot)
    assert pixels.shape[:2] == (2400, 1400) and pixels.std() > 0.05  # not a blank page
    checked = tmp_path / "checked.html"
    checked.write_text(page.read_text().replace("</head>", CHECKER + "</head>", 1))
    res = _browser("--window-size=1400,2400", "--dump-dom", checked.as_uri())
    assert res.returncode == 0, res.stderr[-2000:]
    broken = re.search(r'data-broken="([^"]*)"', res.stdout)
    assert broken is not None, res.stdout[:500]
    assert json.loads(html.unescape(broken.group(1))) == []
    assert [line for line in res.stderr.splitlines() if ":CONSOLE" in line] == []
    assert int(re.search(r'data-width="(\d+)"', res.stdout).group(1)) <= 1400  # no sideways scrolling


def test_a_render_killed_midway_leaves_the_previous_report_whole_and_the_next_one_cleans_up(
    runs, tmp_path, monkeypatch
):
    """The report is one set: a render that dies after some figures leaves the previous PNGs and page as they were
    (never a new figure beside an old report.html); a killed render's hidden folder goes with the next one."""
    from populora_report import render

    out = tmp_path / "out"
    render_report([runs["pop"]], out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def killed(runs_: object, out_dir: Path) -> None:
        raise KeyboardInterrupt  # as a Ctrl-C after three figures

    with monkeypatch.context() as patch:
        patch.setattr(render, "FIGURES", (*render.FIGURES[:3], killed))
        with pytest.raises(KeyboardInterrupt):
            render_report([runs["pop"], runs["single"]], out)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    dead = subprocess.Popen(["true"])
    dead.wait()
    left = tmp_path / f".out.{dead.pid}-0123abcd"  # what a SIGKILL'd render leaves
    left.mkdir()
    (left / "headline.png").write_bytes(b"partial")
    page = render_report([runs["pop"], runs["single"]], out)
    assert page == out / "report.html" and sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert sorted(p.name for p in out.iterdir()) == sorted([*PNGS, "summary.json", "dynamics.json", "report.html"])


def test_a_report_into_a_folder_with_other_files_is_refused(runs, tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(UserError, match=r"holds files a report does not write \(notes.txt\)"):
        render_report([runs["pop"]], out)
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
