"""Mixed-adapter LoRA for one forward/generate call: per-row adapters on the shared base (punica-style).

Served versions live in the ModelHost as plain tensors (``A``, ``scale * B`` per linear module). For a
call, each row names its version (``__base__``: none); forward hooks on the base ``nn.Linear``
modules add that row's LoRA delta to the base output, while PEFT's own adapters (the trainers' scratch
slot) are disabled. Two ways to add the deltas:

* ``bmm``: the call's adapters are stacked per module (rank zero-padded, a zero slot for base rows),
  gathered per row once, and every step adds ``bmm(bmm(x, A_row), B_row)`` — two batched matmuls per
  module however many adapters are mixed. PEFT's ``adapter_names`` path instead loops over the
  distinct adapters in every layer at every step; with 8 adapters on a small model that loop was the
  whole cost (a mixed batch only ~2.5x faster than adapter by adapter, 6-7x with ``bmm``).
* ``loop``: one pair of matmuls per distinct adapter on its rows (PEFT's scheme): no per-row copies of
  the weights, for large batches of large adapters where the gathered ``bmm`` weights would not fit.

The hooks read the rows of the calling thread (:func:`serving`), so several threads can decode their own
batches through the one shared base at once.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from .numerics import MIN_ROWS

BASE = "__base__"
_THREAD = threading.local()  # .rows: the RowAdapters of this thread's forwards


def _modules(host: Any, names: Sequence[str]) -> dict[str, list[tuple[int, Any, Any]]]:
    """module path -> [(slot, A, scale*B)] over the call's versions (slot 1.. in ``names`` order)."""
    per: dict[str, list[tuple[int, Any, Any]]] = {}
    for slot, name in enumerate(names, start=1):
        for path, (a, b) in host.version(name).items():
            per.setdefault(path, []).append((slot, a, b))
    return per


def gathered_bytes(host: Any, keys: Sequence[str]) -> int:
    """Memory the ``bmm`` mode would gather for this call (rows x (d_in + d_out) x r x 4 per module)."""
    names = sorted({k for k in keys if k != BASE})
    total = 0
    for entries in _modules(host, names).values():
        r = max(a.shape[0] for _, a, _ in entries)
        d_in, d_out = entries[0][1].shape[1], entries[0][2].shape[0]
        total += len(keys) * (d_in + d_out) * r * 4
    return total


class RowAdapters:
    """The per-row LoRA weights of one call; :meth:`select` narrows them to the rows still decoding."""

    def __init__(self, host: Any, keys: Sequence[str], mode: str) -> None:
        import torch

        if mode not in ("bmm", "loop"):
            raise ValueError(f"unknown mixed-LoRA mode {mode!r} (bmm, loop)")
        names = sorted({k for k in keys if k != BASE})
        self.mode = mode
        self.index: Any = None  # slot per row (0: base)
        # per module: the base linear, its stacked (slots, d_in, r) / (slots, r, d_out) factors, and what
        # the current rows gather from them (bmm: per-row factors; loop: (rows, A^T, B^T) per adapter)
        self._modules: list[tuple[Any, Any, Any]] = []
        self._rows: list[Any] = []
        self._position: dict[int, int] = {}  # id(base linear) -> its index in _modules
        slots = [0 if k == BASE else names.index(k) + 1 for k in keys]
        with torch.no_grad():
            for path, entries in _modules(host, names).items():
                linear = host.linear(path)
                dev = linear.weight.device
                r = max(a.shape[0] for _, a, _ in entries)
                a_all = torch.zeros(len(names) + 1, linear.in_features, r, device=dev)
                b_all = torch.zeros(len(names) + 1, r, linear.out_features, device=dev)
                for slot, a, b in entries:
                    a_all[slot, :, : a.shape[0]] = a.t()
                    b_all[slot, : a.shape[0], :] = b.t()
                dtype = linear.weight.dtype
                self._position[id(linear)] = len(self._modules)
                self._modules.append((linear, a_all.to(dtype), b_all.to(dtype)))
                self._rows.append(None)
            index = torch.tensor(slots, device=self._modules[0][0].weight.device) if self._modules else None
        if index is not None:
            self._gather(index)

    def select(self, keep: Any) -> None:
        """Keep only rows ``keep`` (a long index tensor into the current rows), in that order."""
        if self.index is not None:
            self._gather(self.index[keep])

    def _gather(self, index: Any) -> None:
        import torch

        self.index = index
        with torch.no_grad():
            for m, (_, a_all, b_all) in enumerate(self._modules):
                if self.mode == "bmm":
                    self._rows[m] = (a_all[index], b_all[index])
                else:
                    self._rows[m] = [
                        (rows, a_all[slot], b_all[slot])
                        for slot in index.unique().tolist()
                        if slot != 0
                        for rows in [(index == slot).nonzero().flatten()]
                    ]

    def add_delta(self, linear: Any, x: Any, output: Any) -> Any:
        """``output`` of base ``linear`` on ``x`` plus each row's LoRA delta (unchanged where no adapter has it)."""
        import torch

        m = self._position.get(id(linear))
        if m is None:
            return output
        if self.mode == "bmm":
            a_rows, b_rows = self._rows[m]
            if x.dim() != 3 or x.shape[0] != a_rows.shape[0]:
                raise RuntimeError(f"batched LoRA expects ({a_rows.shape[0]}, T, d) inputs, got {tuple(x.shape)}")
            low = torch.bmm(x.to(a_rows.dtype), a_rows)
            if output.dtype == b_rows.dtype:  # the product accumulated into the base output: one pass over it
                return torch.baddbmm(output, low, b_rows)
            return output + torch.bmm(low, b_rows).to(output.dtype)
        out = output.clone()
        for index, a_t, b_t in self._rows[m]:
            out[index] += _rows_independent_matmul(_rows_independent_matmul(x[index].to(a_t.dtype), a_t), b_t).to(
                out.dtype
            )
        return out


