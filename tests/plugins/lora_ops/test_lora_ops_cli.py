"""``populora evolve`` end to end: PEFT dirs in, a PEFT dir + lineage.json out, clear errors (exit 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from populora_lora_ops.synthetic import trained_like

from populora_core.api.lora import LoraFactors
from populora_core.cli.commands import cli
from populora_core.services.adapters import adapter_hash, load_lora, save_lora

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def evolve(*args: str):
    return CliRunner().invoke(cli, ["evolve", *args], catch_exceptions=False)


@pytest.fixture(scope="module")
def peft_parents(tiny_model_dir, tmp_path_factory) -> tuple[Path, Path]:
    """Two PEFT adapters on the tiny model, written by PEFT itself, with trained-looking (B != 0) weights."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    out = tmp_path_factory.mktemp("parents")
    dirs = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
        model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS, lora_dropout=0.0))
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0.0, 0.05)
        model.save_pretrained(out / f"p{seed}")
        dirs.append(out / f"p{seed}")
    return dirs[0], dirs[1]


def _logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits


@pytest.mark.slow
@pytest.mark.parametrize(
    "operator,extra",
    [("svd", ["--set", "weights=[0.7, 0.3]"]), ("della", []), ("svd_structured", []), ("layerwise", [])],
)
def test_child_loads_in_peft_and_equals_hand_merge(operator, extra, peft_parents, tiny_model_dir, tmp_path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    p1, p2 = peft_parents
    parents = ["--parent", str(p1)] + (["--parent", str(p2)] if operator != "svd_structured" else [])
    res = evolve(operator, *parents, "--out", str(tmp_path / "child"), "--seed", "3", *extra)
    assert res.exit_code == 0, res.output
    ids = torch.randint(3, 200, (2, 12), generator=torch.Generator().manual_seed(0))

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    base_logits = _logits(base, ids)
    peft_logits = _logits(PeftModel.from_pretrained(base, tmp_path / "child").eval(), ids)

    merged = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    child = load_lora(tmp_path / "child")
    assert len(child.modules) == 2 * len(TARGETS)  # 2 layers of the tiny model
    with torch.no_grad():
        for name, f in child.items():
            merged.get_submodule(name.removeprefix("base_model.model.")).weight += f.delta()
    hand_logits = _logits(merged, ids)
    assert torch.allclose(peft_logits, hand_logits, atol=1e-5, rtol=1e-4)
    assert not torch.allclose(peft_logits, base_logits, atol=1e-3)


def test_lineage_record_and_reproducible_bytes(peft_parents, tmp_path) -> None:
    p1, p2 = peft_parents

    def dare_child(out: str, seed: str):
        parents = ["--parent", str(p1), "--parent", str(p2)]
        return evolve("dare", *parents, "--out", str(tmp_path / out), "--seed", seed, "--set", "density=0.5")

    for out in ("a", "b"):
        res = dare_child(out, "11")
        assert res.exit_code == 0, res.output
    a = (tmp_path / "a" / "adapter_model.safetensors").read_bytes()
    assert a == (tmp_path / "b" / "adapter_model.safetensors").read_bytes()
    record = json.loads((tmp_path / "a" / "lineage.json").read_text())
    assert record["operator"] == "dare" and record["seed"] == 11 and record["plugin"] == "lora_ops"
    assert record["params"]["density"] == 0.5
    assert [p["hash"] for p in record["parents"]] == [adapter_hash(p1), adapter_hash(p2)]
    assert [p["path"] for p in record["parents"]] == [str(p1.resolve()), str(p2.resolve())]
    assert record["hash"] == adapter_hash(tmp_path / "a")
    config = json.loads((tmp_path / "a" / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["lora_alpha"] == 8
    dare_child("c", "12")
    assert (tmp_path / "c" / "adapter_model.safetensors").read_bytes() != a


@pytest.fixture()
def small_parents(tmp_path) -> dict[str, Path]:
    shapes = {f"base_model.model.model.layers.0.self_attn.{m}": (16, 16) for m in ("q_proj", "v_proj")}
    dirs = {}
    for key, (seed, rank, alpha) in {
        "p1": (1, 4, 8.0),
        "p2": (2, 4, 8.0),
        "r2": (3, 2, 4.0),
        "a16": (4, 4, 16.0),
    }.items():
        save_lora(trained_like(shapes, rank, alpha, seed), tmp_path / key)
        dirs[key] = tmp_path / key
    other = trained_like(shapes, 4, 8.0, 5)
    k = next(iter(other.modules))
    f = other.modules[k]
    other.modules[k] = LoraFactors(f.A[:, :8].contiguous(), f.B, f.scale)
    save_lora(other, tmp_path / "shape")
    dirs["shape"] = tmp_path / "shape"
    (tmp_path / "empty").mkdir()
    dirs["empty"] = tmp_path / "empty"
    save_lora(trained_like(shapes, 4, 8.0, 6), tmp_path / "truncated")  # a copy cut short
    weights = tmp_path / "truncated" / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    dirs["truncated"] = tmp_path / "truncated"
    save_lora(trained_like(shapes, 4, 8.0, 7), tmp_path / "badjson")
    (tmp_path / "badjson" / "adapter_config.json").write_text('{"r": 4,')
    dirs["badjson"] = tmp_path / "badjson"
    return dirs


@pytest.mark.parametrize(
    "case,args,message",
    [
        ("missing dir", ["svd", "--parent", "{p1}", "--parent", "{tmp}/nope"], "adapter directory not found"),
        ("not an adapter", ["svd", "--parent", "{p1}", "--parent", "{empty}"], "not a PEFT adapter directory"),
        ("truncated weights", ["svd", "--parent", "{p1}", "--parent", "{truncated}"], "not a readable safetensors"),
        ("broken config", ["svd", "--parent", "{p1}", "--parent", "{badjson}"], "adapter_config.json: not valid JSON"),
        ("rank mismatch", ["svd", "--parent", "{p1}", "--parent", "{r2}"], "differ in r"),
        ("alpha mismatch", ["svd", "--parent", "{p1}", "--parent", "{a16}"], "differ in lora_alpha"),
        ("shape mismatch", ["svd", "--parent", "{p1}", "--parent", "{shape}"], "differ in the shape of"),
        ("unknown operator", ["crossbreed", "--parent", "{p1}"], "unknown operator 'crossbreed'"),
        (
            "unknown param",
            ["dare", "--parent", "{p1}", "--parent", "{p2}", "--set", "densty=0.3"],
            "densty: unknown key (did you mean density?)",
        ),
        ("bad value", ["gaussian", "--parent", "{p1}", "--set", "eps=lots"], "eps:"),
        ("out of range", ["dare", "--parent", "{p1}", "--parent", "{p2}", "--set", "density=2"], "density:"),
        ("not key=value", ["gaussian", "--parent", "{p1}", "--set", "eps"], "expected key=value"),
        ("parent count", ["gaussian", "--parent", "{p1}", "--parent", "{p2}"], "takes exactly 1 parent(s), got 2"),
        ("too few parents", ["svd", "--parent", "{p1}"], "takes 2 or more parent(s), got 1"),
        (
            "weights length",
            ["svd", "--parent", "{p1}", "--parent", "{p2}", "--set", "weights=[1, 2, 3]"],
            "weights has 3 entries",
        ),
        ("out exists", ["clone", "--parent", "{p1}", "--out", "{p2}"], "exists"),
    ],
)
def test_bad_input_exits_2_with_a_message(case, args, message, small_parents, tmp_path) -> None:
    fmt = {k: str(v) for k, v in small_parents.items()} | {"tmp": str(tmp_path)}
    argv = [a.format(**fmt) for a in args]
    if "--out" not in argv:
        argv += ["--out", str(tmp_path / "child")]
    res = CliRunner().invoke(cli, ["evolve", *argv, "--seed", "0"])
    assert res.exit_code == 2, (case, res.output)
    assert "Error:" in res.output and message in res.output, (case, res.output)
    assert "Traceback" not in res.output
    assert not (tmp_path / "child").exists()


def test_missing_seed_is_a_usage_error(small_parents, tmp_path) -> None:
    res = CliRunner().invoke(
        cli, ["evolve", "clone", "--parent", str(small_parents["p1"]), "--out", str(tmp_path / "c")]
    )
    assert res.exit_code == 2 and "--seed" in res.output
