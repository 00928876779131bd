"""The trainers' shared base: the scratch slot, per-member AdamW state (saved, moved, inherited), checks."""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from populora_core.api.components import AdapterRef, BaseModel, LoraSettings, Rollout, Trainer
from populora_core.api.errors import UserError
from populora_core.services.adapters import SERVED_DTYPES
from populora_core.services.files import atomic_path

from .forward import fused_layer_forward, use_checkpointing

SCRATCH = "__train__"


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


def served_dtype(setting: str, host_dtype: Any) -> str | None:
    """The dtype of each new version's served copy: ``auto`` follows the base model's dtype on the trainer's device
    when it is 16-bit (what vLLM serves adapters in there), so a float32 run (the CPU) writes only its fp32 files."""
    if setting == "none":
        return None
    if setting != "auto":
        return setting
    name = str(host_dtype).removeprefix("torch.")
    return name if name in SERVED_DTYPES else None


class LoraTrainerBase(Trainer):
    """Trains one member at a time in the host's scratch slot; keeps AdamW state per member.

    The optimizer is rebuilt for each update over the scratch slot's parameters (sorted by name) and
    loaded with the member's saved state, so the state follows the member, not the tensors.
    """

    algorithm = "base"

    @property
    def needs_sampling_logprobs(self) -> bool:
        return False  # the loss recomputes the old policy's log-probs itself

    def __init__(self, params: Any, *, base_model: BaseModel, lora: LoraSettings, seed: int) -> None:
        from populora_core.services.modelhost import get_host

        self.params = params
        self.base_model = base_model
        self.lora = lora
        self.seed = int(seed)
        self.host = get_host(base_model, params.device)
        self.served_dtype = served_dtype(params.served_dtype, self.host.dtype)
        self._states: dict[str, dict[str, Any]] = {}

    @classmethod
    def factory(cls, params: Any, *, base_model: BaseModel, lora: LoraSettings, seed: int) -> Any:
        return cls(params, base_model=base_model, lora=lora, seed=seed)

    # --- scratch slot and optimizer -------------------------------------------------------------

    def _activate(self, adapter: AdapterRef, slot: str = SCRATCH) -> tuple[dict[str, Any], dict[str, Any]]:
        """Copy ``adapter`` into ``slot``; only it is trainable and active. Returns (config, params)."""
        loaded = self._load_slot(adapter, slot)
        self._make_trainable([slot])
        return loaded

    def _load_slot(self, adapter: AdapterRef, slot: str) -> tuple[dict[str, Any], dict[str, Any]]:
        """Copy ``adapter`` into ``slot``. Returns (config, params)."""
        config = self.host.load_into(slot, adapter)
        params = self.host.params(slot)
        if not params:
            raise UserError(f"adapter {adapter.name!r} at {adapter.path}: no LoRA parameters in the base model")
        return config, params

    def _make_trainable(self, slots: list[str]) -> None:
        """``slots`` active (PEFT's LoraModel takes a list) and the only ones with gradients."""
        peft = self.host.peft
        if len(slots) == 1:
            peft.set_adapter(slots[0])
        else:
            peft.base_model.set_adapter(slots)
        for name, p in peft.named_parameters():
            p.requires_grad_(any(f".{slot}." in name for slot in slots))

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

    @contextmanager
    def _training(self, slots: Sequence[str] = (SCRATCH,)) -> Iterator[Any]:
        """The host's training mode (train mode, checkpointing when the params ask), with the fused LoRA forward
        of ``slots`` when ``lora_forward: fused``."""
        on = use_checkpointing(self.params.gradient_checkpointing, self.host.device)
        fused = fused_layer_forward(slots) if self.params.lora_forward == "fused" else None
        with self.host.training(checkpointing=on, layer_forward=fused) as model:
            yield model

    def _finish(self, adapter: AdapterRef, config: dict[str, Any], out_dir: Path, slot: str = SCRATCH) -> Path:
        out = self.host.save(slot, out_dir, config, served_dtype=self.served_dtype)
        self.host.peft.eval()
        for p in self.host.params(slot).values():
            p.requires_grad_(False)
        return out

    # --- Trainer protocol: state ------------------------------------------------------------------

    def copy_state(self, source_member: str, target_member: str) -> None:
        """PBT inheritance: the child starts from a copy of the parent's AdamW moments."""
        self.import_member(target_member, self.export_member(source_member))

    def forget(self, member_id: str) -> None:
        self._states.pop(member_id, None)

    def members(self) -> list[str]:
        return sorted(self._states)

    def export_member(self, member_id: str) -> dict[str, Any] | None:
        """A host-memory copy of one member's AdamW state and per-member extras (None: no state), to move it
        elsewhere: a Ray driver without a GPU cannot unpickle CUDA tensors, and a checkpoint file should not need
        one either. Importing puts the moments back on the parameters' device (the optimizer's load does)."""
        if member_id not in self._states:
            return None
        return {"optimizer_state": _host_copy(self._states[member_id]), "extra": self._member_extra(member_id)}

    def import_member(self, member_id: str, state: dict[str, Any] | None) -> None:
        self.forget(member_id)
        if state is not None:
            self._states[member_id] = copy.deepcopy(state["optimizer_state"])
            self._load_member_extra(member_id, state["extra"])

    def save_members(self, directory: Path, member_ids: Sequence[str]) -> dict[str, str]:
        """One torch file per member (populora_core.services.trainer_state's layout), each written atomically."""
        import torch

        from populora_core.services.trainer_state import member_file

        files = {}
        for member_id in member_ids:
            state = self.export_member(member_id)
            if state is None:  # nothing to keep: it loads as a member without state
                continue
            rel = member_file(member_id)
            with atomic_path(Path(directory) / rel, fsync=False) as tmp:
                torch.save(state, tmp)
            files[member_id] = rel
        return files

    def load_members(self, directory: Path, files: dict[str, str]) -> None:
        """Tensors and plain data only (``weights_only=True``): a member file that names anything else is refused
        unread (``pickle.UnpicklingError``), whoever wrote it: a checkpoint cannot run code."""
        import torch

        from populora_core.services.trainer_state import member_file

        for member_id, rel in files.items():
            if rel != member_file(member_id):  # the manifest names where the member's file is, nowhere else
                raise UserError(f"{Path(directory) / 'manifest.json'}: member {member_id!r} recorded at {rel!r}")
            payload = torch.load(Path(directory) / rel, map_location="cpu", weights_only=True)
            self.import_member(member_id, payload)

    def save_state(self, directory: Path) -> None:
        """Every member's optimizer state in its own file plus the manifest (written last)."""
        from populora_core.services.trainer_state import write_manifest

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        write_manifest(directory, self.algorithm, self.save_members(directory, self.members()))

    def load_state(self, directory: Path) -> None:
        """Every member of the manifest (populora_core.services.trainer_state's layout)."""
        from populora_core.services.trainer_state import read_manifest

        for member_id in self.members():
            self.forget(member_id)
        manifest = read_manifest(Path(directory), self.algorithm)
        self.load_members(Path(directory), manifest["members"])

    def _member_extra(self, member_id: str) -> dict[str, Any]:
        """What else a member's state holds beyond its AdamW moments (grpo: its reference adapter)."""
        return {}

    def _load_member_extra(self, member_id: str, extra: dict[str, Any]) -> None:
        pass


def _host_copy(value: Any) -> Any:
    """A deep copy with every tensor in host memory."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: _host_copy(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_host_copy(v) for v in value)
    return copy.deepcopy(value)
