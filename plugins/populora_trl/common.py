"""What both trainers share: the scratch slot, per-member AdamW state, batching and log-probs."""

from __future__ import annotations

import copy
import math
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from populora_core.components import AdapterRef, BaseModel, LoraSettings, Rollout
from populora_core.errors import UserError

SCRATCH = "__train__"
STATE_FILE = "trainer_state.pt"


def check_update(member_id: str, rollouts: Sequence[Rollout], out_dir: Path) -> Path:
    """Refuse an update that cannot be right: foreign or empty rollouts, or a version that already exists."""
    if not rollouts:
        raise UserError(f"update of {member_id!r}: no rollouts")
    for i, r in enumerate(rollouts):
        if r.member_id != member_id:
            raise UserError(f"update of {member_id!r}: rollout {i} belongs to member {r.member_id!r}")
        if not r.prompt_token_ids:
            raise UserError(f"update of {member_id!r}: rollout {i} has no prompt tokens")
    if not any(r.completion_token_ids for r in rollouts):
        raise UserError(f"update of {member_id!r}: every rollout has an empty completion")
    out_dir = Path(out_dir)
    if out_dir.exists():
        raise UserError(f"update of {member_id!r}: {out_dir} exists (adapter versions are immutable)")
    return out_dir


def scheduled_lr(lr: float, steps_done: int, decay_steps: int | None, min_ratio: float = 0.0) -> float:
    """The learning rate of a member's next optimizer step: cosine from ``lr`` down to ``min_ratio x lr``
    over its first ``decay_steps`` steps, then flat at the floor; constant when ``decay_steps`` is None."""
    if decay_steps is None:
        return lr
    progress = min(steps_done, decay_steps) / decay_steps
    return lr * (min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress)))


class LoraTrainerBase:
    """Trains one member at a time in the host's scratch slot; keeps AdamW state per member.

    The optimizer is rebuilt for each update over the scratch slot's parameters (sorted by name) and
    loaded with the member's saved state, so the state follows the member, not the tensors.
    """

    algorithm = "base"

    def __init__(self, params: Any, *, base_model: BaseModel, lora: LoraSettings, seed: int) -> None:
        from populora_core.modelhost import get_host

        self.params = params
        self.base_model = base_model
        self.lora = lora
        self.seed = int(seed)
        self.host = get_host(base_model, params.device)
        self._states: dict[str, dict[str, Any]] = {}
        self._updates = 0

    @classmethod
    def factory(cls, params: Any, *, base_model: BaseModel, lora: LoraSettings, seed: int) -> Any:
        return cls(params, base_model=base_model, lora=lora, seed=seed)

    # --- scratch slot and optimizer -------------------------------------------------------------

    def _activate(self, adapter: AdapterRef) -> tuple[dict[str, Any], dict[str, Any]]:
        """Copy ``adapter`` into the scratch slot; only it is trainable. Returns (config, params)."""
        host = self.host
        config = host.load_into(SCRATCH, adapter)
        host.peft.set_adapter(SCRATCH)
        for name, p in host.peft.named_parameters():
            p.requires_grad_(f".{SCRATCH}." in name)
        params = host.params(SCRATCH)
        if not params:
            raise UserError(f"adapter {adapter.name!r} at {adapter.path}: no LoRA parameters in the base model")
        return config, params

    def _optimizer(self, member_id: str, params: dict[str, Any]) -> Any:
        import torch

        p = self.params
        # LoRA+ (Hayou et al. 2024): B factors in a second group at lr_ratio_b x lr. Without it one group, the
        # layout of optimizer states saved before the option existed, so their checkpoints still resume.
        groups = [list(params.values())]
        if p.lr_ratio_b != 1.0:
            groups = [
                [t for name, t in params.items() if "lora_B" not in name],
                [t for name, t in params.items() if "lora_B" in name],
            ]
        opt = torch.optim.AdamW([{"params": group} for group in groups])
        saved = self._states.get(member_id)
        if saved is not None:
            if saved.get("names") != list(params):
                raise UserError(
                    f"optimizer state of member {member_id!r} belongs to a differently shaped "
                    "adapter; call forget() first"
                )
            opt.load_state_dict(copy.deepcopy(saved["optimizer"]))
        done = int(next(iter(opt.state.values()))["step"]) if opt.state else 0
        lr = scheduled_lr(p.lr, done, p.lr_decay_steps, p.lr_min_ratio)
        for group, ratio in zip(opt.param_groups, (1.0, p.lr_ratio_b)):
            # hyper-parameters come from the current params, never the saved state
            group.update(lr=lr * ratio, betas=tuple(p.betas), eps=p.eps, weight_decay=p.weight_decay)
        return opt

    def _step(self, member_id: str, opt: Any, params: dict[str, Any]) -> Any:
        """Clip the gradient to ``grad_clip`` and step; a non-finite norm aborts the update (nothing is saved)."""
        import torch

        grad_norm = torch.nn.utils.clip_grad_norm_(list(params.values()), self.params.grad_clip)
        if not torch.isfinite(grad_norm):
            raise FloatingPointError(f"update of {member_id!r}: non-finite gradient norm {grad_norm}")
        opt.step()
        return grad_norm

    def _keep(self, member_id: str, opt: Any, params: dict[str, Any]) -> None:
        state = opt.state_dict()
        self._states[member_id] = {"names": list(params), "optimizer": copy.deepcopy(state)}

    def _finish(self, adapter: AdapterRef, config: dict[str, Any], out_dir: Path) -> Path:
        out = self.host.save(SCRATCH, out_dir, config)
        self.host.peft.eval()
        for p in self.host.params(SCRATCH).values():
            p.requires_grad_(False)
        return out

    # --- Trainer protocol: state ------------------------------------------------------------------

    def copy_state(self, source_member: str, target_member: str) -> None:
        """PBT inheritance: the child starts from a copy of the parent's AdamW moments."""
        if source_member in self._states:
            self._states[target_member] = copy.deepcopy(self._states[source_member])
        else:
            self._states.pop(target_member, None)

    def forget(self, member_id: str) -> None:
        self._states.pop(member_id, None)

    def members(self) -> list[str]:
        return sorted(self._states)

    def save_state(self, directory: Path) -> None:
        """All members' optimizer states in one torch file, written atomically."""
        import torch

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        payload = {
            "format": 1,
            "algorithm": self.algorithm,
            "updates": self._updates,
            "members": self._states,
            "extra": self._extra_state(),
        }
        fd, tmp = tempfile.mkstemp(prefix=f".{STATE_FILE}.", dir=directory)
        os.close(fd)
        try:
            torch.save(payload, tmp)
            os.replace(tmp, directory / STATE_FILE)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def load_state(self, directory: Path) -> None:
        import torch

        file = Path(directory) / STATE_FILE
        if not file.is_file():
            raise UserError(f"trainer state not found: {file}")
        payload = torch.load(file, map_location="cpu", weights_only=False)
        if payload.get("algorithm") != self.algorithm:
            raise UserError(f"{file}: saved by trainer {payload.get('algorithm')!r}, not {self.algorithm!r}")
        self._states = payload["members"]
        self._updates = int(payload.get("updates", 0))
        self._load_extra_state(payload.get("extra") or {})

    def _extra_state(self) -> dict[str, Any]:
        return {}

    def _load_extra_state(self, extra: dict[str, Any]) -> None:
        pass


