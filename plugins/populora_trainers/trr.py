"""``trr++``: Task-Relative REINFORCE++ as AZR runs it (shared/reference/azr.md section 4).

* Advantages: the reward sits on the last token with gamma = 1, so every response token carries its
  rollout's reward; those token values are whitened separately inside each ``Rollout.group`` (AZR:
  task type x role, six baselines) with veRL's masked whitening: token-weighted mean, unbiased
  variance, ``(x - mean) * rsqrt(var + 1e-8)``. Long responses therefore weigh more in the statistics.
* Loss: PPO's clipped ``-A * ratio`` with ``ratio = exp(logp - old)``, token-mean over all response
  tokens of the update, minus ``entropy_coef`` x token-mean entropy, plus ``kl_coef`` x token-mean
  ``low_var_kl`` to the base model (AZR: 0, no reference model).
* ``epochs`` AdamW steps (grad-norm clip 1.0) per update, AZR one: ``old`` is the first epoch's
  log-probs, so one epoch has ratio = 1 and clipping is inert, as when AZR recomputes the old log-probs
  with the same weights. Micro-batches accumulate gradients exactly, since every micro-batch's sum is
  divided by the token count of the whole update.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from populora_core.api.components import AdapterRef, BaseModel, LoraSettings, Rollout, UpdateJob, UpdateStats
from populora_core.api.errors import UserError

from .batching import micro_batches, pack
from .forward import fused_adapter, long_row_threshold, use_checkpointing
from .logprobs import token_logprobs
from .state import SCRATCH, LoraTrainerBase, check_update

if TYPE_CHECKING:
    from . import TRRParams


def prompt_centred_rewards(rollouts: Sequence[Rollout]) -> list[float]:
    """Each reward minus the mean reward of the rollouts of its group that share its prompt.

    Several samples of one prompt (a student's n answers to one problem) get a GRPO-style per-problem
    baseline, so problems that every sample solves, or every sample fails, get exactly 0 (not a rounding
    residue of the mean). A rollout alone with its prompt (a proposal, a one-sample buffer solve) keeps its reward.
    """
    out = [float(r.reward) for r in rollouts]
    for members in _shared_prompts(rollouts):
        values = [out[i] for i in members]
        mean = values[0] if len(set(values)) == 1 else sum(values) / len(values)
        for i in members:
            out[i] -= mean
    return out


def _shared_prompts(rollouts: Sequence[Rollout]) -> list[list[int]]:
    """Indices of the rollouts that share a (group, prompt) with at least one other rollout, per prompt."""
    shared: dict[tuple[str, tuple[int, ...]], list[int]] = defaultdict(list)
    for i, r in enumerate(rollouts):
        shared[(r.group, tuple(r.prompt_token_ids))].append(i)
    return [m for m in shared.values() if len(m) > 1]


def trr_advantages(rollouts: Sequence[Rollout], params: TRRParams) -> list[float]:
    """One advantage per rollout (the same for all its tokens), whitened per ``Rollout.group`` by ``params``'
    ``normalize`` and ``baseline`` (``adv_eps`` under the root).

    ``token``: every response token counts once (veRL's masked whitening, AZR); ``sequence``: every
    rollout counts once; ``none``: the raw reward. Rollouts without tokens get 0 and count nowhere.
    With a single token in a group the unbiased variance is undefined; it is taken as 0, so the
    advantage is 0 (veRL would divide by zero).

    ``"task"`` leaves the group whitening as the only baseline (AZR). ``"prompt"`` gives each rollout
    the most specific baseline there is: its prompt's mean reward where several samples share the prompt
    (:func:`prompt_centred_rewards`), else the group's token-weighted mean of the raw rewards (AZR's task
    baseline); the group then divides by the token-weighted root mean square of those differences and
    does not centre again. Re-centring after per-prompt centring would subtract a second, prompt-less mean
    (non-zero as soon as long and short answers or lone rollouts weigh in) and give every sample of a
    problem all solved or all failed the same non-zero advantage: reinforcing, say, wrong answers.
    """
    normalize, baseline = params.normalize, params.baseline
    rewards = prompt_centred_rewards(rollouts) if baseline == "prompt" else [float(r.reward) for r in rollouts]
    if normalize == "none":
        return [v if r.completion_token_ids else 0.0 for r, v in zip(rollouts, rewards)]
    centred = {i for m in _shared_prompts(rollouts) for i in m} if baseline == "prompt" else set()
    groups: dict[str, list[int]] = defaultdict(list)
    for i, r in enumerate(rollouts):
        if r.completion_token_ids:
            groups[r.group].append(i)
    adv = [0.0] * len(rollouts)
    for members in groups.values():
        weights = [float(len(rollouts[i].completion_token_ids)) if normalize == "token" else 1.0 for i in members]
        n = sum(weights)
        raw = [float(rollouts[i].reward) for i in members]
        mean = sum(w * v for w, v in zip(weights, raw)) / n
        diffs = [rewards[i] if i in centred else v - mean for i, v in zip(members, raw)]
        var = sum(w * d**2 for w, d in zip(weights, diffs)) / (n - 1) if n > 1 else 0.0
        inv = 1.0 / math.sqrt(var + params.adv_eps)
        for i, d in zip(members, diffs):
            adv[i] = d * inv
    return adv


def low_var_kl(logp: Any, ref_logp: Any) -> Any:
    """veRL's ``low_var_kl`` (Schulman's k3) per token: ``exp(ref - logp) - (ref - logp) - 1``, clamped to
    [-10, 10]; unbiased for KL(policy || reference) on tokens sampled from the policy, never negative."""
    import torch

    log_ratio = ref_logp - logp
    return torch.clamp(torch.exp(log_ratio) - log_ratio - 1, min=-10, max=10)


@dataclass
class _Plan:
    """An update's checked input, before the weights are touched: its rows (rollout, advantage), longest last."""

    out_dir: Path
    advantages: list[float]
    rows: list[tuple[Rollout, float]]
    total: int  # completion tokens: every micro-batch's loss sum is divided by it


