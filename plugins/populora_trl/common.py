"""What both trainers share: the scratch slot, per-member AdamW state, batching and log-probs."""

from __future__ import annotations

import copy
import math
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

from populora_core.components import AdapterRef, BaseModel, LoraSettings, Rollout, Trainer
from populora_core.errors import UserError
from populora_core.files import atomic_path

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
        from populora_core.modelhost import get_host

        self.params = params
        self.base_model = base_model
        self.lora = lora
        self.seed = int(seed)
        self.host = get_host(base_model, params.device)
        self._states: dict[str, dict[str, Any]] = {}
        parallel = getattr(params, "parallel_updates", 1)
        if parallel > 1 and use_checkpointing(params.gradient_checkpointing, self.host.device):
            # the fused forward finds its thread's adapter slot in a thread-local; checkpointing recomputes the
            # forward in backward on autograd's device thread, where that is unset (a wrong adapter, silently)
            raise UserError(
                f"trainer.params.parallel_updates: {parallel} with gradient checkpointing "
                f"(gradient_checkpointing: {params.gradient_checkpointing} on {self.host.device}): checkpointing "
                "recomputes each forward on autograd's device thread, which does not know the thread's adapter. "
                "Set parallel_updates: 1 (on a GPU one update fills the device) or gradient_checkpointing: off"
            )

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
        """The PeftModel in train mode, with gradient checkpointing on for the update only when asked.

        Checkpointing is a flag on the shared base's decoder layers that transformers honours only in train
        mode; it is switched off again (and the input-grad hook transformers adds is removed) before the
        model goes back to eval, so the engines' generation never sees it.
        """
        model = self.host.peft
        base = self.host.base_model
        on = use_checkpointing(self.params.gradient_checkpointing, self.host.device)
        had_hooks = bool(getattr(base, "_require_grads_hooks", None))
        if on:
            try:
                # use_reentrant=False: gradients reach the LoRA factors although no input requires grad
                base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            except ValueError as exc:
                raise UserError(f"trainer.gradient_checkpointing: {exc}; set it to off") from None
        model.train()
        fused = fused_lora(model, slots) if self.params.lora_forward == "fused" else nullcontext()
        try:
            with fused:
                yield model
        finally:
            model.eval()
            if on:
                base.gradient_checkpointing_disable()
                if not had_hooks and getattr(base, "_require_grads_hooks", None):
                    base.disable_input_require_grads()

    def _finish(self, adapter: AdapterRef, config: dict[str, Any], out_dir: Path, slot: str = SCRATCH) -> Path:
        out = self.host.save(slot, out_dir, config)
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
        """A copy of one member's AdamW state and per-member extras (None: no state), to move it elsewhere."""
        if member_id not in self._states:
            return None
        return {"optimizer_state": copy.deepcopy(self._states[member_id]), "extra": self._member_extra(member_id)}

    def import_member(self, member_id: str, state: dict[str, Any] | None) -> None:
        self.forget(member_id)
        if state is not None:
            self._states[member_id] = copy.deepcopy(state["optimizer_state"])
            self._load_member_extra(member_id, state["extra"])

    def save_members(self, directory: Path, member_ids: Sequence[str]) -> dict[str, str]:
        """One torch file per member (populora_core.trainer_state's layout), each written atomically."""
        import torch

        from populora_core.trainer_state import member_file

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
        import torch

        for member_id, rel in files.items():
            payload = torch.load(Path(directory) / rel, map_location="cpu", weights_only=False)
            self.import_member(member_id, payload)

    def save_state(self, directory: Path) -> None:
        """Every member's optimizer state in its own file plus the manifest (written last)."""
        from populora_core.trainer_state import write_manifest

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        write_manifest(directory, self.algorithm, self.save_members(directory, self.members()))

    def load_state(self, directory: Path) -> None:
        """Every member of the manifest (populora_core.trainer_state's layout)."""
        from populora_core.trainer_state import read_manifest

        for member_id in self.members():
            self.forget(member_id)
        manifest = read_manifest(Path(directory), self.algorithm)
        self.load_members(Path(directory), manifest["members"])

    def _member_extra(self, member_id: str) -> dict[str, Any]:
        """What else a member's state holds beyond its AdamW moments (grpo: its reference adapter)."""
        return {}

    def _load_member_extra(self, member_id: str, extra: dict[str, Any]) -> None:
        pass


_SELECTED = threading.local()  # the adapter this thread's fused forwards add, when a block fuses several


@contextmanager
def fused_adapter(name: str) -> Iterator[None]:
    """In this thread, the fused forwards of a :func:`fused_lora` block over several adapters add ``name``."""
    previous = getattr(_SELECTED, "name", None)
    _SELECTED.name = name
    try:
        yield
    finally:
        _SELECTED.name = previous


