"""populora_evals without sandbox or model: data, prompts/extraction, metrics, errors, CLI plumbing."""

from __future__ import annotations

import csv
import json
import math

import pytest

from populora_core import UserError
from populora_core.plugin.manager import reset_manager
from tests import evals_fixtures as F

pytest.importorskip("math_verify")

hub_cache = F.hub_cache  # the fixture: an empty, offline Hugging Face cache


@pytest.fixture
def evals_only(monkeypatch):
    """Only the evals plugin (other plugins are not under test here)."""
    monkeypatch.setenv("POPULORA_LOAD_PLUGINS", "evals")
    reset_manager()
    yield
    reset_manager()


def bench(name, **params):
    from populora_evals.evaluators import BENCHMARKS, EvaluatorParams

    return BENCHMARKS[name](EvaluatorParams(**params))


# --- shipped data ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name,count", [("humaneval", 164), ("mbpp", 500), ("gsm8k", 1319), ("math500", 500), ("aime24", 30), ("aime25", 15)]
)
def test_shipped_data_counts(name, count):
    b = bench(name, source="shipped")  # aime25's shipped copy (AIME I) is used only when asked for
    items = b.items()
    assert len(items) == count
    assert len({it["id"] for it in items}) == count
    files = b.data_files()
    assert len(files) == 1 and all(len(h) == 64 for h in files.values())
    assert b.items(3) == items[:3]


def test_math500_gold_is_last_boxed_of_solution():
    items = {it["id"]: it for it in bench("math500").items()}
    assert items["math500/0"]["answer"] == "\\left( 3, \\frac{\\pi}{2} \\right)"


def test_gsm8k_answers_are_plain_numbers():
    assert all(it["answer"].lstrip("-").replace(".", "").isdigit() for it in bench("gsm8k").items())


def test_mbpp_items_have_three_asserts_and_evalplus_prompt():
    items = bench("mbpp").items()
    assert all(len(it["tests"]) == 3 for it in items)
    assert items[0]["prompt"].startswith('"""\nWrite a python function') and "assert" in items[0]["prompt"]


def test_registered_evaluators_cover_the_paper(evals_only):
    from populora_evals.evaluators import PAPER_BENCHMARKS

    from populora_core.api.components import Evaluator
    from populora_core.plugin.manager import get_manager

    registry = get_manager().registry
    names = registry.names("evaluator")
    assert set(PAPER_BENCHMARKS) | {"humaneval", "mbpp"} == set(names)
    for name in ("aime24", "humaneval"):
        assert isinstance(registry.get("evaluator", name).build(), Evaluator)
    with pytest.raises(Exception, match="Extra inputs are not permitted"):
        registry.get("evaluator", "aime24").parse_params({"bogus": 1})


# --- local files and their errors --------------------------------------------------------------------


def test_local_files_load(tmp_path):
    hep = bench("humaneval_plus", path=str(F.write_evalplus(tmp_path))).items()
    assert [it["id"] for it in hep] == ["HumanEval/0", "HumanEval/1"]
    (tmp_path / "lcb").mkdir()
    lcb = bench("livecodebench", path=str(F.write_lcb(tmp_path / "lcb"))).items()
    assert [len(it["public_tests"]) for it in lcb] == [1, 1]  # private tests are decompressed when graded
    assert lcb[1]["func_name"] == "twoSum"
    by_dir = bench("livecodebench", path=str(tmp_path / "lcb")).items()
    assert len(by_dir) == 2
    recent = bench("livecodebench", path=str(tmp_path / "lcb"), start_date="2024-01-15").items()
    assert [it["id"] for it in recent] == ["lcb/1"]
    amc = bench("amc23", path=str(F.write_math(tmp_path))).items()
    assert [it["answer"] for it in amc] == ["2", "\\frac{1}{2}", "\\pm 2"]


def test_missing_local_data_names_benchmark_and_fields(tmp_path, hub_cache):
    with pytest.raises(UserError, match=r"humaneval_plus: no data offline.*--data humaneval_plus=PATH"):
        bench("humaneval_plus").items()
    with pytest.raises(UserError, match=r"olympiadbench: data file not found"):
        bench("olympiadbench", path=str(tmp_path / "nope.jsonl")).items()


