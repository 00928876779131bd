"""``grpo``: TRL's GRPO loss family on rollouts the toolkit generated (see README.md for the choices).

TRL's ``GRPOTrainer`` owns generation, its dataloader and one optimizer, none of which fit a
population. What it does own well is the objective: ``GRPOTrainer._compute_loss`` implements every
loss type (grpo, dr_grpo, dapo, bnpo, cispo, sapo, luspo), PPO clipping, sequence-level importance
sampling and the k3 KL term; ``_get_per_token_logps_and_entropies`` is its log-prob/entropy path.
This trainer builds one ``GRPOTrainer`` around the shared PeftModel (beta = 0 at construction: with
beta > 0 TRL 1.16 assumes an adapter named ``default`` and fails with ``KeyError``), then sets
``trainer.beta`` itself and computes the reference log-probs from the reference adapter. For each
update it computes TRL's group advantages (``scale_rewards`` group / batch / none, TRL's ``nanstd``)
and feeds micro-batches to ``_compute_loss``, with the normalisers set so that micro-batching gives
exactly the loss of the whole batch. The optimizer step is the toolkit's: per-member AdamW, clip 1.0.
"""

from __future__ import annotations

import tempfile
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from populora_core.api.components import AdapterRef, Rollout, UpdateStats
from populora_core.api.errors import UserError

from .batching import micro_batches, pack
from .forward import long_row_threshold
from .state import SCRATCH, LoraTrainerBase, check_update

if TYPE_CHECKING:
    from . import GRPOParams

REF = "__ref__"


def grpo_advantages(rollouts: Sequence[Rollout], params: GRPOParams) -> list[float]:
    """TRL's GRPO advantages: reward minus its group's mean, divided by (std + 1e-4) unless ``params``'
    ``scale_rewards`` is ``none``.

    A group is every rollout of one prompt (``group_by="prompt"``, GRPO's definition; groups may have
    any size here) or of one ``Rollout.group``. ``batch`` scales by the std of the whole batch.
    """
    import torch
    from trl.trainer.utils import nanstd

    scale_rewards, group_by = params.scale_rewards, params.group_by
    rewards = torch.tensor([float(r.reward) for r in rollouts], dtype=torch.float32)
    groups: dict[Any, list[int]] = defaultdict(list)
    for i, r in enumerate(rollouts):
        groups[(r.group, tuple(r.prompt_token_ids)) if group_by == "prompt" else r.group].append(i)
    mean = torch.zeros_like(rewards)
    std = torch.zeros_like(rewards)
    for idx in groups.values():
        g = rewards[idx]
        mean[idx] = torch.nanmean(g)
        std[idx] = nanstd(g) if len(idx) > 1 else 0.0
    if scale_rewards == "batch":
        std = (nanstd(rewards) if len(rollouts) > 1 else torch.tensor(0.0)).expand_as(rewards)
    adv = rewards - mean
    if scale_rewards != "none":
        adv = adv / (std + 1e-4)
    return torch.nan_to_num(adv, nan=0.0).tolist()