def pack(rows: Sequence[Rollout], pad_id: int, device: str) -> dict[str, Any]:
    """Prompts left padded, completions right padded (TRL's layout), plus RoPE positions from the mask."""
    import torch

    pmax = max(len(r.prompt_token_ids) for r in rows)
    lmax = max(1, max(len(r.completion_token_ids) for r in rows))
    n = len(rows)
    prompt_ids = torch.full((n, pmax), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros((n, pmax), dtype=torch.long)
    comp_ids = torch.full((n, lmax), pad_id, dtype=torch.long)
    comp_mask = torch.zeros((n, lmax), dtype=torch.long)
    for i, r in enumerate(rows):
        p, c = r.prompt_token_ids, r.completion_token_ids
        prompt_ids[i, pmax - len(p) :] = torch.tensor(p, dtype=torch.long)
        prompt_mask[i, pmax - len(p) :] = 1
        if c:
            comp_ids[i, : len(c)] = torch.tensor(c, dtype=torch.long)
            comp_mask[i, : len(c)] = 1
    return {
        k: v.to(device)
        for k, v in dict(
            prompt_ids=prompt_ids, prompt_mask=prompt_mask, completion_ids=comp_ids, completion_mask=comp_mask
        ).items()
    }


def token_logprobs(
    model: Any, batch: dict[str, Any], temperature: float = 1.0, entropy: bool = False
) -> tuple[Any, Any]:
    """Per completion token log-prob (and entropy) under ``model``; shape (rows, completion width).

    Position ids come from the attention mask, so a left-padded prompt sees the same positions as in
    generation (transformers' Llama otherwise numbers padded rows from the first pad).
    """
    import torch

    input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
    width = batch["completion_ids"].shape[1]
    out = model(input_ids=input_ids, attention_mask=mask, position_ids=positions, logits_to_keep=width + 1)
    logits = out.logits[:, :-1, :].float()
    if temperature != 1.0:
        logits = logits / temperature
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, batch["completion_ids"].unsqueeze(-1)).squeeze(-1)
    ent = -(logp_all.exp() * logp_all).sum(-1) if entropy else None
    return logp, ent