@pytest.mark.parametrize(
    "name,content,match",
    [
        ("mbpp_plus", '{"task_id": "Mbpp/2", "prompt": "x"}\n', r"mbpp_plus: .* lacks field 'entry_point'.*EvalPlus"),
        ("humaneval_plus", "not json\n", r"humaneval_plus: cannot read .*expected EvalPlus jsonl"),
        (
            "livecodebench",
            '{"question_id": 1}\n',
            r"livecodebench: .* lacks field 'question_content'.*public_test_cases",
        ),
        ("minerva", '{"problem": "2+2"}\n', r"minerva: .* lacks field 'answer\|final_answer\|solution'"),
        ("amc23", "[1, 2]\n", r"amc23: .* record 1 is not a JSON object"),
        ("amc23", "", r"amc23: .* holds no records"),
    ],
)
def test_malformed_local_file_gives_clear_error(tmp_path, name, content, match):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(UserError, match=match):
        bench(name, path=str(path)).items()


def test_bad_lcb_tests_and_pickled_classes_are_refused(tmp_path):
    import base64
    import pickle
    import zlib

    from populora_evals.data.livecodebench import lcb_tests
    from populora_evals.data.records import SkippedRecordWarning

    row = dict(F.LCB_ROWS[0])
    row["private_test_cases"] = base64.b64encode(zlib.compress(pickle.dumps(UserError("x")))).decode()
    path = tmp_path / "lcb.jsonl"
    path.write_text(json.dumps(row) + "\n")
    (item,) = bench("livecodebench", path=str(path)).items()  # private tests are read when graded
    with pytest.raises(pickle.UnpicklingError, match=r"refusing to load"):
        lcb_tests(item)
    row["public_test_cases"] = row["private_test_cases"]
    path.write_text(json.dumps(row) + "\n")
    with (
        pytest.warns(SkippedRecordWarning),
        pytest.raises(UserError, match=r"livecodebench: no record of .*refusing"),
    ):
        bench("livecodebench", path=str(path)).items()


def test_cli_reports_bad_data_file_with_exit_code_2(tmp_path, evals_only, hub_cache):
    from click.testing import CliRunner

    from populora_core.cli.commands import cli

    bad = tmp_path / "amc.jsonl"
    bad.write_text('{"question": "1+1"}\n')
    base = str(fake_base(tmp_path))  # a hub id would need the hub cache (offline: a clear error of its own)
    result = CliRunner().invoke(cli, ["eval", base, "--benchmarks", "amc23", "--data", f"amc23={bad}"])
    assert result.exit_code == 2
    assert "amc23:" in result.output and "answer | final_answer" in result.output
    result = CliRunner().invoke(cli, ["eval", base, "--benchmarks", "aime24,nope"])
    assert result.exit_code == 2 and "unknown benchmark" in result.output
    result = CliRunner().invoke(cli, ["eval", base, "--benchmarks", "all"])
    assert result.exit_code == 2
    for name in ("humaneval_plus", "mbpp_plus", "livecodebench", "amc23", "minerva", "olympiadbench"):
        assert f"--data {name}=PATH" in result.output


# --- prompts and extraction --------------------------------------------------------------------------


def test_templates():
    from populora_evals import prompts

    p = prompts.math_prompt("What is 1+1?", "azr")
    assert p.startswith("A conversation between User and Assistant") and p.endswith(
        "User: What is 1+1?\nAssistant: <think>"
    )
    assert "\\boxed{}" in prompts.math_prompt("q", "azr_boxed")
    q = prompts.math_prompt("q", "qwen-boxed")
    assert q.startswith("<|im_start|>system") and q.endswith("<|im_start|>assistant\n")
    code = prompts.function_prompt("def f(x):\n", "evalplus")
    assert code.endswith("```python\n") and "self-contained Python script" in code
    assert prompts.lcb_prompt("Q", "", "azr").endswith("Assistant: <think>")
    assert "starter code" in prompts.lcb_prompt("Q", "class Solution:\n    pass", "azr")
    with pytest.raises(UserError, match="does not apply"):
        bench("aime24", template="evalplus")


