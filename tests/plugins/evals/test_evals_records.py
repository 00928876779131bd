"""The record kinds of the real benchmark data that once stopped a benchmark or were graded wrong.

Each fixture (tests/evals_fixtures.py) is hand-written in the shape of one kind: complex-number inputs
(Mbpp/124, 252), ``plus_input: {}`` (Mbpp/793), a 4-argument assertion (Mbpp/581), ``re.Match`` outputs
(Mbpp/737), set outputs and tuple inputs (Mbpp/579, Mbpp/2), a 5,000-digit literal, a RecursionError,
OlympiadBench's ``$a$,$b$`` golds, and LiveCodeBench's date cut-off, preamble and lazy private tests.
"""

from __future__ import annotations

import json
import warnings

import pytest

from populora_core import UserError, get_registry
from populora_core.plugin.manager import reset_manager
from tests import evals_fixtures as F

pytest.importorskip("pyarrow")


@pytest.fixture(scope="module")
def executor():
    reset_manager()
    if "sandbox" not in get_registry().names("executor"):
        pytest.skip("no `sandbox` executor registered")
    from populora_evals.runner import make_executor

    ex = make_executor("sandbox")
    yield ex
    ex.close()
    reset_manager()


@pytest.fixture
def evals_only(monkeypatch):
    monkeypatch.setenv("POPULORA_LOAD_PLUGINS", "evals,sandbox")
    reset_manager()
    yield
    reset_manager()


def bench(name, **params):
    from populora_evals.evaluators import BENCHMARKS, EvaluatorParams

    return BENCHMARKS[name](EvaluatorParams(**params))


def loaded(name, path, **params):
    """The benchmark's items, and the warnings about skipped records loading them raised."""
    from populora_evals.data.records import SkippedRecordWarning

    b = bench(name, path=str(path), **params)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        items = b.items()
    return b, items, [str(w.message) for w in caught if issubclass(w.category, SkippedRecordWarning)]


# --- MBPP+ from the hub: every record kind loads; the unreadable one is skipped, named and counted -------


def test_mbpp_plus_hub_loads_every_kind_and_skips_only_the_unreadable_record(tmp_path):
    b, items, warned = loaded("mbpp_plus", F.write_mbpp_plus_hub(tmp_path))
    by_id = {it["id"]: it for it in items}
    assert sorted(by_id) == ["Mbpp/124", "Mbpp/435", "Mbpp/579", "Mbpp/581", "Mbpp/737"]
    assert by_id["Mbpp/124"]["base_input"][0] == (0.0, 1j)  # complex numbers, the tuple kept
    assert by_id["Mbpp/579"]["base_input"][0] == ((3, 4, 5, 6), (5, 7, 4, 10))  # tuple inputs stay tuples
    assert by_id["Mbpp/435"]["base_input"][0] == [F.BIG]  # the 5,000-digit literal
    assert by_id["Mbpp/581"]["atol"] == 0.0001  # the LAST argument of a 4-argument assertion
    assert by_id["Mbpp/124"]["atol"] == 0.0001
    assert len(warned) == 1 and "record 6 (901)" in warned[0] and "RecursionError" in warned[0]
    assert b.skipped() == warned and b.dataset()["skipped"] == 1 and b.dataset()["n_problems"] == 5


@pytest.mark.parametrize("kind", ["complex", "four_args", "re_match", "set_output", "big_literal"])
def test_mbpp_plus_hub_kind_grades_like_evalplus(kind, tmp_path, executor):
    b = bench("mbpp_plus", path=str(F.write_mbpp_plus_hub(tmp_path, [kind])), timeout_s=5)
    items = b.items()
    (item,) = items
    right, wrong = F.MBPP_PLUS_HUB_COMPLETIONS[kind]
    completions = [[item["canonical_solution"], *right, *wrong]]
    expected = [[True] * (1 + len(right)) + [False] * len(wrong)]
    assert b.grade(items, completions, executor) == expected, kind


def test_a_wholly_unreadable_file_is_one_clear_error(tmp_path):
    path = F.write_mbpp_plus_hub(tmp_path, ["recursion"])
    with pytest.raises(
        UserError, match=r"mbpp_plus: no record of .* can be read \(record 1 \(901\): .*expected EvalPlus"
    ):
        bench("mbpp_plus", path=str(path)).items()


# --- MBPP+ release file: EvalPlus's input types, plus_input {} --------------------------------------------


def test_mbpp_plus_release_records_load_with_evalplus_types(tmp_path):
    _, items, warned = loaded("mbpp_plus", F.write_mbpp_plus_release(tmp_path))
    by_id = {it["id"]: it for it in items}
    assert warned == [] and len(items) == 4
    assert by_id["Mbpp/793"]["plus_input"] == []  # written {} in the release file
    assert by_id["Mbpp/124"]["base_input"][0] == (0.0, 1j) and isinstance(
        by_id["Mbpp/124"]["plus_input"][0][1], complex
    )
    assert by_id["Mbpp/252"]["base_input"] == [[complex(1)], [complex(4)]]
    assert by_id["Mbpp/252"]["plus_input"][0] == [1 + 2j]
    assert by_id["Mbpp/2"]["base_input"][0] == [(3, 4, 5, 6), (5, 7, 4, 10)]