@contextmanager
def fused_lora(model: Any, adapters: str | Sequence[str]) -> Iterator[None]:
    """Within the block, the LoRA layers add ``((x A^T) s) B^T`` of an adapter to the base output in one ``addmm``.

    PEFT's layer computes ``base(x) + lora_B(lora_A(x)) * s``: the rank-r product, the scaling and the sum are
    three passes over the (tokens, d_out) output, and the rank-8 matmul that writes it runs at a few
    GFLOP/s on the CPU; together about a third of a nano update. Here the scaling goes on the (tokens, r)
    factor and the product is accumulated into the base output. The same parameters get the gradients
    (the same values up to fp32 rounding). With several ``adapters`` (members trained at once, all of them
    active), each thread names its own with :func:`fused_adapter`. A layer with dropout, DoRA, other active
    adapters or the adapters disabled (the KL reference) runs PEFT's own forward, checked at every call.
    """
    import torch

    names = [adapters] if isinstance(adapters, str) else list(adapters)
    patched = []
    for module in model.modules():
        lora_a = getattr(module, "lora_A", None)
        if lora_a is None or any(
            name not in lora_a or not isinstance(module.lora_dropout[name], torch.nn.Identity) for name in names
        ):
            continue
        if any(module.use_dora.get(n, False) or getattr(module, "lora_bias", {}).get(n, False) for n in names):
            continue
        if not isinstance(module.get_base_layer(), torch.nn.Linear):
            continue
        patched.append(module)
        module.forward = _fused_forward(module, names)
    try:
        yield
    finally:
        for module in patched:
            del module.forward  # the class's (PEFT's) forward again


def _fused_forward(module: Any, names: list[str]) -> Callable[..., Any]:
    import torch

    peft_forward = type(module).forward.__get__(module)
    base = module.get_base_layer()
    factors = {n: (module.lora_A[n].weight, module.lora_B[n].weight, module.scaling[n]) for n in names}
    only = names[0] if len(names) == 1 else None

    def forward(x: Any, *args: Any, **kwargs: Any) -> Any:
        if module.disable_adapters or module.merged or list(module.active_adapters) != names or args or kwargs:
            return peft_forward(x, *args, **kwargs)
        name = only or getattr(_SELECTED, "name", None)
        if name not in factors:
            raise RuntimeError(f"fused LoRA forward over {names}: this thread selected {name!r} (fused_adapter)")
        lora_a, lora_b, scale = factors[name]
        result = base(x)
        low = torch.nn.functional.linear(x.to(lora_a.dtype), lora_a) * scale
        if result.dtype != low.dtype:
            return result + torch.nn.functional.linear(low, lora_b).to(result.dtype)
        flat = torch.addmm(result.reshape(-1, result.shape[-1]), low.reshape(-1, low.shape[-1]), lora_b.t())
        return flat.view(result.shape)

    return forward


def use_checkpointing(setting: str, device: str) -> bool:
    """``gradient_checkpointing``: ``on``, ``off``, or ``auto`` (on for a CUDA device, off on the CPU)."""
    return setting == "on" or (setting == "auto" and str(device).startswith("cuda"))