@pytest.mark.parametrize(
    "text,template,expected",
    [
        (" x </think> <answer>42</answer>", "azr", "42"),
        (" x </think> <answer>so \\boxed{\\frac{1}{2}} done</answer>", "azr", "\\frac{1}{2}"),
        (" x </think> <answer>7", "azr", "7"),  # stop string removed the closing tag
        (" \\boxed{3} but no answer tag", "azr", ""),
        ("<answer>1</answer> then <answer>2</answer>", "azr_boxed", "2"),
        ("so \\boxed{a} and finally \\boxed{x^{2}}", "qwen-boxed", "x^{2}"),
        ("The answer is 12.", "qwen-boxed", "12"),
        ("we get 3, then 1,234", "qwen-boxed", "1234"),
    ],
)
def test_extract_math(text, template, expected):
    from populora_evals.prompts import extract_math

    assert extract_math(text, template) == expected


def test_extract_code():
    from populora_evals.prompts import extract_code

    assert extract_code("    return x\n```\nmore", "evalplus") == "    return x\n"
    assert extract_code("```python\ndef f():\n    pass\n```\n", "evalplus") == "def f():\n    pass\n"
    azr = "<think>plan</think> <answer>```python\ndef f():\n    return 1\n```</answer>"
    assert extract_code(azr, "azr") == "def f():\n    return 1"
    assert extract_code("no tags ```python\nx=1\n```", "azr") == ""


def test_main_guard_is_dropped_from_function_completions():
    from populora_evals.grading import strip_main_guard

    code = "def f(x):\n    return x\n\nif __name__ == '__main__':\n    n = int(input())\n    print(f(n))\ny = 1\n"
    assert strip_main_guard(code) == "def f(x):\n    return x\n\ny = 1\n"
    assert strip_main_guard("def f(:\n") == "def f(:\n"
    assert strip_main_guard("if __name__ != '__main__':\n    pass\n").startswith("if __name__ !=")


def test_assemble_body_or_full_function():
    from populora_evals.grading import assemble

    prompt = 'def f(x):\n    """doc"""\n'
    assert assemble(prompt, "    return x\n", "f") == prompt + "    return x\n\n"
    full = "def f(x):\n    return 2 * x\n"
    assert assemble(prompt, full, "f").endswith(full + "\n")


# --- math grading ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "gold,pred,ok",
    [
        ("\\frac{1}{2}", "0.5", True),
        ("\\frac{1}{2}", "1/2", True),
        ("\\frac{1}{2}", "\\frac{1}{3}", False),
        ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3, \\pi/2)", True),
        ("18", "18.0", True),
        ("18", "", False),
        ("\\$32,\\!348", "32348", True),
        ("\\$32,\\!348", "32349", False),
        ("204", "The answer is 204", True),
    ],
)
def test_math_equal(gold, pred, ok):
    from populora_evals.grading import math_equal

    assert math_equal(gold, pred) is ok


def test_math_benchmark_grades_only_answer_tag():
    b = bench("aime24")
    items = b.items(2)
    comps = [
        [f"</think> <answer>{items[0]['answer']}</answer>", f"\\boxed{{{items[0]['answer']}}}"],
        [f"</think> <answer>{int(items[1]['answer']) + 1}</answer>"],
    ]
    assert b.grade(items, comps) == [[True, False], [False]]


# --- metrics -----------------------------------------------------------------------------------------


def test_pass_at_k_matches_closed_form():
    from populora_evals.passk import pass_at_k, summarize

    for n, c, k in [(10, 3, 1), (10, 3, 5), (5, 0, 2), (5, 5, 3), (20, 1, 10)]:
        exact = 1.0 - math.comb(n - c, k) / math.comb(n, k)
        assert pass_at_k(n, c, k) == pytest.approx(exact, abs=1e-12)
    s = summarize([[True, False, False, False], [False] * 4, [True] * 4], ks=(1, 2, 8))
    assert s["accuracy"] == pytest.approx((0.25 + 0 + 1) / 3)
    assert s["pass@2"] == pytest.approx((0.5 + 0 + 1) / 3)
    assert "pass@8" not in s
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)


