"""``hf`` engine: transformers + PEFT on the shared base, mixed-adapter batches, populora's decode loop.

Every row of a batch names its adapter version (``__base__`` for the bare base); forward hooks add each
row's LoRA delta (batched_lora.py), so one forward pass serves the whole population. Rows are left padded
and packed into batches under a token budget (rows x (longest prompt + max_tokens)); prompts of similar
length go together. ``decode: loop`` (the default; decode.py) runs a static KV cache, drops finished rows,
prefills a request's prompt once for its ``n`` samples, runs the one-token steps as plain torch ops on the
model's weights where that is bit for bit the forward (fused.py), and samples every row from its own counter-based
stream keyed by (call seed, request index, sample): a row's tokens depend neither on its batch nor on
the other requests of the call nor on the global random state, so the engine is ``row_seeded`` and a
cluster may split a call exactly (the request index is ``GenerationRequest.index`` when a caller set it,
else the request's position in the call). ``decode: generate`` is transformers' ``generate`` with one
forked, seeded torch RNG per batch (the reference path). Log-probs (only when ``SamplingParams.logprobs``)
are those of the raw model distribution (before temperature / top-p), as vLLM reports them by default.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from populora_core.api.components import (
    BaseModel,
    Completion,
    GenerationRequest,
    LoraSettings,
    RolloutEngine,
    SamplingParams,
)
from populora_core.api.rng import hashed_seed
from populora_core.services.batching import split_by_cost

from .batched_lora import BASE, batched_adapters, gathered_bytes, serving
from .completions import check_sampling, cut_completion, encode_prompts, not_generated
from .decode import decode, decode_attention_name, row_key
from .numerics import supported


def _stop_check(tokenizer: Any, stop: Sequence[str]) -> Any:
    """``stopped(row, tokens)`` for the decode loop: a stop string in the text of the last few tokens.

    A stop string completed by the newest token lies within its last ``len(stop)`` tokens; the window is
    wider for tokens that decode to nothing. A late detection only costs tokens: the completion is cut at the
    first stop string of its whole text (``cut_completion``) either way.
    """
    window = 2 * max(len(s) for s in stop) + 4

    def stopped(row: int, tokens: list[int]) -> bool:
        text = tokenizer.decode(tokens[-window:], skip_special_tokens=True)
        return any(s and s in text for s in stop)

    return stopped


class HFEngine(RolloutEngine):
    """transformers + PEFT rollout engine over :func:`populora_core.services.modelhost.get_host`."""

    @classmethod
    def factory(cls, params: Any, *, base_model: BaseModel, lora: LoraSettings, seed: int) -> HFEngine:
        return cls(params, base_model=base_model, lora=lora, seed=seed)

    def __init__(self, params: Any, *, base_model: BaseModel, lora: LoraSettings, seed: int) -> None:
        from populora_core.services.modelhost import get_host

        self.params = params
        self.base_model = base_model
        self.lora = lora
        self.seed = int(seed)
        self.host = get_host(base_model, params.device)
        self.host.capacity = max(self.host.capacity, params.max_loaded_adapters)
        self._calls = 0
        self._closed = False

    # --- batching -------------------------------------------------------------------------------

    def _batches(
        self, rows: list[tuple[int, int]], prompts: list[list[int]], max_tokens: int, parts: int = 1
    ) -> list[list[list[int]]]:
        """Row indices in ``parts`` runs of about equal cost (prompt + max_tokens per row), each grouped into
        batches whose rows x (longest prompt + max_tokens) stays under the token budget."""
        order = list(range(len(rows)))
        if self.params.sort_by_length:
            order.sort(key=lambda r: -len(prompts[rows[r][0]]))
        costs = [len(prompts[rows[r][0]]) + max_tokens for r in order]
        return [
            self._budgeted(order[start:end], rows, prompts, max_tokens) for start, end in split_by_cost(costs, parts)
        ]

    def _budgeted(
        self, order: list[int], rows: list[tuple[int, int]], prompts: list[list[int]], max_tokens: int
    ) -> list[list[int]]:
        batches: list[list[int]] = []
        current: list[int] = []
        longest = 0
        for r in order:
            plen = len(prompts[rows[r][0]])
            new_longest = max(longest, plen)
            if current and (
                (len(current) + 1) * (new_longest + max_tokens) > self.params.token_budget
                or len(current) >= self.params.max_batch_size
            ):
                batches.append(current)
                current, new_longest = [], plen
            current.append(r)
            longest = new_longest
        if current:
            batches.append(current)
        return batches

    # --- generation -----------------------------------------------------------------------------

    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingParams) -> list[list[Completion]]:
        """``sampling.n`` completions per request, in request order, all adapters mixed in each batch.

        A prompt over ``sampling.max_prompt_tokens`` gets ``n`` "prompt_too_long" completions and changes
        nothing for the others: in the decode loop every request draws from its own key whatever the rest
        of the call holds; ``decode: generate`` removes it before batching (batches are seeded by their
        index), so the others get exactly what the same call without it gives.
        """
        from populora_core.api.errors import UserError

        if self._closed:
            raise UserError("hf engine: generate() after close()")
        check_sampling(sampling)
        if not requests:
            return []
        host = self.host
        with host.lock:
            prompts = encode_prompts(host.tokenizer, requests, self.base_model.chat_template)
            cap = sampling.max_prompt_tokens
            served = [i for i, p in enumerate(prompts) if cap is None or len(p) <= cap]
            results: list[list[Completion]] = [
                [] if cap is None or len(p) <= cap else not_generated(p, sampling.n, "prompt_too_long") for p in prompts
            ]
            if not served:
                return results
            self._calls += 1  # counts calls that generate, so a dropped request never moves later seeds
            seed = sampling.seed if sampling.seed is not None else hashed_seed(self.seed, self._calls, bits=63)
            adapters = [requests[i].adapter for i in served]
            distinct = {a.served_key for a in adapters if a is not None}
            host.capacity = max(host.capacity, len(distinct))
            keys = [host.ensure(a) if a is not None else BASE for a in adapters]
            kept = [prompts[i] for i in served]
            call_index = [requests[i].index if requests[i].index is not None else i for i in served]
            rows = [(k, j) for k in range(len(served)) for j in range(sampling.n)]
            slots: list[list[Completion | None]] = [[None] * sampling.n for _ in served]
            loop = self._decode_loop()
            parts = self.params.parallel_batches if loop else 1
            runs = self._batches(rows, kept, sampling.max_tokens, parts)

            def run(batches: list[list[int]]) -> list[tuple[list[int], list[Completion]]]:
                done = []
                for b, batch in enumerate(batches):  # b seeds a generate batch (one run: no threads)
                    batch_rows = [rows[r] for r in batch]
                    batch_prompts = [kept[k] for k, _ in batch_rows]
                    batch_keys = [keys[k] for k, _ in batch_rows]
                    if loop:  # each row sampled from its own key: the same tokens however the rows are batched
                        first = {k: i for i, (k, _) in reversed(list(enumerate(batch_rows)))}
                        outs = self._run_loop(
                            batch_prompts,
                            batch_keys,
                            sampling,
                            [row_key(seed, call_index[k], j) for k, j in batch_rows],
                            [first[k] for k, _ in batch_rows],
                        )
                    else:
                        outs = self._run(batch_prompts, batch_keys, sampling, hashed_seed(seed, b, bits=63))
                    done.append((batch, outs))
                return done

            if len(runs) > 1:  # the runs decode at once, one thread each, through the one shared base
                from concurrent.futures import ThreadPoolExecutor

                with serving(host, decode_attention_name()), ThreadPoolExecutor(len(runs)) as pool:
                    finished = [b for part in pool.map(run, runs) for b in part]
            else:
                finished = run(runs[0]) if runs else []
            for batch, outs in finished:
                for r, comp in zip(batch, outs):
                    k, j = rows[r]
                    slots[k][j] = comp
        for k, i in enumerate(served):
            results[i] = [c for c in slots[k] if c is not None]
        return results

    @property
    def row_seeded(self) -> bool:
        """True with the decode loop (per-row keys); ``generate`` seeds per batch."""
        return self._decode_loop()

    def _decode_loop(self) -> bool:
        mode = self.params.decode
        return mode == "loop" or (mode == "auto" and supported(self.host.base_model))

    def _run_loop(
        self,
        prompts: list[list[int]],
        keys: list[str],
        sampling: SamplingParams,
        row_keys: list[int],
        prefill_row: list[int],
    ) -> list[Completion]:
        """One batch through :func:`populora_engines.decode.decode` (static cache, finished rows dropped)."""
        import torch

        host = self.host
        tok = host.tokenizer
        eos_ids = host.eos_token_ids()
        stopped = _stop_check(tok, sampling.stop) if sampling.stop else None
        host.model.eval()
        attention = decode_attention_name()
        with torch.no_grad(), batched_adapters(host, keys, self._mode(keys), attention) as row_adapters:
            out = decode(
                host.base_model,
                prompts,
                row_keys,
                max_tokens=sampling.max_tokens,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                eos_ids=eos_ids,
                pad_id=int(tok.pad_token_id),
                device=host.device,
                row_adapters=row_adapters,
                logprobs=sampling.logprobs,
                stopped=stopped,
                prefill_row=prefill_row,
            )
        return [
            self._completion(p, raw, out.logprobs[r] if out.logprobs is not None else None, sampling, set(eos_ids))
            for r, (p, raw) in enumerate(zip(prompts, out.tokens))
        ]

    def _completion(
        self, prompt: list[int], raw: list[int], logps: list[float] | None, sampling: SamplingParams, eos: set[int]
    ) -> Completion:
        ids, text, reason = cut_completion(self.host.tokenizer, raw, eos, sampling.stop, sampling.max_tokens)
        return Completion(
            text=text,
            token_ids=ids,
            logprobs=list(logps[: len(ids)]) if logps is not None else [],
            prompt_token_ids=list(prompt),
            finish_reason=reason,
        )

    def _run(self, prompts: list[list[int]], keys: list[str], sampling: SamplingParams, seed: int) -> list[Completion]:
        """One batch through ``transformers.generate`` (``decode: generate``; the reference path)."""
        import torch
        from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList

        host = self.host
        tok = host.tokenizer
        pad = int(tok.pad_token_id)
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), pad, dtype=torch.long)
        attention = torch.zeros((len(prompts), width), dtype=torch.long)
        for r, p in enumerate(prompts):
            input_ids[r, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            attention[r, width - len(p) :] = 1
        eos_ids = host.eos_token_ids()

        class Recorder(LogitsProcessor):
            """Keeps log-softmax of the raw logits one step, then gathers the token actually chosen."""

            def __init__(self) -> None:
                self.prev: Any = None
                self.steps: list[Any] = []

            def __call__(self, ids: Any, scores: Any) -> Any:
                if self.prev is not None:
                    self.steps.append(self.prev.gather(1, ids[:, -1:]).squeeze(1))
                self.prev = torch.log_softmax(scores.float(), dim=-1)
                return scores

        recorder = Recorder() if sampling.logprobs else None  # a full-vocab log-softmax per step: only when asked
        do_sample = sampling.temperature > 0
        config_kwargs: dict[str, Any] = dict(
            max_new_tokens=sampling.max_tokens,
            do_sample=do_sample,
            num_beams=1,
            eos_token_id=eos_ids,
            pad_token_id=pad,
            return_dict_in_generate=True,
        )
        if do_sample:
            config_kwargs.update(temperature=sampling.temperature, top_p=sampling.top_p, top_k=0)
        if sampling.stop:
            config_kwargs["stop_strings"] = list(sampling.stop)
        gen_config = GenerationConfig(**config_kwargs)
        kwargs: dict[str, Any] = {}
        if sampling.stop:
            kwargs["tokenizer"] = tok
        model = host.model
        model.eval()
        context = batched_adapters(host, keys, self._mode(keys))
        devices = [torch.cuda.current_device()] if host.device.startswith("cuda") else []
        with torch.no_grad(), torch.random.fork_rng(devices=devices), context:
            torch.manual_seed(seed)
            out = model.generate(
                input_ids=input_ids.to(host.device),
                attention_mask=attention.to(host.device),
                generation_config=gen_config,
                logits_processor=LogitsProcessorList([recorder] if recorder is not None else []),
                **kwargs,
            )
        seqs = out.sequences[:, width:].cpu()
        logps = None
        if recorder is not None:
            if recorder.prev is not None and seqs.shape[1] > 0:
                recorder.steps.append(recorder.prev.gather(1, seqs[:, -1:].to(recorder.prev.device)).squeeze(1))
            logps = torch.stack(recorder.steps, dim=1).cpu() if recorder.steps else torch.zeros(len(prompts), 0)
        eos_set = set(eos_ids)
        return [
            self._completion(p, seqs[r].tolist(), logps[r].tolist() if logps is not None else None, sampling, eos_set)
            for r, p in enumerate(prompts)
        ]

    def _mode(self, keys: list[str]) -> str:
        mode = self.params.mixed_lora
        if mode != "auto":
            return mode
        return "bmm" if gathered_bytes(self.host, keys) <= self.params.bmm_budget_mb * 2**20 else "loop"

    # --- adapters and lifetime --------------------------------------------------------------------

    def sleep(self) -> None:
        """A no-op: the engine runs on the trainers' own base (nothing of its own to release). The
        caching allocator's free blocks stay cached for the trainer, which is what needs them next."""

    def close(self) -> None:
        """The shared base stays for the trainers; only this engine's handle goes."""
        self._closed = True