def micro_batches(
    rows: Sequence[Any],
    size: int,
    tokens: int | None = None,
    same: Callable[[Any], Any] | None = None,
    joined: bool = False,
) -> list[list[Any]]:
    """Consecutive runs of ``rows`` (tuples whose first item is a Rollout), in the given order.

    ``tokens`` None: at most ``size`` rows per micro-batch. Otherwise a micro-batch takes the next row while its
    packed shape (rows x (longest prompt + longest completion), padding counted as :func:`pack` lays it out;
    ``joined``: rows x longest prompt + completion, as :func:`completion_hidden` lays it out) stays within
    ``tokens``; a row longer than that goes alone. ``same``: a key that every row of one micro-batch shares
    (grpo: the prompt length).
    """
    groups: list[list[Any]] = []
    pmax = lmax = 0
    for row in rows:
        r = row[0]
        p, c = len(r.prompt_token_ids), max(1, len(r.completion_token_ids))
        if joined:  # one length: prompt + completion back to back
            p, c = p + c, 0
        if groups and (same is None or same(groups[-1][0]) == same(row)):
            g = groups[-1]
            wp, wl = max(pmax, p), max(lmax, c)
            if (len(g) < max(1, size)) if tokens is None else ((len(g) + 1) * (wp + wl) <= tokens):
                g.append(row)
                pmax, lmax = wp, wl
                continue
        groups.append([row])
        pmax, lmax = p, c
    return groups


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
    model: Any,
    batch: dict[str, Any],
    temperature: float = 1.0,
    entropy: bool = False,
    chunk_tokens: int | None = None,
    joined: bool = False,
) -> tuple[Any, Any]:
    """Per completion token log-prob (and entropy) under ``model``; shape (rows, completion width).

    Position ids come from the attention mask, so a left-padded prompt sees the same positions as in
    generation (transformers' Llama otherwise numbers padded rows from the first pad).

    ``chunk_tokens``: when the micro-batch's rows x completion width exceeds it, the log-probs come from
    :func:`chunked_token_logprobs` (the fp32 ``(rows, width, vocab)`` logits never exist; padded positions
    are 0 there). Otherwise, and with None, the whole micro-batch in one piece, as before the option.
    ``joined``: the decoder runs over each row's prompt and completion back to back, right padded
    (:func:`completion_hidden`), instead of the packed layout's longest prompt + longest completion.
    """
    import torch

    rows, width = batch["completion_ids"].shape
    if chunk_tokens is not None and rows * width > chunk_tokens:
        return chunked_token_logprobs(model, batch, temperature, entropy, chunk_tokens, joined)
    if joined:
        causal = model.get_base_model() if hasattr(model, "get_base_model") else model
        logits = causal.get_output_embeddings()(completion_hidden(causal.get_decoder(), batch, True)).float()
    else:
        input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
        mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
        positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
        out = model(
            input_ids=input_ids, attention_mask=mask, position_ids=positions, logits_to_keep=width + 1, use_cache=False
        )
        logits = out.logits[:, :-1, :].float()
    if temperature != 1.0:
        logits = logits / temperature
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, batch["completion_ids"].unsqueeze(-1)).squeeze(-1)
    ent = -(logp_all.exp() * logp_all).sum(-1) if entropy else None
    return logp, ent


def completion_hidden(decoder: Any, batch: dict[str, Any], joined: bool) -> Any:
    """The decoder's last hidden states at the positions that predict each completion token: (rows, width, d).

    ``joined``: rows laid out as prompt then completion, right padded to the longest row (padding only
    where the row is shorter than the longest prompt + completion of the micro-batch, not where its prompt
    is shorter than the longest prompt and its completion shorter than the longest completion).
    """
    import torch

    prompt_mask, comp_mask = batch["prompt_mask"], batch["completion_mask"]
    width = comp_mask.shape[1]
    if not joined:
        input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
        mask = torch.cat([prompt_mask, comp_mask], dim=1)
        positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
        hidden = decoder(input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=False)
        # the positions that predict the completion tokens (the one-piece path's logits_to_keep=width+1, minus the last)
        return hidden.last_hidden_state[:, -(width + 1) : -1, :]
    plen, clen = prompt_mask.sum(dim=1), comp_mask.sum(dim=1)
    total = plen + clen
    longest = int(total.max())
    rows = prompt_mask.shape[0]
    input_ids = batch["prompt_ids"].new_zeros((rows, longest))
    for r in range(rows):
        p, c = int(plen[r]), int(clen[r])
        input_ids[r, :p] = batch["prompt_ids"][r, prompt_mask.shape[1] - p :]
        input_ids[r, p : p + c] = batch["completion_ids"][r, :c]
    columns = torch.arange(longest, device=input_ids.device)
    mask = (columns[None, :] < total[:, None]).long()
    positions = columns[None, :].expand(rows, -1)
    hidden = decoder(input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=False)
    # completion token j of row r is predicted at column plen_r + j - 1 (padded j: any column, masked later)
    at = (plen[:, None] - 1 + torch.arange(width, device=input_ids.device)[None, :]).clamp(max=longest - 1)
    state = hidden.last_hidden_state
    return state.gather(1, at[:, :, None].expand(-1, -1, state.shape[-1]))


def chunked_token_logprobs(
    model: Any, batch: dict[str, Any], temperature: float, entropy: bool, chunk_tokens: int, joined: bool = False
) -> tuple[Any, Any]:
    """:func:`token_logprobs` from the decoder's last hidden states, ``chunk_tokens`` completion tokens at a time.

    The decoder runs once; the LM head, the fp32 cast, the temperature, the log-softmax, the gather and the
    entropy then run per chunk of real (unpadded) completion tokens. Each chunk is wrapped in
    ``torch.utils.checkpoint`` (non-reentrant), so autograd keeps only the chunk's hidden states and
    recomputes its logits in backward: forward and backward both hold one chunk's ``(chunk, vocab)`` logits
    at a time. Same values as the one-piece path up to fp32 rounding; padded positions are 0.
    """
    import torch
    from torch.utils.checkpoint import checkpoint

    causal = model.get_base_model() if hasattr(model, "get_base_model") else model
    decoder, head = causal.get_decoder(), causal.get_output_embeddings()
    hidden = completion_hidden(decoder, batch, joined)
    real = batch["completion_mask"].bool()
    h, targets = hidden[real], batch["completion_ids"][real]
    fn = _logp_entropy_function()

    def piece(h_chunk: Any, t_chunk: Any) -> tuple[Any, Any]:
        return fn.apply(head(h_chunk), t_chunk, float(temperature), entropy)

    grad = torch.is_grad_enabled()
    lps, ents = [], []
    for s in range(0, h.shape[0], chunk_tokens):
        h_chunk, t_chunk = h[s : s + chunk_tokens], targets[s : s + chunk_tokens]
        lp, ent = checkpoint(piece, h_chunk, t_chunk, use_reentrant=False) if grad else piece(h_chunk, t_chunk)
        lps.append(lp)
        ents.append(ent)
    zeros = torch.zeros(real.shape, dtype=torch.float32, device=h.device)
    # back into the padded (rows, width) layout, differentiably; padded positions stay 0
    logp = zeros.masked_scatter(real, torch.cat(lps) if lps else zeros[:0, 0])
    ent_out = zeros.masked_scatter(real, torch.cat(ents) if lps else zeros[:0, 0]) if entropy else None
    return logp, ent_out