@pytest.mark.slow  # importing `evaluate` (datasets, pandas, pyarrow) takes seconds
def test_evaluate_loads_shipped_metric_offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from populora_evals.passk import load_metric, pass_at_k

    metric = load_metric()
    out = metric.compute(predictions=[1, 0, 3], references=[1, 1, 5], k=[1, 2])
    assert out["accuracy"] == pytest.approx((1 + 0 + 0.6) / 3)
    assert out["pass@1"] == pytest.approx(out["accuracy"])
    assert out["pass@2"] == pytest.approx(pass_at_k(5, 3, 2))  # only the n=5 problem supports k=2


# --- averages ----------------------------------------------------------------------------------------


def test_azr_averages():
    from populora_evals.groups import averages

    full = {
        "humaneval_plus": 80.0,
        "mbpp_plus": 70.0,
        "livecodebench": 30.0,
        "aime24": 20.0,
        "aime25": 10.0,
        "amc23": 60.0,
        "math500": 70.0,
        "minerva": 40.0,
        "olympiadbench": 40.0,
        "gsm8k": 99.0,
    }
    avg = averages(full)
    assert avg["code_avg"] == pytest.approx(60.0)
    assert avg["math_avg"] == pytest.approx(40.0)  # GSM8K is not in AZR's MAvg
    assert avg["overall"] == pytest.approx(50.0)
    shipped = averages({"humaneval": 10.0, "mbpp": 20.0, "aime24": 0.0, "math500": 30.0})
    assert shipped == {"code_avg": 15.0, "math_avg": 15.0, "overall": 15.0}
    assert averages({"gsm8k": 50.0}) == {"code_avg": None, "math_avg": None, "overall": None}


def test_the_average_columns_are_the_groups_the_plugin_defines(monkeypatch):
    """A group added to GROUPS is a column of its own, in AVG, in the header and in the table's foot."""
    from populora_evals import groups, report

    monkeypatch.setitem(groups.GROUPS, "school_avg", groups.Group("SAvg", ("gsm8k",)))
    avg = groups.averages({"humaneval": 10.0, "aime24": 20.0, "gsm8k": 60.0})
    assert avg == {"code_avg": 10.0, "math_avg": 20.0, "school_avg": 60.0, "overall": 30.0}
    assert groups.average_columns() == ["code_avg", "math_avg", "school_avg", "overall"]
    assert report.header({"benchmarks": {}}, "school_avg") == "SAvg"
    members = groups.average_members(["humaneval", "gsm8k"])
    assert members == {"code_avg": ["humaneval"], "math_avg": [], "school_avg": ["gsm8k"]}
    assert groups.footer(members) == (
        "CAvg = mean of humaneval; MAvg = mean of none; SAvg = mean of gsm8k; AVG = (CAvg + MAvg + SAvg) / 3 (AZR)."
    )


# --- the command, with a scripted engine --------------------------------------------------------------

ORACLE_ENGINE = "tests.evals_fixtures:make_oracle_engine"


def fake_base(tmp_path):
    """A directory that passes for a base model (it has a config.json), for targets to resolve against."""
    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text("{}")
    return base


def oracle_eval(target, **options):
    """``populora eval`` of aime24 with the oracle engine (the base model is right on the first 5 problems)."""
    from populora_evals.cli import run_eval

    return run_eval(target=str(target), benchmarks="aime24", engine=ORACLE_ENGINE, quiet=True, **options)


