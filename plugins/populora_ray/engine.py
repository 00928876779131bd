"""The driver's rollout engine on a Ray cluster: one call split across the engine workers, order kept.

A call is split into contiguous parts of about equal token budget (prompt characters / 4 + n x max_tokens
per request), one part per worker, and the parts' completions are concatenated back in request order.
Splitting is exact only for an engine whose sampling of a request does not depend on the other requests
of the call (``row_seeded``, see populora_core.api.components.RolloutEngine; the hf engine's decode loop): each
part's requests then carry their index in the whole call. An engine that seeds per batch (vllm, hf with
``decode: generate``) gets every call whole on one worker, so the cluster's results stay those of the single
process (unless the recipe asks for ``generation_split: always``, trading that identity for parallel
generation).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from populora_core.api.components import Completion, GenerationRequest, RolloutEngine, SamplingParams
from populora_core.services.adapters import served_copy
from populora_core.services.batching import split_by_cost

from .transfer import absolute


def token_budget(request: GenerationRequest, sampling: SamplingParams) -> int:
    """What a request costs to generate, estimated without a tokenizer (about 4 characters per token)."""
    return len(request.prompt) // 4 + 1 + sampling.n * sampling.max_tokens


class RayEngine(RolloutEngine):
    def __init__(self, cluster: Any, workers: list[Any], *, split: bool, served_dtypes: list[str | None]) -> None:
        self.cluster = cluster
        self.workers = workers
        self.split = split  # row-seeded engine, or cluster.params.generation_split: always
        self.served_dtypes = served_dtypes  # each worker's engine's (RolloutEngine.served_dtype)

    @property
    def served_dtype(self) -> str | None:
        """The workers' engines': the same engine everywhere, so one dtype (None when they differ)."""
        return self.served_dtypes[0] if len(set(self.served_dtypes)) == 1 else None

    def _reads(self, worker: int, path: str) -> str:
        """What an engine worker reads of version ``path``: its copy in the engine's dtype when it has one."""
        served = served_copy(path, self.served_dtypes[worker])
        return path if served is None else str(served)

    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingParams) -> list[list[Completion]]:
        if not requests:
            return []
        if self.split and len(self.workers) > 1:
            ranges = split_by_cost([token_budget(r, sampling) for r in requests], len(self.workers))
        else:
            ranges = [(0, len(requests))]
        parts = [
            [
                dataclasses.replace(r, adapter=absolute(r.adapter), index=r.index if r.index is not None else i)
                for i, r in enumerate(requests[start:end], start=start)
            ]
            for start, end in ranges
        ]
        if self.cluster.mirrored:
            needs = [
                (self.workers[w], [self._reads(w, r.adapter.path) for r in part if r.adapter is not None])
                for w, part in enumerate(parts)
            ]
            self.cluster.ship(needs)
        calls = [(worker, worker.actor.generate.remote(part, sampling)) for worker, part in zip(self.workers, parts)]
        return [row for part in self.cluster.call("generate", calls) for row in part]

    def sleep(self) -> None:
        self.cluster.call("sleep", [(w, w.actor.sleep.remote()) for w in self.workers])

    def close(self) -> None:
        """The workers belong to the cluster, which releases them when the run closes it."""
