"""LoRA adapters (:mod:`populora_core.api.lora`'s plain data) read from and written to standard PEFT directories,
their served copies, their hash, fresh adapters, and their shapes (what operators and a served copy must agree on).

Directories hold ``adapter_config.json`` and ``adapter_model.safetensors`` exactly as PEFT writes them, so
``PeftModel.from_pretrained`` and vLLM's ``LoRARequest`` load them unchanged. torch, safetensors, transformers and
peft are imported inside functions only.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..api.errors import UserError
from ..api.lora import A_SUFFIX, B_SUFFIX, LoraFactors, LoraWeights
from .files import atomic_dir

if TYPE_CHECKING:
    import torch

    from ..api.components import LoraSettings

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
#: A version's copy in an engine's serving dtype lives in a sub-folder of it, ``served-bfloat16``: written once by the
#: trainer beside the fp32 version it trains from, read as it is by an engine that serves in that dtype (vLLM on a
#: GPU) instead of a converted copy of its own.
SERVED_PREFIX = "served-"
#: the 16-bit dtypes a served copy may be in (torch's names)
SERVED_DTYPES = ("bfloat16", "float16")


def is_adapter_dir(path: str | os.PathLike[str]) -> bool:
    p = Path(path)
    return (p / CONFIG_FILE).is_file() and (p / WEIGHTS_FILE).is_file()


def read_adapter_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The ``adapter_config.json`` of a PEFT LoRA directory, after checking the directory is one."""
    p = Path(path)
    if not p.is_dir():
        raise UserError(f"adapter directory not found: {p}")
    if not is_adapter_dir(p):
        raise UserError(f"not a PEFT adapter directory (needs {CONFIG_FILE} and {WEIGHTS_FILE}): {p}")
    try:
        config = json.loads((p / CONFIG_FILE).read_text())
    except json.JSONDecodeError as exc:
        raise UserError(f"{p / CONFIG_FILE}: not valid JSON ({exc})") from None
    if config.get("peft_type", "LORA") != "LORA":
        raise UserError(f"{p}: peft_type {config.get('peft_type')!r} is not LORA")
    return dict(config)


def load_lora(path: str | os.PathLike[str]) -> LoraWeights:
    """Read a PEFT LoRA directory into plain tensors (fp32 copies are the caller's choice)."""
    from safetensors.torch import load_file

    config = read_adapter_config(path)
    weights = Path(path) / WEIGHTS_FILE
    try:
        tensors = load_file(str(weights))
    except Exception as exc:  # safetensors' own error type (a truncated or foreign file), or an OSError
        raise UserError(f"{weights}: not a readable safetensors file ({exc}); copy the adapter again") from None
    return from_state_dict(tensors, config, where=str(path))


def from_state_dict(tensors: dict[str, torch.Tensor], config: dict[str, Any], where: str = "") -> LoraWeights:
    """LoRA factors from tensors under PEFT's key names (``<module>.lora_A.weight`` / ``.lora_B.weight``)."""
    scale = lora_scale(config)
    modules: dict[str, LoraFactors] = {}
    for key, a in tensors.items():
        if key.endswith(A_SUFFIX):
            name = key[: -len(A_SUFFIX)]
            b = tensors.get(name + B_SUFFIX)
            if b is None:
                raise UserError(f"{where}: {name} has lora_A but no lora_B")
            modules[name] = LoraFactors(a, b, scale)
    if not modules:
        raise UserError(f"{where}: no LoRA tensors found in {WEIGHTS_FILE}")
    return LoraWeights(modules, config)


def save_lora(
    weights: LoraWeights, path: str | os.PathLike[str], *, dtype: Any = None, served_dtype: str | None = None
) -> Path:
    """Write a PEFT directory atomically (temp dir then rename); refuses to overwrite a version. ``served_dtype``
    (one of :data:`SERVED_DTYPES`): also its copy in that dtype, in the same rename (:func:`served_copy`)."""
    dest = Path(path)
    if dest.exists():
        raise FileExistsError(f"adapter versions are immutable; {dest} exists")
    if served_dtype is not None and served_dtype not in SERVED_DTYPES:
        raise ValueError(f"served_dtype {served_dtype!r}: not one of {SERVED_DTYPES}")
    with atomic_dir(dest) as tmp:
        write_peft_files(weights, tmp, dtype=dtype)
        if served_dtype is not None:
            import torch

            served = served_path(tmp, served_dtype)
            served.mkdir()
            write_peft_files(weights, served, dtype=getattr(torch, served_dtype))
    return dest


def served_path(path: str | os.PathLike[str], dtype: str) -> Path:
    """Where version ``path`` keeps its copy in ``dtype``."""
    return Path(path) / f"{SERVED_PREFIX}{dtype}"


def served_copy(path: str | os.PathLike[str], dtype: str | None) -> Path | None:
    """Version ``path``'s copy in ``dtype`` when it has one (None: it has not, or ``dtype`` is None)."""
    if dtype is None:
        return None
    served = served_path(path, dtype)
    return served if is_adapter_dir(served) else None


def write_peft_files(weights: LoraWeights, directory: str | os.PathLike[str], *, dtype: Any = None) -> None:
    """The PEFT files of ``weights`` into an existing folder (to add files of one's own inside an
    :func:`populora_core.services.files.atomic_dir`; :func:`save_lora` writes a whole version)."""
    from safetensors.torch import save_file

    folder = Path(directory)
    tensors = {k: (v if dtype is None else v.to(dtype)).contiguous() for k, v in weights.state_dict().items()}
    save_file(tensors, str(folder / WEIGHTS_FILE), metadata={"format": "pt"})
    config = dict(weights.config)
    config.setdefault("peft_type", "LORA")
    config.setdefault("task_type", "CAUSAL_LM")
    (folder / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True))