def test_eval_run_dir_population_baseline_outputs_and_cache(tmp_path, evals_only):
    from populora_evals.cli import run_eval

    base = fake_base(tmp_path)
    run = F.write_run(
        tmp_path / "run", str(base), [("s_good", "student", 3), ("s_bad", "student", 1), ("t0", "teacher", 2)]
    )
    baseline = F.write_run(tmp_path / "baseline", str(base), [("solo", "both", 5)], seed=10)
    F.CALLS.clear()
    res = run_eval(
        target=str(run), benchmarks="aime24,gsm8k", engine=ORACLE_ENGINE, limit=10, baseline=str(baseline), quiet=True
    )
    assert F.CALLS == [40, 40]  # base + 2 students + 1 baseline member, 10 problems, one call per benchmark
    rows = {s["label"]: s["row"] for s in res["subjects"]}
    assert set(rows) == {"base", "s_good@v3", "s_bad@v1", "baseline:solo@v5"}  # teachers skipped
    assert rows["base"]["aime24"] == 50.0 and rows["s_good@v3"]["aime24"] == 100.0
    assert rows["s_bad@v1"]["gsm8k"] == 0.0 and rows["baseline:solo@v5"]["aime24"] == 0.0
    assert rows["s_good@v3"]["math_avg"] == 100.0  # gsm8k is reported but not averaged (AZR)
    summary = res["summary"]
    assert summary["population mean"]["aime24"] == 50.0
    assert summary["population best"]["overall"] == 100.0 and summary["population weakest"]["overall"] == 0.0
    assert res["best_member"] == "s_good@v3" and res["weakest_member"] == "s_bad@v1"
    assert res["deltas"]["population mean - baseline"]["aime24"] == 50.0
    assert res["delta_reference"] == "baseline"
    assert all(len(h) == 64 for b in res["benchmarks"].values() for h in b["data_files"].values())
    out = run / "eval"
    for name in ("results.json", "results.md", "results.csv", "results.png"):
        assert (out / name).stat().st_size > 0
    md = (out / "results.md").read_text()
    assert "| population mean |" in md and "| Δ population mean - baseline |" in md and "AIME24" in md
    with open(out / "results.csv") as fh:
        table = list(csv.reader(fh))
    assert table[0][:3] == ["model", "aime24", "gsm8k"] and table[0][-3:] == ["code_avg", "math_avg", "overall"]
    sample = json.loads((out / "samples" / "s_good@v3" / "aime24.jsonl").read_text().splitlines()[0])
    assert sample["correct"] == [True] and sample["extracted"]
    # a rerun is free: everything comes from the cache, the engine is never built
    F.CALLS.clear()
    again = run_eval(
        target=str(run), benchmarks="aime24,gsm8k", engine=ORACLE_ENGINE, limit=10, baseline=str(baseline), quiet=True
    )
    assert F.CALLS == [] and again["summary"] == summary
    # a new member version is the only thing generated on the next run
    F.make_adapter(run / "adapters" / "s_bad@v2", None, seed=99)
    (run / "members.json").write_text(
        json.dumps(
            [{"id": "s_good", "role": "student", "version": 3}, {"id": "s_bad", "role": "student", "version": 2}]
        )
    )
    oracle_eval(run, limit=10, baseline=str(baseline))
    assert F.CALLS == [10]


def test_eval_ranks_by_the_benchmarks_that_ran_with_intervals_over_problems_paired_against_the_base(
    tmp_path, evals_only
):
    """Best and weakest by the mean over every benchmark that ran (AVG leaves GSM8K out, as it leaves nano_heldout);
    each score with its 95 % interval over problems, each member's difference from the base paired by problem."""
    from populora_evals.cli import run_eval
    from populora_evals.report import markdown

    base = fake_base(tmp_path)
    run = F.write_run(tmp_path / "run", str(base), [("s_gsm", "student", 1), ("s_aime", "student", 1)])
    options = {"benchmarks": "aime24,gsm8k", "engine": "tests.evals_fixtures:make_split_engine", "limit": 10}
    res = run_eval(target=str(run), quiet=True, **options)
    rows = {s["label"]: s["row"] for s in res["subjects"]}
    assert (rows["s_gsm@v1"]["gsm8k"], rows["s_gsm@v1"]["overall"]) == (100.0, 0.0)
    assert (rows["s_aime@v1"]["aime24"], rows["s_aime@v1"]["overall"]) == (20.0, 20.0)
    assert res["ranked_by"] == ["aime24", "gsm8k"]
    assert (res["best_member"], res["weakest_member"]) == ("s_gsm@v1", "s_aime@v1")  # 50 against 10

    intervals = res["intervals"]
    low, high = intervals["base"]["aime24"]  # 5 of 10 right
    assert low < 50.0 < high and high - low > 20.0
    assert intervals["s_gsm@v1"]["aime24"] == [0.0, 0.0] and intervals["s_gsm@v1"]["gsm8k"] == [100.0, 100.0]
    assert intervals["population mean"]["gsm8k"][0] <= 50.0 <= intervals["population mean"]["gsm8k"][1]
    paired = res["delta_intervals"]["s_aime@v1 - base"]["aime24"]  # right on 0-1, the base on 0-4: -30
    assert res["deltas"]["s_aime@v1 - base"]["aime24"] == -30.0 and paired[0] <= -30.0 <= paired[1] <= 0.0
    gain = res["delta_intervals"]["s_gsm@v1 - base"]["gsm8k"]  # the base 5 of 10, it all 10: +50
    assert 0.0 < gain[0] <= 50.0 <= gain[1] < 100.0
    table = markdown(res)
    assert "| 20.0 [" in table and "| Δ s_aime@v1 - base | -30.0 [" in table
    assert "Best member: s_gsm@v1; weakest: s_aime@v1 (by the mean score over the benchmarks that ran" in table
    again = run_eval(target=str(run), quiet=True, **options)  # from the cache: the same intervals
    assert again["intervals"] == intervals and again["delta_intervals"] == res["delta_intervals"]


