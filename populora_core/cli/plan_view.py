"""The table ``populora plan`` prints of a plan (:mod:`populora_core.run.plan` computes it), and its verdict."""

from __future__ import annotations

from typing import Any

from ..services.gpu import params_text


def does_not_fit(plan: dict[str, Any]) -> bool:
    return str(plan["verdict"]).startswith("does not fit")


def format_plan(plan: dict[str, Any]) -> str:
    """The table ``populora plan`` prints; the last line is the verdict."""
    d = plan["disk"]
    members = f"{plan['members']} member{'s' if plan['members'] != 1 else ''}"
    assumed = (
        " (assumed: no GPU is visible here; --gpu-memory sets it)" if plan.get("gpu_memory_from") == "assumed" else ""
    )
    if str(plan.get("gpus_from", "")).startswith("cluster"):
        assumed += f" (GPUs: the recipe's {plan['gpus_from']}; --gpus sets them)"
    lines = [
        f"{plan['recipe']}: {members} on {plan['gpus']} x {plan['gpu_gib']:.1f} GiB{assumed} "
        f"({plan['members_per_gpu']} per GPU); model config {plan['model']}",
        f"base {params_text(plan['base_params'])} params; one LoRA adapter {params_text(plan['lora_params'])} params",
        "",
        f"{'per GPU':<30}{'GiB':>8}  detail",
        *(f"{r['what']:<30}{r['gib']:>8.2f}  {r['detail']}" for r in plan["rows"]),
        f"{'peak while generating':<30}{plan['generation_gib']:>8.2f}",
        f"{'peak while training':<30}{plan['training_gib']:>8.2f}",
        "",
        f"host RAM per GPU's process (beyond Python and its libraries): up to {plan['host_gib']:.1f} GiB"
        + (f", {plan['host_gib'] * plan['gpus']:.1f} GiB for all {plan['gpus']}" if plan["gpus"] > 1 else ""),
        *(f"  {r['what']:<28}{r['gib']:>8.2f}  {r['detail']}" for r in plan.get("host_rows", []) if r["gib"]),
        "",
        f"disk: {d['adapter_mb']:.0f} MB per adapter version, {d['per_step_gb']:.2f} GB per step; kept: "
        f"{d['adapters_kept']} -> {d['run_gb']:.1f} GB per run; trainer checkpoints {d['checkpoints_gb']:.1f} GB",
        *(f"note: {n}" for n in plan["notes"]),
        plan["verdict"],
    ]
    return "\n".join(lines)