def test_mbpp_plus_release_canonical_solutions_pass(tmp_path, executor):
    b = bench("mbpp_plus", path=str(F.write_mbpp_plus_release(tmp_path)), timeout_s=5)
    items = b.items()
    base, plus = b.grade_detailed(items, [[it["canonical_solution"]] for it in items], executor)
    assert base == plus == [[True]] * 4
    reversed_order = "def similar_elements(a, b):\n    return tuple(sorted(set(a) & set(b), reverse=True))\n"
    assert b.grade([items[3]], [[reversed_order]], executor) == [[True]]  # a set task: any order


# --- math golds ----------------------------------------------------------------------------------------


def test_olympiad_golds_lose_every_dollar_and_their_units(tmp_path):
    path = tmp_path / "olympiad.parquet"
    path.write_bytes(F.parquet(F.OLYMPIAD_ROWS))
    b = bench("olympiadbench", path=str(path))
    assert [it["answer"] for it in b.items()] == ["69,84", "12", "90"]
    written = [
        " </think> <answer>\\boxed{69, 84}</answer>",
        " </think> <answer>\\boxed{12}</answer>",
        " </think> <answer>\\boxed{90}</answer>",
    ]
    assert b.grade(b.items(), [[w] for w in written]) == [[True], [True], [True]]
    assert b.grade(b.items()[:1], [[" </think> <answer>\\boxed{69}</answer>"]]) == [[False]]


# --- LiveCodeBench ------------------------------------------------------------------------------------------


def test_lcb_date_window_is_lcb_runners(tmp_path):
    rows = [
        {**F.LCB_ROWS[1], "question_id": str(k), "contest_date": d}
        for k, d in enumerate(
            ["2024-01-31T23:59:00", "2024-02-01T00:00:00", "2024-02-01T18:30:00", "2024-02-02T00:00:00"]
        )
    ]
    path = tmp_path / "test.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    window = bench("livecodebench", path=str(path), start_date="2024-02-01", end_date="2024-02-01").items()
    assert [it["id"] for it in window] == ["lcb/1"]  # midnight to midnight, as lcb_runner compares datetimes


def test_lcb_private_tests_stay_compressed_until_graded(tmp_path, executor):
    from populora_evals.data.livecodebench import lcb_tests

    b = bench("livecodebench", path=str(F.write_lcb(tmp_path)), timeout_s=2)
    items = b.items()
    assert all("tests" not in it and "raw" not in it["private_tests"] for it in items)  # only where the line is
    assert [len(lcb_tests(it)) for it in items] == [3, 2]
    wrap = "<think>plan</think> <answer>{}</answer>".format
    assert b.grade(items, [[wrap(F.LCB_SOLUTIONS[it["id"]])] for it in items], executor) == [[True], [True]]


