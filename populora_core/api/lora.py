"""LoRA adapters as plain data: what an operator receives and returns, and what its shape is.

``LoraWeights`` is ``{module name -> LoraFactors(A, B, scale)}`` plus the adapter's PEFT config, so operators are pure
functions over tensors and need no base model. Reading and writing PEFT directories is
:mod:`populora_core.services.adapters`. No torch import here: the factors are the caller's tensors.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from .errors import UserError

if TYPE_CHECKING:
    import torch

#: PEFT's key suffixes of a module's factors in ``adapter_model.safetensors``
A_SUFFIX = ".lora_A.weight"
B_SUFFIX = ".lora_B.weight"


@dataclass
class LoraFactors:
    """One module's update: delta W = scale * B @ A, A is (r, d_in), B is (d_out, r)."""

    A: torch.Tensor
    B: torch.Tensor
    scale: float

    def delta(self) -> torch.Tensor:
        """The dense delta W (d_out x d_in). Only for tests and small modules."""
        return self.scale * (self.B.float() @ self.A.float())


@dataclass
class LoraWeights:
    """All modules of one adapter plus its PEFT config (rank, alpha, targets, base model)."""

    modules: dict[str, LoraFactors]
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def rank(self) -> int:
        return int(self.config.get("r", next(iter(self.modules.values())).A.shape[0]))

    @property
    def alpha(self) -> float:
        return float(self.config.get("lora_alpha", self.rank))

    def items(self) -> Iterator[tuple[str, LoraFactors]]:
        return iter(self.modules.items())

    def with_modules(self, modules: dict[str, LoraFactors]) -> LoraWeights:
        return replace(self, modules=modules, config=dict(self.config))

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The factors under PEFT's key names (what ``adapter_model.safetensors`` holds)."""
        out = {}
        for name, f in self.modules.items():
            out[name + A_SUFFIX], out[name + B_SUFFIX] = f.A, f.B
        return out


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