_LOGP_ENTROPY: Any = None
ROW_BLOCK = 64  # rows of a chunk's (tokens, vocab) logits that the Function's temporaries span at once


def _logp_entropy_function() -> Any:
    """A ``torch.autograd.Function`` (built on first use: no torch at import) for one chunk of logits.

    ``apply(logits (n, vocab), targets (n,), temperature, entropy) -> (logp (n,), entropy (n,) or None)``,
    fp32, with the one-piece path's formulas row by row (fp32 cast, division by the temperature,
    ``log_softmax``, gather, ``-(exp(lp) * lp).sum``). It keeps one fp32 ``(n, vocab)`` log-softmax, filled
    and used ``ROW_BLOCK`` rows at a time so that the cast, the temperature and the exp never span the whole
    chunk, and saves only it for backward, which writes the logits' gradient
    (``(g_lp * onehot - p * (g_lp + g_ent * (lp + H))) / T``) into one buffer the same way. Autograd's own
    chain (cast, div, log_softmax, exp, mul, sum) would hold several ``(n, vocab)`` tensors instead.
    """
    global _LOGP_ENTROPY
    if _LOGP_ENTROPY is not None:
        return _LOGP_ENTROPY
    import torch

    class LogpEntropy(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, logits: Any, targets: Any, temperature: float, entropy: bool) -> Any:
            ctx.set_materialize_grads(False)
            n = logits.shape[0]
            logp_all = torch.empty(logits.shape, dtype=torch.float32, device=logits.device)
            ent = torch.empty(n, dtype=torch.float32, device=logits.device) if entropy else None
            for s in range(0, n, ROW_BLOCK):
                z = logits[s : s + ROW_BLOCK].float()
                if temperature != 1.0:
                    z = z / temperature
                block = logp_all[s : s + ROW_BLOCK]
                torch.log_softmax(z, dim=-1, out=block)
                if ent is not None:
                    ent[s : s + ROW_BLOCK] = -(block.exp() * block).sum(-1)
            logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
            ctx.save_for_backward(logp_all, targets, ent)
            ctx.temperature = temperature
            ctx.logits_dtype = logits.dtype
            return logp, ent

        @staticmethod
        def backward(ctx: Any, g_logp: Any, g_ent: Any) -> Any:
            logp_all, targets, ent = ctx.saved_tensors
            if g_logp is None and g_ent is None:
                return None, None, None, None
            grad = torch.empty(logp_all.shape, dtype=ctx.logits_dtype, device=logp_all.device)
            g_lp = None if g_logp is None else g_logp.float().unsqueeze(-1)
            g_h = None if g_ent is None else g_ent.float().unsqueeze(-1)
            for s in range(0, logp_all.shape[0], ROW_BLOCK):
                rows = slice(s, s + ROW_BLOCK)
                lp = logp_all[rows]
                if g_h is not None:  # d H / d z_j = -p_j (lp_j + H)
                    block = (lp + ent[rows].unsqueeze(-1)).mul_(g_h[rows])
                    if g_lp is not None:
                        block.add_(g_lp[rows])
                    block.mul_(lp.exp()).neg_()
                else:  # d lp_t / d z_j = onehot_tj - p_j
                    assert g_lp is not None  # g_ent is None here, so g_logp is not (both None returned above)
                    block = lp.exp().mul_(-g_lp[rows])
                if g_lp is not None:
                    block.scatter_add_(-1, targets[rows].unsqueeze(-1), g_lp[rows])
                if ctx.temperature != 1.0:
                    block.div_(ctx.temperature)
                grad[rows] = block
            return grad, None, None, None

    _LOGP_ENTROPY = LogpEntropy
    return LogpEntropy