def test_lcb_unreadable_record_is_skipped_and_counted(tmp_path):
    import base64
    import pickle
    import zlib

    bad = dict(F.LCB_ROWS[0], question_id="bad_one", public_test_cases="not json {")
    pickled = dict(F.LCB_ROWS[0], question_id="pickled")
    pickled["public_test_cases"] = base64.b64encode(zlib.compress(pickle.dumps(UserError("x")))).decode()
    path = tmp_path / "test.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in [bad, F.LCB_ROWS[1], pickled]) + "{broken json\n")
    b, items, warned = loaded("livecodebench", path)
    assert [it["id"] for it in items] == ["lcb/1"]
    assert len(warned) == 3 and b.dataset()["skipped"] == 3
    assert "record 1 (bad_one)" in warned[0] and "refusing to load" in warned[1] and "record 4" in warned[2]


def test_lcb_preamble_is_lcb_runners_for_stdin_programs_too(tmp_path, executor):
    b = bench("livecodebench", path=str(F.write_lcb(tmp_path)), timeout_s=2)
    item = b.items()[0]  # stdin: print A+B
    uses_preamble = "<answer>```python\nq = deque(map(int, stdin.readline().split()))\nprint(sum(q))\n```</answer>"
    assert b.grade([item], [[uses_preamble]], executor) == [[True]]


# --- results and the CLI -------------------------------------------------------------------------------------


def test_check_gold_on_hub_layout_fixtures(tmp_path, evals_only, hub_cache):
    from click.testing import CliRunner

    from populora_core.cli.commands import cli

    olympiad = tmp_path / "olympiad.parquet"
    olympiad.write_bytes(F.parquet(F.OLYMPIAD_ROWS))
    (tmp_path / "lcb").mkdir()
    args = [
        "eval",
        "--check-gold",
        "mbpp_plus,olympiadbench,livecodebench",
        "--data",
        f"mbpp_plus={F.write_mbpp_plus_hub(tmp_path)}",
        "--data",
        f"olympiadbench={olympiad}",
        "--data",
        f"livecodebench={F.write_lcb(tmp_path / 'lcb')}",
        "--timeout",
        "5",
    ]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "mbpp_plus: 5 loaded, 1 skipped, gold graded right 5/5 (100.0%)" in lines
    assert any(line.startswith("  skipped: mbpp_plus: skipped ") and "RecursionError" in line for line in lines)
    assert "olympiadbench: 3 loaded, 0 skipped, gold graded right 3/3 (100.0%)" in lines
    assert (
        "livecodebench: 2 loaded, 0 skipped, tests readable (no reference programs in the dataset) 2/2 (100.0%)"
        in lines
    )


def test_check_gold_exits_1_naming_a_wrong_gold(tmp_path, evals_only, hub_cache):
    from click.testing import CliRunner

    from populora_core.cli.commands import cli

    row = dict(F.MBPP_PLUS_RELEASE_RECORDS[0], canonical_solution="def last(arr, x):\n    return 1 // 0\n")
    path = tmp_path / "MbppPlus.jsonl"
    path.write_text(json.dumps(row) + "\n")
    result = CliRunner().invoke(cli, ["eval", "--check-gold", "mbpp_plus", "--data", f"mbpp_plus={path}"])
    assert result.exit_code == 1
    assert (
        "gold graded right 0/1" in result.output
        and "WRONG Mbpp/793: input 1 of 2: gold: ZeroDivisionError" in result.output
    )


def test_wrong_shape_is_one_line_exit_2(tmp_path, evals_only, hub_cache):
    from click.testing import CliRunner

    from populora_core.cli.commands import cli

    path = tmp_path / "MbppPlus.jsonl"
    path.write_text(json.dumps({"task_id": "Mbpp/2", "prompt": "x"}) + "\n")
    result = CliRunner().invoke(cli, ["eval", "--check-gold", "mbpp_plus", "--data", f"mbpp_plus={path}"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    (line,) = [line for line in result.output.splitlines() if line.strip()]
    assert str(path) in line and "record 1" in line and "entry_point" in line and "expected EvalPlus" in line


hub_cache = F.hub_cache


ALL_TWELVE = (
    "humaneval,mbpp,gsm8k,math500,aime24,aime25,amc23,minerva,olympiadbench,humaneval_plus,mbpp_plus,livecodebench"
)


def test_check_gold_on_every_hub_layout_fixture(evals_only, hub_cache):
    """Every benchmark's hub layout (tests/evals_fixtures.py) through the self-check: all gold right."""
    from click.testing import CliRunner

    from populora_core.cli.commands import cli

    F.populate_hub(hub_cache)
    hub = [f"--eval-param={name}.source=hub" for name in ("humaneval", "mbpp", "gsm8k", "math500", "aime24")]
    result = CliRunner().invoke(cli, ["eval", "--check-gold", ALL_TWELVE, "--timeout", "5", *hub])
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if not line.startswith(" ")]
    assert len(lines) == 12 and all(line.endswith("(100.0%)") and " 0 skipped" in line for line in lines), lines


@pytest.mark.slow
def test_check_gold_on_every_shipped_benchmark(evals_only):
    """The shipped files (humaneval, mbpp, gsm8k, math500, aime24): every gold graded right."""
    from click.testing import CliRunner

    from populora_core.cli.commands import cli

    # Mbpp/123's reference takes 5-10 s on a shared 2-core box: a generous per-test limit
    result = CliRunner().invoke(cli, ["eval", "--check-gold", "shipped", "--timeout", "60"])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [
        "humaneval: 164 loaded, 0 skipped, gold graded right 164/164 (100.0%)",
        "mbpp: 500 loaded, 0 skipped, gold graded right 500/500 (100.0%)",
        "aime24: 30 loaded, 0 skipped, gold graded right 30/30 (100.0%)",
        "math500: 500 loaded, 0 skipped, gold graded right 500/500 (100.0%)",
        "gsm8k: 1319 loaded, 0 skipped, gold graded right 1319/1319 (100.0%)",
    ]


def test_humaneval_plus_reads_the_parquet_datasets_serves_and_the_three_pins(hub_cache):
    from populora_evals.evaluators import BENCHMARKS

    assert BENCHMARKS["humaneval"].hub.revision == "7dce6050a7d6d172f3cc5c32aa97f52fa1a2e544"
    assert BENCHMARKS["mbpp_plus"].hub.revision == "b2d74c91837c3f2a20c1299ae98133cbe7cfa077"
    assert BENCHMARKS["minerva"].hub.revision == "ee46ddc498933b1977577953250ca5c66be64f96"
    assert all(len(cls.hub.revision) == 40 for cls in BENCHMARKS.values())  # every dataset pinned to a commit
    repo, rel, blob, _ = F.hub_datasets()["humaneval_plus"]
    row = json.loads(blob)
    files = {rel: blob, "data/test-00000-of-00001.parquet": F.parquet([{**row, "task_id": "HumanEval/parquet"}])}
    F.write_hub_cache(hub_cache, repo, BENCHMARKS["humaneval_plus"].hub.revision, files)
    b = bench("humaneval_plus")
    assert [it["id"] for it in b.items()] == ["HumanEval/parquet"]
    assert list(b.dataset()["files"]) == ["data/test-00000-of-00001.parquet"]