@dataclass
class _Result:
    loss: float
    entropy: float
    clipped: float
    kl: float
    grad_norm: float


class TRRTrainer(LoraTrainerBase):
    """AZR's TRR++ over one shared base: one member, one adapter version, one AdamW step per update."""

    algorithm = "trr++"

    def __init__(self, params: TRRParams, *, base_model: BaseModel, lora: LoraSettings, seed: int) -> None:
        super().__init__(params, base_model=base_model, lora=lora, seed=seed)
        if params.parallel_updates > 1 and use_checkpointing(params.gradient_checkpointing, self.host.device):
            # the fused forward finds its thread's adapter slot in a thread-local; checkpointing recomputes the
            # forward in backward on autograd's device thread, where that is unset (a wrong adapter, silently)
            raise UserError(
                f"trainer.params.parallel_updates: {params.parallel_updates} with gradient checkpointing "
                f"(gradient_checkpointing: {params.gradient_checkpointing} on {self.host.device}): checkpointing "
                "recomputes each forward on autograd's device thread, which does not know the thread's adapter. "
                "Set parallel_updates: 1 (on a GPU one update fills the device) or gradient_checkpointing: off"
            )

    def update(self, member_id: str, adapter: AdapterRef, rollouts: Sequence[Rollout], out_dir: Path) -> UpdateStats:
        start = time.perf_counter()
        plan = self._plan(member_id, rollouts, out_dir)
        with self.host.lock:
            config, params = self._activate(adapter)
            opt = self._optimizer(member_id, params)
            with self._training() as model:
                result = self._train(model, member_id, plan, opt, params)
            self._finish(adapter, config, plan.out_dir)
        return self._stats(rollouts, plan, result, time.perf_counter() - start)

    def update_many(self, jobs: Sequence[UpdateJob]) -> list[UpdateStats]:
        """The step's updates, stats in job order: one at a time, or ``parallel_updates`` at once in threads.

        Threads share the base weights: every job gets its own adapter slot (loaded before any thread
        starts, saved after all have ended), each thread's fused LoRA forward adds its own slot
        (populora_trainers.forward.fused_adapter), and torch releases the GIL inside its kernels, so a small
        model's updates use as many cores as threads. Each job runs the operations it runs alone on the
        same values, so adapters and optimizer states are bit-identical to one at a time. Each job's
        ``seconds`` is the wall time of the whole group (they ran together).
        """
        from concurrent.futures import ThreadPoolExecutor

        workers = min(self.params.parallel_updates, len(jobs))
        if workers <= 1:
            return [self.update(j.member_id, j.adapter, j.rollouts, j.out_dir) for j in jobs]
        start = time.perf_counter()
        plans = [self._plan(j.member_id, j.rollouts, j.out_dir) for j in jobs]  # bad input fails before training
        slots = [SCRATCH if i == 0 else f"{SCRATCH}{i}" for i in range(len(jobs))]
        host = self.host
        with host.lock:
            configs, params = zip(*(self._load_slot(j.adapter, slot) for j, slot in zip(jobs, slots)))
            opts = [self._optimizer(j.member_id, ps) for j, ps in zip(jobs, params)]
            self._make_trainable(slots)
            try:
                with self._training(slots) as model, ThreadPoolExecutor(workers) as pool:

                    def train(i: int) -> _Result:
                        with fused_adapter(slots[i]):
                            return self._train(model, jobs[i].member_id, plans[i], opts[i], params[i])

                    results = list(pool.map(train, range(len(jobs))))  # a failure is raised once all have ended
                for job, config, slot in zip(jobs, configs, slots):
                    self._finish(job.adapter, config, job.out_dir, slot)
            finally:
                self._make_trainable([SCRATCH])
                for p in host.params(SCRATCH).values():
                    p.requires_grad_(False)
        seconds = time.perf_counter() - start
        return [self._stats(j.rollouts, plan, result, seconds) for j, plan, result in zip(jobs, plans, results)]

    def _plan(self, member_id: str, rollouts: Sequence[Rollout], out_dir: Path) -> _Plan:
        out_dir = check_update(member_id, rollouts, out_dir)
        p = self.params
        advantages = trr_advantages(rollouts, p)
        rows = sorted(
            ((r, a) for r, a in zip(rollouts, advantages) if r.completion_token_ids),
            key=lambda ra: len(ra[0].prompt_token_ids) + len(ra[0].completion_token_ids),
        )
        return _Plan(out_dir, advantages, rows, sum(len(r.completion_token_ids) for r, _ in rows))

    def _train(self, model: Any, member_id: str, plan: _Plan, opt: Any, params: dict[str, Any]) -> _Result:
        """The update's epochs on the active slot (the caller holds the host and the training mode)."""
        import torch

        p, host, total = self.params, self.host, plan.total
        pad = int(host.tokenizer.pad_token_id)
        joined = p.sequence_layout == "joined"
        alone = long_row_threshold(p.long_row_tokens, host.device)
        chunks = micro_batches(plan.rows, p.micro_batch_size, p.micro_batch_tokens, joined=joined, alone_from=alone)
        old: list[Any] = [None] * len(chunks)  # first epoch's log-probs: the sampling policy's
        ref: list[Any] = [None] * len(chunks)  # the base model's log-probs (kl_coef > 0)
        for _ in range(p.epochs):
            opt.zero_grad(set_to_none=True)
            loss_sum = ent_sum = clipped = kl_sum = 0.0
            for c, chunk in enumerate(chunks):
                batch = pack([r for r, _ in chunk], pad, host.device)
                logp, ent = token_logprobs(model, batch, p.temperature, True, p.logprob_chunk_tokens, joined)
                mask = batch["completion_mask"].to(logp.dtype)
                adv = torch.tensor([a for _, a in chunk], dtype=logp.dtype, device=logp.device)[:, None]
                if old[c] is None:
                    old[c] = logp.detach()
                ratio = torch.exp(logp - old[c])
                surrogate = torch.minimum(adv * ratio, adv * ratio.clamp(1 - p.clip_eps, 1 + p.clip_eps))
                pg = -(surrogate * mask).sum() / total
                ent_mean = (ent * mask).sum() / total
                loss = pg - p.entropy_coef * ent_mean if p.entropy_coef else pg
                if p.kl_coef:
                    if ref[c] is None:
                        with torch.no_grad(), model.disable_adapter():
                            ref[c], _ = token_logprobs(
                                model, batch, p.temperature, False, p.logprob_chunk_tokens, joined
                            )
                    kl_mean = (low_var_kl(logp, ref[c]) * mask).sum() / total
                    loss = loss + p.kl_coef * kl_mean
                    kl_sum += float(kl_mean.detach())
                loss.backward()
                loss_sum += float(loss.detach())
                ent_sum += float(ent_mean.detach())
                clipped += float((((ratio - 1).abs() > p.clip_eps).to(logp.dtype) * mask).sum())
            grad_norm = self._step(member_id, opt, params)
        self._keep(member_id, opt, params)
        opt.zero_grad(set_to_none=True)
        return _Result(loss_sum, ent_sum, clipped, kl_sum, float(grad_norm))

    def _stats(self, rollouts: Sequence[Rollout], plan: _Plan, result: _Result, seconds: float) -> UpdateStats:
        p = self.params
        rewards = [float(r.reward) for r in rollouts]
        used = [a for r, a in zip(rollouts, plan.advantages) if r.completion_token_ids]
        return UpdateStats(
            loss=result.loss,
            grad_norm=result.grad_norm,
            entropy=result.entropy,
            tokens=plan.total,
            seconds=seconds,
            extra={
                "reward_mean": sum(rewards) / len(rewards),
                "adv_abs_mean": sum(abs(a) for a in used) / max(1, len(used)),
                "sequences": float(len(plan.rows)),
                "groups": float(len({r.group for r in rollouts})),
                "lr": float(p.lr),
                "clip_fraction": result.clipped / max(1, plan.total),
                **({"kl": result.kl} if p.kl_coef else {}),
            },
        )