def test_eval_names_a_missing_run_directory_rather_than_a_hub_model(tmp_path, evals_only, monkeypatch):
    from populora_evals.cli import run_eval

    F.write_run(tmp_path / "runs" / "nano", str(fake_base(tmp_path)), [("s0", "student", 1)])
    monkeypatch.chdir(tmp_path)
    for typo, hint in (("runs/nanoo", "did you mean runs/nano?"), ("./runs/nano-x", "did you mean runs/nano?")):
        with pytest.raises(UserError, match="no such run directory") as info:
            run_eval(target=typo, benchmarks="aime24", engine=ORACLE_ENGINE, quiet=True)
        assert hint in str(info.value) and "Hugging Face" not in str(info.value)


def test_eval_single_adapter_and_base_targets(tmp_path, evals_only):
    base = fake_base(tmp_path)
    adapter = F.make_adapter(tmp_path / "my_good_adapter", None, seed=1)
    cfg = json.loads((adapter / "adapter_config.json").read_text())
    cfg["base_model_name_or_path"] = str(base)
    (adapter / "adapter_config.json").write_text(json.dumps(cfg))
    res = oracle_eval(adapter, limit=4, out=str(tmp_path / "o1"))
    assert [s["label"] for s in res["subjects"]] == ["base", "my_good_adapter"]
    assert res["deltas"]["population mean - base"]["aime24"] == 0.0  # base gets the first 5 right
    res = oracle_eval(base, limit=10, out=str(tmp_path / "o2"))
    assert [s["label"] for s in res["subjects"]] == ["base"] and res["deltas"] == {}


def test_eval_argument_errors(tmp_path, evals_only):
    from populora_evals.cli import run_eval

    with pytest.raises(UserError, match="--temperature"):
        run_eval(target="x", benchmarks="aime24", n=4)
    with pytest.raises(UserError, match="--k values"):
        run_eval(target="x", benchmarks="aime24", n=2, temperature=0.7, ks="1,5")
    run = tmp_path / "run"
    run.mkdir()
    (run / "members.json").write_text(json.dumps([{"id": "s0", "role": "student", "version": 1}]))
    base = fake_base(tmp_path)
    (run / "recipe.yaml").write_text(f"base_model: {base}\n")
    with pytest.raises(UserError, match=r"member s0 version 1 has no adapter"):
        run_eval(target=str(run), benchmarks="aime24")
    with pytest.raises(UserError, match="not being evaluated"):
        run_eval(target=str(base), benchmarks="aime24", data={"amc23": "x.jsonl"})


def test_eval_reads_the_loops_run_layout(tmp_path, evals_only):
    """members.json as the loop writes it ({"members": [...], "next_index": ...}), base_model as a ref."""
    base = fake_base(tmp_path)
    run = F.write_run(tmp_path / "run", str(base), [("s_good", "student", 2), ("both_good", "both", 1)])
    (run / "recipe.yaml").write_text(f"name: x\nsteps: 3\nbase_model:\n  name: {base}\n  params: {{}}\n")
    members = json.loads((run / "members.json").read_text())
    (run / "members.json").write_text(json.dumps({"members": members, "next_index": {"s": 1}}))
    res = oracle_eval(run, limit=4, no_base=True)
    assert [s["label"] for s in res["subjects"]] == ["s_good@v2", "both_good@v1"]
    assert res["target"]["base_model"] == str(base.resolve()) and res["deltas"] == {}