class GRPOLoraTrainer(LoraTrainerBase):
    """One TRL ``GRPOTrainer`` as the loss engine for every member; optimizer state per member."""

    algorithm = "grpo"

    @property
    def needs_sampling_logprobs(self) -> bool:
        from . import reads_rollout_logprobs

        return reads_rollout_logprobs(self.params)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._trl: Any = None
        self._refs: dict[str, AdapterRef] = {}  # reference="initial": each member's first version
        self._tmp = tempfile.TemporaryDirectory(prefix="populora-grpo-")

    def _trl_trainer(self) -> Any:
        """Built lazily on first update, around the host's PeftModel (scratch slot active)."""
        if self._trl is not None:
            return self._trl
        from datasets import Dataset
        from trl import GRPOConfig, GRPOTrainer

        p = self.params
        args = GRPOConfig(
            output_dir=self._tmp.name,
            per_device_train_batch_size=2,
            num_generations=2,
            max_completion_length=p.max_completion_length,
            learning_rate=p.lr,
            loss_type=p.loss_type,
            beta=0.0,
            epsilon=p.epsilon,
            epsilon_high=p.epsilon_high if p.epsilon_high is not None else p.epsilon,
            scale_rewards=p.scale_rewards,
            importance_sampling_level=p.importance_sampling_level,
            temperature=p.temperature,
            bf16=False,
            fp16=False,
            use_cpu=self.host.device == "cpu",
            gradient_checkpointing=False,
            report_to=[],
            save_strategy="no",
            seed=self.seed,
            disable_dropout=False,
        )

        def unused_reward(prompts: Any, completions: Any, **kwargs: Any) -> list[float | None]:
            raise RuntimeError("the grpo plugin scores rollouts itself; TRL's reward path is not used")

        trainer = GRPOTrainer(
            model=self.host.peft,
            reward_funcs=[unused_reward],
            args=args,
            train_dataset=Dataset.from_dict({"prompt": ["unused", "unused"]}),
            processing_class=self.host.tokenizer,
        )
        trainer.beta = float(p.beta)  # the documented workaround: set after construction
        self._trl = trainer
        return trainer

    def _ref_logps(self, trainer: Any, member_id: str, adapter: AdapterRef, chunks: list[dict[str, Any]]) -> list[Any]:
        import torch

        host = self.host
        out = []
        if self.params.reference == "initial":
            ref = self._refs.setdefault(member_id, adapter)
            host.load_into(REF, ref)
            host.peft.set_adapter(REF)
        with torch.no_grad():
            for batch in chunks:
                ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
                mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
                width = batch["completion_ids"].shape[1]
                if self.params.reference == "base":
                    with host.peft.disable_adapter():
                        logps, _, _ = trainer._get_per_token_logps_and_entropies(host.peft, ids, mask, width)
                else:
                    logps, _, _ = trainer._get_per_token_logps_and_entropies(host.peft, ids, mask, width)
                out.append(logps.detach())
        return out

    def update(self, member_id: str, adapter: AdapterRef, rollouts: Sequence[Rollout], out_dir: Path) -> UpdateStats:
        import torch

        start = time.perf_counter()
        out_dir = check_update(member_id, rollouts, out_dir)
        p = self.params
        adv = grpo_advantages(rollouts, p)
        rows = [(r, a) for r, a in zip(rollouts, adv) if r.completion_token_ids]
        total = sum(len(r.completion_token_ids) for r, _ in rows)
        # TRL's forward passes no position ids, so a micro-batch holds prompts of one length only
        rows.sort(key=lambda ra: len(ra[0].prompt_token_ids))
        groups: list[list[tuple[Rollout, float]]] = micro_batches(
            rows,
            p.micro_batch_size,
            p.micro_batch_tokens,
            same=lambda ra: len(ra[0].prompt_token_ids),
            alone_from=long_row_threshold(p.long_row_tokens, self.host.device),
        )
        host = self.host
        with host.lock:
            if self._trl is None:  # TRL needs the PeftModel to exist: the scratch slot creates it
                host.load_into(SCRATCH, adapter)
            trainer = self._trl_trainer()
            pad = int(host.tokenizer.pad_token_id)
            chunks = [pack([r for r, _ in g], pad, host.device) for g in groups]
            refs = self._ref_logps(trainer, member_id, adapter, chunks) if p.beta != 0.0 else [None] * len(chunks)
            config, params = self._activate(adapter)
            opt = self._optimizer(member_id, params)
            n_seq = len(rows)
            loss_sum = ent_sum = 0.0
            try:
                with self._training() as model:
                    opt.zero_grad(set_to_none=True)
                    for g, batch, ref in zip(groups, chunks, refs):
                        n_mb = len(g)
                        tokens_mb = float(batch["completion_mask"].sum())
                        inputs = dict(batch)
                        inputs["advantages"] = torch.tensor([a for _, a in g], dtype=torch.float32, device=host.device)
                        inputs["num_items_in_batch"] = torch.tensor(float(total), device=host.device)
                        if ref is not None:
                            inputs["ref_per_token_logps"] = ref
                        if p.use_rollout_logprobs:
                            old = torch.zeros_like(batch["completion_ids"], dtype=torch.float32)
                            for i, (r, _) in enumerate(g):
                                if len(r.logprobs) != len(r.completion_token_ids):
                                    raise UserError(
                                        f"update of {member_id!r}: use_rollout_logprobs needs one "
                                        "log-prob per completion token"
                                    )
                                old[i, : len(r.logprobs)] = torch.tensor(r.logprobs)
                            inputs["old_per_token_logps"] = old
                        # normalisers that make the sum over micro-batches equal the whole batch's loss
                        if p.loss_type in ("dapo", "cispo"):
                            trainer.current_gradient_accumulation_steps = trainer.args.steps_per_generation
                        elif p.loss_type == "bnpo":
                            trainer.current_gradient_accumulation_steps = total / tokens_mb
                        else:  # grpo, sapo, dr_grpo, luspo: a mean over sequences
                            trainer.current_gradient_accumulation_steps = n_seq / n_mb
                        loss = trainer.compute_loss(model, inputs)
                        loss.backward()
                        loss_sum += float(loss.detach())
                        ent_sum += float(self._last_entropy(trainer)) * tokens_mb
                    grad_norm = self._step(member_id, opt, params)
                    self._keep(member_id, opt, params)
                    opt.zero_grad(set_to_none=True)
            finally:
                metrics = {k: list(v) for k, v in trainer._metrics["train"].items()}
                trainer._metrics["train"].clear()
            self._finish(adapter, config, out_dir)
        extra = {
            "reward_mean": sum(float(r.reward) for r in rollouts) / len(rollouts),
            "sequences": float(n_seq),
            "lr": float(p.lr),
        }
        for key in ("kl", "clip_ratio/region_mean"):
            if metrics.get(key):
                extra[key] = float(sum(metrics[key]) / len(metrics[key]))
        return UpdateStats(
            loss=loss_sum,
            grad_norm=float(grad_norm),
            entropy=ent_sum / total,
            tokens=total,
            seconds=time.perf_counter() - start,
            extra=extra,
        )

    @staticmethod
    def _last_entropy(trainer: Any) -> float:
        values = trainer._metrics["train"].get("entropy") or [0.0]
        return float(values[-1])

    def _member_extra(self, member_id: str) -> dict[str, Any]:
        ref = self._refs.get(member_id)
        return {"ref": [ref.name, ref.path]} if ref is not None else {}

    def _load_member_extra(self, member_id: str, extra: dict[str, Any]) -> None:
        if extra.get("ref"):
            name, path = extra["ref"]
            self._refs[member_id] = AdapterRef(name, path)

    def forget(self, member_id: str) -> None:
        super().forget(member_id)
        self._refs.pop(member_id, None)
