"""LoRA adapters as plain data: what an operator receives and returns.

``LoraWeights`` is ``{module name -> LoraFactors(A, B, scale)}`` plus the adapter's PEFT config, so operators are pure
functions over tensors and need no base model. Reading and writing PEFT directories, and the shape checks
(``shape_difference``, ``check_compatible``), are :mod:`populora_core.services.adapters`. No torch import here: the
factors are the caller's tensors.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

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