def test_sampling_reports_unbiased_pass_at_k(tmp_path, evals_only):
    res = oracle_eval(fake_base(tmp_path), limit=10, n=4, temperature=0.8, ks="1,2,4", out=str(tmp_path / "o"))
    details = res["subjects"][0]["details"]["aime24"]
    # the oracle's base model is right on the first 5 problems, every sample
    assert details["pass@1"] == details["pass@4"] == 0.5 and details["score"] == 50.0
    assert res["settings"]["ks"] == [1, 2, 4] and res["settings"]["n"] == 4


def test_eval_params_reach_the_evaluators(tmp_path, evals_only):
    from populora_evals.cli import _kv, build_evaluators

    (tmp_path / "lcb").mkdir()
    lcb = F.write_lcb(tmp_path / "lcb")
    params = _kv(("livecodebench.start_date=2024-01-15", "livecodebench.tests_per_job=7"), "--eval-param")
    assert params == {"livecodebench.start_date": "2024-01-15", "livecodebench.tests_per_job": 7}
    (ev,) = build_evaluators(
        ["livecodebench"],
        {"livecodebench": str(lcb)},
        math_template=None,
        code_template=None,
        max_tokens=None,
        timeout_s=3.0,
        eval_params=params,
    )
    assert [it["id"] for it in ev.items()] == ["lcb/1"] and ev.params.tests_per_job == 7
    assert ev.params.timeout_s == 3.0 and ev.template == "azr" and ev.max_tokens == 8096
    with pytest.raises(UserError, match=r"BENCHMARK\.KEY=VALUE"):
        build_evaluators(
            ["aime24"],
            {},
            math_template=None,
            code_template=None,
            max_tokens=None,
            timeout_s=None,
            eval_params={"start_date": "x"},
        )
    with pytest.raises(UserError, match=r"evaluator 'livecodebench' \(plugin evals\): bogus: unknown key"):
        build_evaluators(
            ["livecodebench"],
            {"livecodebench": str(lcb)},
            math_template=None,
            code_template=None,
            max_tokens=None,
            timeout_s=None,
            eval_params={"livecodebench.bogus": 1},
        )


def test_base_model_can_use_its_own_math_template(tmp_path, evals_only):
    base = fake_base(tmp_path)
    run = F.write_run(tmp_path / "run", str(base), [("s_good", "student", 1)])
    F.CALLS.clear()
    F.REQUESTS.clear()
    res = oracle_eval(run, limit=4, base_math_template="qwen-boxed")
    assert F.CALLS == [4, 4]  # base and members differ in prompt and stop strings: one call each
    base_reqs = [r for r in F.REQUESTS if r[0] is None]
    member_reqs = [r for r in F.REQUESTS if r[0] is not None]
    assert all(
        p.startswith("<|im_start|>system") and stop == ("<|im_end|>", "<|endoftext|>") for _, p, stop in base_reqs
    )
    assert all(p.startswith("A conversation") and stop == ("</answer>",) for _, p, stop in member_reqs)
    details = {s["label"]: s["details"]["aime24"] for s in res["subjects"]}
    assert details["base"]["template"] == "qwen-boxed" and details["s_good@v1"]["template"] == "azr"
    assert details["base"]["score"] == 100.0  # the oracle's \boxed answers on the first 4 problems
    assert res["benchmarks"]["aime24"]["base_model_template"] == "qwen-boxed"


def test_engine_choice_follows_the_run_unless_told_otherwise():
    from populora_evals.cli import engine_choice

    recipe = {"engine": {"name": "vllm", "params": {"max_loras": 8, "dtype": "bfloat16"}}}
    assert engine_choice(recipe, None, {"dtype": "float16"}) == (
        "vllm",
        {"max_loras": 8, "dtype": "float16"},
        "run recipe",
    )
    assert engine_choice(recipe, "vllm", {}) == ("vllm", {"max_loras": 8, "dtype": "bfloat16"}, "--engine")
    assert engine_choice(recipe, "hf", {"device": "cpu"}) == ("hf", {"device": "cpu"}, "--engine")
    assert engine_choice({"engine": "vllm"}, None, None) == ("vllm", {}, "run recipe")
    assert engine_choice({}, None, None) == ("hf", {}, "default")