def _rows_independent_matmul(x: Any, w: Any) -> Any:
    """``x @ w`` with at least MIN_ROWS rows in the GEMM (zero rows appended, then dropped): an adapter's few
    rows then get what they would get among more (see populora_engines.numerics.MIN_ROWS)."""
    import torch

    lead = x.shape[:-1]
    flat = x.reshape(-1, x.shape[-1])
    short = MIN_ROWS - flat.shape[0]
    if short <= 0:
        return x @ w
    padded = torch.cat((flat, flat.new_zeros(short, flat.shape[-1])))
    return (padded @ w)[: flat.shape[0]].reshape(*lead, w.shape[-1])


def serving(host: Any, attention: str | None = None) -> Any:
    """Within the block (re-entrant, from any thread), the base linears add the calling thread's row deltas and
    PEFT's own adapters (the trainers' slots) are off: the host's serving mode with this module's hook (and
    ``attention``, a registered attention name, when given). The outermost block configures the base, so a
    caller that fans batches out to threads holds it around them."""
    return host.serving(_row_delta, attention=attention)


@contextmanager
def batched_adapters(
    host: Any, keys: Sequence[str], mode: str = "bmm", attention: str | None = None
) -> Iterator[RowAdapters]:
    """Within the block, row i of every forward of ``host.model`` in this thread uses version ``keys[i]``."""
    rows = RowAdapters(host, keys, mode)
    previous = getattr(_THREAD, "rows", None)
    with serving(host, attention):
        _THREAD.rows = rows
        try:
            yield rows
        finally:
            _THREAD.rows = previous


def hooked_rows(linears: Sequence[Any]) -> tuple[bool, RowAdapters | None]:
    """The deltas a forward in this thread would add on ``linears``, for a caller that computes them itself:
    (True, the RowAdapters the serving hooks read, None outside a ``batched_adapters`` block) when every one
    of them carries just the serving hook, (True, None) when none carries a hook, else (False, None)."""
    hooks = [list(linear._forward_hooks.values()) for linear in linears]
    if all(not h for h in hooks):
        return True, None
    if all(h == [_row_delta] for h in hooks):
        return True, getattr(_THREAD, "rows", None)
    return False, None


def _row_delta(module: Any, args: Any, output: Any) -> Any:
    rows = getattr(_THREAD, "rows", None)
    return output if rows is None else rows.add_delta(module, args[0], output)