def adapter_hash(path: str | os.PathLike[str]) -> str:
    """sha256 of the weights file: identifies an adapter version in lineage records."""
    digest = hashlib.sha256()
    with open(Path(path) / WEIGHTS_FILE, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def init_lora(
    base_model_path: str,
    *,
    rank: int,
    alpha: float,
    target_modules: list[str] | tuple[str, ...],
    seed: int,
    init_std: float = 0.0,
    dropout: float = 0.0,
) -> LoraWeights:
    """A fresh adapter for ``base_model_path`` without loading its weights.

    The model is built on the meta device only to learn module names and shapes through PEFT, so
    keys match what PEFT saves. A is initialised as PEFT does (Kaiming-uniform, a=sqrt(5)); B is zero
    unless ``init_std`` > 0, in which case it gets Gaussian noise of that std: PEFT's B = 0 makes
    every fresh adapter identical to the base and weight-space operators inert until training moves it.
    """
    import math

    import torch
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(base_model_path)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    lora_config = LoraConfig(
        r=rank,
        lora_alpha=alpha,  # type: ignore[arg-type]  # PEFT accepts floats
        lora_dropout=dropout,
        target_modules=list(target_modules),
        task_type="CAUSAL_LM",
    )
    peft_model = get_peft_model(model, lora_config)
    meta_state = get_peft_model_state_dict(peft_model)
    gen = torch.Generator().manual_seed(seed)
    peft_config = peft_model.peft_config["default"].to_dict()
    peft_config["base_model_name_or_path"] = base_model_path
    peft_config["target_modules"] = sorted(peft_config["target_modules"])
    peft_config = json.loads(json.dumps(peft_config, default=lambda o: sorted(o) if isinstance(o, set) else str(o)))
    scale = lora_scale(peft_config)
    modules: dict[str, LoraFactors] = {}
    for key, meta in meta_state.items():
        if not key.endswith(A_SUFFIX):
            continue
        name = key[: -len(A_SUFFIX)]
        r, d_in = meta.shape
        d_out = meta_state[name + B_SUFFIX].shape[0]
        bound = 1.0 / math.sqrt(d_in)  # kaiming_uniform_(a=sqrt(5)) on an (r, d_in) weight
        a = (torch.rand(r, d_in, generator=gen) * 2 - 1) * bound
        b = torch.randn(d_out, r, generator=gen) * init_std if init_std > 0 else torch.zeros(d_out, r)
        modules[name] = LoraFactors(a, b, scale)
    return LoraWeights(modules, peft_config)


def fresh_lora(base_model_path: str, settings: LoraSettings, *, seed: int) -> LoraWeights:
    """:func:`init_lora` with a population's :class:`~populora_core.api.components.LoraSettings`."""
    return init_lora(
        base_model_path,
        rank=settings.rank,
        alpha=settings.alpha,
        target_modules=settings.target_modules,
        seed=seed,
        init_std=settings.init_std,
        dropout=settings.dropout,
    )


def lora_scale(config: dict[str, Any]) -> float:
    """PEFT's scaling: alpha / r, or alpha / sqrt(r) with rsLoRA."""
    r = float(config["r"])
    alpha = float(config.get("lora_alpha", r))
    return alpha / (r**0.5) if config.get("use_rslora") else alpha / r


#: The PEFT config keys that fix an adapter's shape: operators combine, and a child keeps, only adapters that
#: agree on them (``target_modules`` compared as a set).
SHAPE_KEYS = ("r", "lora_alpha", "use_rslora", "target_modules")


def config_difference(
    a: dict[str, Any], b: dict[str, Any], keys: Sequence[str] = SHAPE_KEYS
) -> tuple[str, Any, Any] | None:
    """The first of ``keys`` on which two PEFT configs differ, with both values; None when they agree."""
    for key in keys:
        x, y = a.get(key), b.get(key)
        if key == "target_modules":
            x, y = sorted(x or []), sorted(y or [])
        if x != y:
            return key, x, y
    return None


def shape_difference(a: LoraWeights, b: LoraWeights, arrow: str = "vs") -> str | None:
    """How two adapters differ in shape (``"r: 4 vs 8"``; ``a``'s side first), None when they agree: a config
    key of :data:`SHAPE_KEYS`, the set of modules, or a module's factor shapes."""
    config = config_difference(a.config, b.config)
    if config is not None:
        key, x, y = config
        return f"{key}: {x!r} {arrow} {y!r}"
    if set(a.modules) != set(b.modules):
        return f"the set of target modules (e.g. {sorted(set(a.modules) ^ set(b.modules))[:3]})"
    for name, f in a.modules.items():
        g = b.modules[name]
        if tuple(f.A.shape) != tuple(g.A.shape) or tuple(f.B.shape) != tuple(g.B.shape):
            return (
                f"the shape of {name}: A {tuple(f.A.shape)} {arrow} {tuple(g.A.shape)}, "
                f"B {tuple(f.B.shape)} {arrow} {tuple(g.B.shape)}"
            )
    return None


def check_compatible(parents: list[LoraWeights]) -> None:
    """Operators combine only adapters of one shape: same rank, alpha and target modules."""
    for i, other in enumerate(parents[1:], start=2):
        diff = shape_difference(parents[0], other)
        if diff is not None:
            raise UserError(f"parent 1 and parent {i} differ in {diff}")