def test_eval_run_dir_uses_the_runs_engine_and_engine_overrides(tmp_path, evals_only):
    from click.testing import CliRunner

    from populora_core.cli.commands import cli

    base = fake_base(tmp_path)
    run = F.write_run(tmp_path / "run", str(base), [("s_good", "student", 1)])
    (run / "recipe.yaml").write_text(f"name: x\nsteps: 1\nbase_model: {base}\nengine: {{name: '{ORACLE_ENGINE}'}}\n")
    result = CliRunner().invoke(cli, ["eval", str(run), "--benchmarks", "aime24", "--limit", "4"])
    assert result.exit_code == 0, result.output
    settings = json.loads((run / "eval" / "results.json").read_text())["settings"]
    assert settings["engine"] == ORACLE_ENGINE and settings["engine_origin"] == "run recipe"
    result = CliRunner().invoke(cli, ["eval", str(run), "--benchmarks", "aime24", "--limit", "4", "--engine", "nope"])
    assert result.exit_code == 2 and "unknown engine 'nope'" in result.output  # --engine replaced the run's


def test_the_bases_own_default_set_and_prompts_longer_than_its_context_skipped_counted_never_generated(
    tmp_path, evals_only, tiny_model_dir, monkeypatch
):
    """Without --benchmarks a base's ``eval_benchmarks`` is what runs (``NAME:N``: its first N problems); a prompt
    that fills the model's context is not generated, not scored, and counted (results, table footnote, a note);
    the others get only the new tokens the context leaves."""
    import shutil
    from dataclasses import replace

    from populora_evals import target as T
    from populora_evals.cli import run_eval

    from populora_core.api.components import BaseModel

    base = tmp_path / "short-context"
    shutil.copytree(tiny_model_dir, base)
    prompts = [bench("aime24").prompt(item) for item in bench("aime24").items(10)]
    lengths = T.Target("base", BaseModel(str(base)), "", []).prompt_lengths(prompts)
    context = sorted(lengths)[6]  # 3 or 4 prompts reach it
    config = json.loads((base / "config.json").read_text())
    (base / "config.json").write_text(json.dumps({**config, "max_position_embeddings": context}))
    declared = replace(T.resolve_base_model(str(base)), eval_benchmarks=("aime24:10",))
    monkeypatch.setattr(T, "resolve_base_model", lambda *a, **k: declared)
    F.REQUESTS.clear()
    res = run_eval(target=str(base), engine=ORACLE_ENGINE, quiet=True, out=str(tmp_path / "out"))
    too_long = sum(n >= context for n in lengths)
    assert 0 < too_long < 10 and list(res["benchmarks"]) == ["aime24"] and res["settings"]["limits"] == {"aime24": 10}
    assert res["benchmarks"]["aime24"]["too_long"] == too_long
    assert res["benchmarks"]["aime24"]["n_items"] == res["subjects"][0]["details"]["aime24"]["n_items"] == 10 - too_long
    asked = [prompt for _, prompt, _ in F.REQUESTS]
    assert sorted(asked) == sorted(p for p, n in zip(prompts, lengths) if n < context)
    assert any(f"{too_long} of 10 prompts are longer than it: skipped, not scored" in note for note in res["notes"])
    assert (
        f"problems ({too_long} more longer than the model's context: skipped)"
        in (tmp_path / "out" / "results.md").read_text()
    )


def test_a_bar_counts_the_answers_and_shows_the_time_left(tmp_path, evals_only, capsys):
    from populora_evals.runner import Evaluation, Settings
    from populora_evals.target import resolve_target

    target = resolve_target(str(fake_base(tmp_path)))
    settings = Settings(limit=4, engine=ORACLE_ENGINE, progress=True)
    Evaluation(target, [bench("aime24")], settings, tmp_path / "out").run()
    shown = capsys.readouterr().err
    assert "4/4 answers" in shown and "eta" in shown and "aime24: grading" in shown
