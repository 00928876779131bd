"""Policy-update algorithms for a population of LoRA adapters on one shared frozen base.

``trr++``: AZR's Task-Relative REINFORCE++; ``grpo``: TRL's GRPO loss family driven by rollouts the
toolkit generated. Both keep one AdamW state per member and train in a scratch adapter slot of the
process-wide base (populora_core.services.modelhost), so no member's weights are ever modified in place. No
torch/transformers/trl import here.
"""

from __future__ import annotations

from functools import partial
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from populora_core.api import Params, hookimpl


class _Common(Params):
    device: str = "auto"  # auto: cuda when available, else cpu
    lr: float = Field(
        1e-5, gt=0.0, description="AdamW learning rate (AZR's 1e-6 is for full fine-tuning; LoRA needs ~10x more)"
    )
    lr_decay_steps: int | None = Field(
        None,
        ge=1,
        description="cosine decay of lr to lr_min_ratio x lr over a member's first N optimizer steps "
        "(a child continues its parent's count, with its AdamW moments); None: constant lr (AZR)",
    )
    lr_min_ratio: float = Field(0.0, ge=0.0, le=1.0, description="the decayed lr's floor, as a fraction of lr")
    lr_ratio_b: float = Field(
        1.0,
        gt=0.0,
        description="LoRA+ (PEFT's loraplus_lr_ratio): the B factors' lr is "
        "this times lr (the paper suggests 16); 1: one lr for A and B",
    )
    weight_decay: float = Field(0.0, ge=0.0, description="AdamW weight decay (AZR master 0.0, paper branch 0.01)")
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = Field(1e-8, gt=0.0)
    grad_clip: float = Field(1.0, gt=0.0, description="gradient norm clip")
    micro_batch_size: int = Field(
        8, ge=1, description="sequences per forward/backward; gradients accumulate to one step"
    )
    micro_batch_tokens: int | None = Field(
        None,
        ge=1,
        description="micro-batches by a token budget instead of micro_batch_size: consecutive sequences share "
        "one while rows x (longest prompt + longest completion), padding counted, stays within it; a longer "
        "sequence goes alone. The loss is normalised over the whole update either way, so the step does not "
        "depend on the split. None: micro_batch_size sequences per micro-batch",
    )
    long_row_tokens: Annotated[int, Field(ge=1)] | Literal["auto"] | None = Field(
        "auto",
        description="a sequence of at least this many tokens (prompt + completion) is trained in a micro-batch "
        "of its own: no padding, so no attention mask, and SDPA keeps its fused causal kernel with grouped K/V "
        "(a padded batch takes the masked path, which repeats K/V per query head). auto: 2048 on CUDA, None "
        "(off) on the CPU, where the split would only change fp32 rounding",
    )
    gradient_checkpointing: Literal["auto", "on", "off"] = Field(
        "auto",
        description="recompute the decoder layers' activations in backward (transformers' gradient "
        "checkpointing, non-reentrant) instead of storing them, switched on for the update only; "
        "auto: on when the trainer's device is CUDA, off on the CPU",
    )
    lora_forward: Literal["fused", "peft"] = Field(
        "fused",
        description="fused: the LoRA product added to the base output in one addmm, scaling on the rank-r factor "
        "(populora_trainers.forward.fused_layer_forward, installed by the host for the update); peft: PEFT's LoRA "
        "layer forward. The same gradients up to fp32 rounding",
    )
    temperature: float = 1.0  # logits are divided by the rollout temperature before log-probs (veRL)
    served_dtype: Literal["auto", "none", "bfloat16", "float16"] = Field(
        "auto",
        description="each new version is also written in this dtype, in its served-<dtype> folder, for an engine "
        "that serves in it (vllm on a GPU) to read as it is instead of converting a copy of its own, and for a Ray "
        "cluster to ship to engine workers (half the bytes); auto: the base model's dtype on the trainer's device "
        "when it is 16-bit (bf16 on CUDA), none in float32 (the CPU); none: only the fp32 version",
    )

    @field_validator("gradient_checkpointing", mode="before")
    @classmethod
    def _yaml_on_off(cls, value: object) -> object:
        """YAML reads an unquoted ``on`` / ``off`` as a boolean."""
        return {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value


class TRRParams(_Common):
    """AZR's TRR++: advantages whitened per Rollout.group (task type x role), token-mean loss, no KL."""

    entropy_coef: float = Field(0.001, ge=0.0, description="entropy bonus (AZR paper branch; master: 0.0)")
    normalize: Literal["token", "sequence", "none"] = "token"  # token: veRL's token-weighted whitening
    baseline: Literal["task", "prompt"] = Field(
        "task",
        description="[choice] task: the per task x role whitening is the only baseline (AZR); prompt: "
        "first subtract the mean reward of the samples that share a prompt (a student's n answers to one problem), "
        "so problems all samples solve or all fail carry exactly no gradient; a rollout alone with its prompt is "
        "measured against its task x role group's mean reward (AZR's); then scaled per group without centring again",
    )
    adv_eps: float = 1e-8
    sequence_layout: Literal["joined", "split"] = Field(
        "joined",
        description="joined: each sequence's prompt and completion back to back, right padded to the micro-batch's "
        "longest sequence; split: TRL's layout (prompts left padded to the longest prompt, completions right "
        "padded to the longest completion), more padding, the same log-probs up to fp32 rounding",
    )
    epochs: int = Field(
        1,
        ge=1,
        description="optimizer steps per update over the same rollouts (veRL's ppo_epochs; "
        "AZR: 1); from the second on the ratio to the sampling policy is PPO-clipped at clip_eps",
    )
    clip_eps: float = Field(0.2, gt=0, description="PPO clip range of the ratio (veRL's clip_ratio, AZR 0.2)")
    kl_coef: float = Field(
        0.0,
        ge=0,
        description="veRL's kl_loss_coef (AZR: no KL loss): adds kl_coef x token-mean "
        "low_var_kl to the base model (adapters off) over the update's response tokens",
    )
    logprob_chunk_tokens: int | None = Field(
        8192,
        ge=1,
        description="a micro-batch whose rows x completion width exceeds this gets its log-probs and entropy "
        "from the decoder's last hidden states in chunks of this many completion tokens (LM head, fp32 "
        "log-softmax and entropy per chunk, each chunk recomputed in backward), so the (rows, tokens, vocab) "
        "fp32 logits never exist; smaller ones, and None, in one piece (the same values up to fp32 rounding)",
    )
    parallel_updates: int = Field(
        1,
        ge=1,
        description="members updated at once in threads sharing the base, each in its own adapter slot; results "
        "bit-identical to 1 (one at a time). On the CPU a small model's update uses one core per thread "
        "(set it to the cores, with runtime.threads: 1); on a GPU keep 1. The single process's: a Ray worker trains "
        "its members one after another on its own cores. Needs lora_forward: fused and kl_coef: 0",
    )

    @model_validator(mode="after")
    def _parallel_needs_fused_forward(self) -> TRRParams:
        # PEFT's forward adds every active adapter and the KL reference switches adapters off for the whole
        # model: with several members active at once only the fused forward picks each thread's own slot
        if self.parallel_updates > 1 and (self.lora_forward != "fused" or self.kl_coef):
            raise ValueError("parallel_updates > 1 needs lora_forward: fused and kl_coef: 0")
        return self


class GRPOParams(_Common):
    """TRL's GRPO loss family (grpo, dr_grpo, dapo, bnpo, cispo, sapo, luspo) on toolkit rollouts."""

    loss_type: Literal["grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo"] = "dapo"
    beta: float = 0.0  # KL coefficient against the reference adapter (TRL's default 0)
    reference: Literal["base", "initial"] = "base"  # base: adapters off; initial: member's first version
    epsilon: float = 0.2
    epsilon_high: float | None = None  # None: = epsilon (DAPO's clip-higher uses 0.28)
    scale_rewards: Literal["group", "batch", "none"] = "group"
    importance_sampling_level: Literal["token", "sequence"] = "token"
    max_completion_length: int = 256  # dr_grpo's constant normalizer
    group_by: Literal["prompt", "group"] = "prompt"  # GRPO group: same prompt (default) or Rollout.group
    use_rollout_logprobs: bool = False  # True: engine log-probs as the old policy (off-policy ratio)


@hookimpl
def register_trainers(register):
    from .grpo import GRPOLoraTrainer
    from .memory import trainer_memory
    from .trr import TRRTrainer

    register(
        "trr++",
        TRRTrainer.factory,
        params=TRRParams,
        description="AZR Task-Relative REINFORCE++ (per task x role whitening, token-mean loss)",
        memory=partial(trainer_memory, name="trr++"),
    )
    register(
        "grpo",
        GRPOLoraTrainer.factory,
        params=GRPOParams,
        description="TRL GRPO loss family on toolkit rollouts, one adapter per member",
        memory=partial(trainer_memory, name="grpo"),
        sampling_logprobs=reads_rollout_logprobs,
    )


def reads_rollout_logprobs(params: GRPOParams) -> bool:
    """``use_rollout_logprobs``: the engine's log-probs are the old policy, so they must be the sampling policy's."""
    return bool(params.use_rollout_logprobs)
