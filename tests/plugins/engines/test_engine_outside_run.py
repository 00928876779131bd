"""An engine built outside a run (``populora eval``, a benchmark) on a GPU: its ``auto`` settings come from a plan of
the engine alone there (``populora_core.build_engine``), and the run's own plan measures the GPU at start.

The GPU is faked: ``populora_core.services.gpu.visible_gpu_memory`` reports its (free, total) bytes, the vllm engine's
``_cuda_available`` says yes, and a stand-in ``vllm`` module records what ``vllm.LLM`` was given, then stops the
first generation call (the engine is built by then).
"""

from __future__ import annotations

import shutil
import sys
import types
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest

from populora_core.api.errors import UserError
from populora_core.services.gpu import GIB
from tests import evals_fixtures as F
from tests.cli_helpers import REPO

NANO = REPO / "plugins" / "populora_nano" / "model"
QWEN7B = REPO / "recipes" / "configs" / "Qwen__Qwen2.5-7B.json"


class Generating(Exception):
    """Raised by the stand-in vLLM's first generation: the engine was built."""


@pytest.fixture
def fake_gpu(monkeypatch):
    """A GPU of ``state['total']`` bytes with ``state['free']`` free, and a stand-in vllm; ``state['llm']``: the
    keyword arguments each ``vllm.LLM`` got."""
    from populora_engines import vllm_engine

    import populora_core.services.gpu as gpu

    state: dict = {"total": 80 * GIB, "free": 80 * GIB, "llm": []}
    monkeypatch.setattr(gpu, "visible_gpu_memory", lambda: (state["free"], state["total"]))
    monkeypatch.setattr(vllm_engine, "_cuda_available", lambda: True)

    class LLM:
        def __init__(self, **kwargs):
            state["llm"].append(kwargs)
            config = SimpleNamespace(max_model_len=kwargs.get("max_model_len") or 512)
            self.llm_engine = SimpleNamespace(model_config=config)

        def generate(self, *args, **kwargs):
            raise Generating

    modules = {
        "vllm": types.ModuleType("vllm"),
        "vllm.inputs": types.ModuleType("vllm.inputs"),
        "vllm.lora": types.ModuleType("vllm.lora"),
        "vllm.lora.request": types.ModuleType("vllm.lora.request"),
        "vllm.distributed": types.ModuleType("vllm.distributed"),
        "vllm.distributed.parallel_state": types.ModuleType("vllm.distributed.parallel_state"),
    }
    modules["vllm"].LLM = LLM  # type: ignore[attr-defined]
    modules["vllm"].SamplingParams = dict  # type: ignore[attr-defined]
    modules["vllm.inputs"].TokensPrompt = dict  # type: ignore[attr-defined]
    modules["vllm.lora.request"].LoRARequest = lambda *args: SimpleNamespace(lora_path=args[2])  # type: ignore[attr-defined]
    modules["vllm.distributed.parallel_state"].cleanup_dist_env_and_memory = lambda: None  # type: ignore[attr-defined]
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    return state


def _vllm_run(tmp_path: Path, base: Path) -> Path:
    """A run directory whose recipe serves with vllm, both memory settings left to the plan (as every GPU recipe)."""
    run = F.write_run(tmp_path / "run", str(base), [("s0", "student", 1)])
    recipe = run / "recipe.yaml"
    engine = "engine:\n  name: vllm\n  params: {sleep: auto, gpu_memory_utilization: auto, max_model_len: 8192}\n"
    recipe.write_text(recipe.read_text() + engine)
    return run


@pytest.mark.slow  # ~15 s: the eval's imports and two engine starts' tokenizers
def test_eval_plans_vllm_alone_on_its_gpu_and_gets_past_engine_construction(fake_gpu, tmp_path, capsys):
    from populora_evals.cli import run_eval

    with pytest.raises(Generating):
        run_eval(target=str(_vllm_run(tmp_path, NANO)), benchmarks="aime24", limit=1, quiet=True, no_base=True)
    (kwargs,) = fake_gpu["llm"]
    # nothing trains during an eval: awake, the largest share whose peak (its own CUDA context beside the share)
    # leaves the margin: 0.93 x 80 GiB + 1 GiB <= 0.95 x 80 GiB, 0.94 would not
    assert kwargs["gpu_memory_utilization"] == pytest.approx(0.93)
    assert "enable_sleep_mode" not in kwargs
    chosen = "populora eval: engine 'vllm' alone on this GPU: engine.params.sleep: auto -> never"
    assert chosen in capsys.readouterr().err
    # 20 GiB held by another process: a smaller share, so vLLM's own check (free >= share x total) passes
    fake_gpu["free"] = 60 * GIB
    with pytest.raises(Generating):
        run_eval(target=str(_vllm_run(tmp_path / "b", NANO)), benchmarks="aime24", limit=1, quiet=True, no_base=True)
    held = fake_gpu["llm"][1]["gpu_memory_utilization"]
    assert held * 80 + 1 <= 0.95 * 80 - 20 < (held + 0.01) * 80 + 1


def test_an_eval_that_cannot_plan_says_who_and_why(fake_gpu, tmp_path):
    from populora_evals.cli import run_eval

    base = tmp_path / "unplannable"
    shutil.copytree(NANO, base)
    (base / "config.json").write_text('{"model_type": "no-such-model"}')
    with pytest.raises(UserError) as err:
        run_eval(target=str(_vllm_run(tmp_path, base)), benchmarks="aime24", limit=1, quiet=True, no_base=True)
    message = str(err.value)
    assert message.startswith("engine.params.sleep: auto is decided by a plan of this GPU")
    assert "set engine.params.sleep and engine.params.gpu_memory_utilization explicitly" in message
    assert "(populora eval could not plan engine 'vllm' alone on this GPU: model config" in message
    assert not fake_gpu["llm"]  # refused before vLLM was started
    # settings given: no plan needed, the engine starts as written
    with pytest.raises(Generating):
        run_eval(
            target=str(_vllm_run(tmp_path / "b", base)),
            benchmarks="aime24",
            limit=1,
            quiet=True,
            no_base=True,
            engine_params={"sleep": "never", "gpu_memory_utilization": 0.5},
        )
    assert fake_gpu["llm"][0]["gpu_memory_utilization"] == 0.5


def test_the_vllm_plan_counts_its_engine_process_context(plugins, qwen7b):
    from populora_core.recipe.validate import load_recipe
    from populora_core.run.plan import plan_recipe

    def plan(*overrides):
        recipe, _ = load_recipe(REPO / "recipes" / "azr_7b.yaml", list(overrides), plugins.registry)
        return plan_recipe(recipe, qwen7b, gpu_bytes=80 * GIB, registry=plugins.registry)

    fixed = ("engine.params.sleep=always", "engine.params.gpu_memory_utilization=0.45")
    own, shared = plan(*fixed), plan(*fixed, "engine.params.multiprocessing=false")
    rows = {r["what"]: r["gib"] for r in own["rows"]}
    assert rows["vLLM process CUDA context"] == 1.0
    assert {r["what"]: r["gib"] for r in shared["rows"]}["vLLM process CUDA context"] == 0.0
    for phase in ("generation_gib", "training_gib"):  # in both phases: sleep frees vLLM's pools, not its process
        assert own[phase] == pytest.approx(shared[phase] + 1.0, abs=0.01)


def _qwen_base(tmp_path: Path):
    from populora_core.api.components import BaseModel

    folder = tmp_path / "qwen7b"
    folder.mkdir(parents=True)
    shutil.copy(QWEN7B, folder / "config.json")
    return BaseModel(name="Qwen/Qwen2.5-7B", path=str(folder), dtype="bfloat16")


def test_the_run_plans_on_free_memory_when_other_processes_hold_some(plugins, tmp_path, monkeypatch):
    import populora_core.services.gpu as gpu
    from populora_core.recipe.validate import load_recipe
    from populora_core.run.assembly import planned_engine_params
    from populora_core.run.run_dir import RunDir
    from populora_core.services.gpu import CUDA_CONTEXT

    model, _ = load_recipe(REPO / "recipes" / "azr_7b.yaml", [], plugins.registry)
    run_dir = RunDir(tmp_path / "run")
    run_dir.path.mkdir()
    log = run_dir.path / "run.log"
    # free = total less this process's CUDA context (the trainer's terms count it): planned on total
    monkeypatch.setattr(gpu, "visible_gpu_memory", lambda: (141 * GIB - CUDA_CONTEXT, 141 * GIB))
    alone, _ = planned_engine_params(model, plugins.registry, _qwen_base(tmp_path / "a"), None, run_dir)
    assert "GPU memory at start: 141.0 GiB total, 140.5 GiB free; nothing held by other processes: planned on " in (
        log.read_text()
    )
    # another process holds 30 GiB: a row for it, and a smaller share for vLLM
    monkeypatch.setattr(gpu, "visible_gpu_memory", lambda: (111 * GIB - CUDA_CONTEXT, 141 * GIB))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        shared, _ = planned_engine_params(model, plugins.registry, _qwen_base(tmp_path / "b"), None, run_dir)
    assert "30.0 GiB held by other processes: planned on free memory" in log.read_text()
    assert shared.gpu_memory_utilization < alone.gpu_memory_utilization


def test_cuda_visible_devices_naming_no_gpu_is_an_error_naming_it(monkeypatch):
    import torch

    from populora_core.services.gpu import visible_gpu_bytes

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", "12.8")  # a CUDA build of torch that sees no GPU
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")
    with pytest.raises(UserError, match=r"CUDA_VISIBLE_DEVICES=7 names no GPU .*`nvidia-smi -L`"):
        visible_gpu_bytes()
    from populora_core.run.assembly import refuse_idle_gpus

    with pytest.raises(UserError, match="CUDA_VISIBLE_DEVICES=7"):  # a run stops before building anything
        refuse_idle_gpus()
    for cpu_on_purpose in ("", "-1"):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", cpu_on_purpose)
        assert visible_gpu_bytes() == 0
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")
    monkeypatch.setattr(torch.version, "cuda", None)  # a CPU build: the variable means nothing
    assert visible_gpu_bytes() == 0


def test_a_vllm_outside_the_checked_range_warns_where_the_engine_is_built(monkeypatch):
    import populora_core.services.installed as installed
    from populora_core.run.assembly import warn_unchecked_vllm

    monkeypatch.setattr(installed, "version", lambda dist: "0.35.1" if dist == "vllm" else None)
    with pytest.warns(UserWarning, match=r"vllm 0.35.1 is outside the range this code was checked against"):
        warn_unchecked_vllm("vllm")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_unchecked_vllm("hf")  # an hf run does not care which vLLM is installed
        monkeypatch.setattr(installed, "version", lambda dist: "0.34.0" if dist == "vllm" else None)
        warn_unchecked_vllm("vllm")


def test_the_trainer_gets_expandable_segments_unless_the_user_chose(monkeypatch):
    import os

    import populora_core.services.installed as installed
    from populora_core.services.runtime import ALLOCATOR_ENV, default_allocator

    for var in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"):
        monkeypatch.setenv(var, "")  # restored after the test, whatever default_allocator sets
        monkeypatch.delenv(var)
    assert default_allocator() == {}  # this CPU torch: nothing to set
    assert "PYTORCH_CUDA_ALLOC_CONF" not in os.environ
    monkeypatch.setattr(installed, "torch_cuda_version", lambda: "13.0")  # a CUDA build of torch
    assert default_allocator() == ALLOCATOR_ENV == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:False")
    assert default_allocator() == {}
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:False"


def test_the_vllm_engine_imports_vllm_before_it_asks_torch_about_cuda(fake_gpu, monkeypatch):
    """vLLM's import sets how torch looks for GPUs (NVML, no CUDA context) and how its workers start: an engine built
    directly in a fresh process that asked ``torch.cuda`` first would fork a CUDA context into vLLM's workers."""
    import importlib.abc
    import importlib.util

    from populora_engines import VLLMEngineParams, vllm_engine

    from populora_core.api import get_registry
    from populora_core.api.records import LoraSettings

    order: list[str] = []
    stand_in = sys.modules["vllm"]
    monkeypatch.delitem(sys.modules, "vllm")  # not imported yet, as in a fresh process

    class Loader(importlib.abc.Loader):
        def create_module(self, spec):
            order.append("import vllm")
            return stand_in

        def exec_module(self, module):
            pass

    class Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            return importlib.util.spec_from_loader(name, Loader()) if name == "vllm" else None

    monkeypatch.setattr(sys, "meta_path", [Finder(), *sys.meta_path])
    monkeypatch.setattr(vllm_engine, "_cuda_available", lambda: order.append("torch.cuda") or True)
    params = VLLMEngineParams(sleep="never", gpu_memory_utilization=0.5, max_model_len=512)
    nano = get_registry().base_model("nano")
    vllm_engine.VLLMEngine(params, base_model=nano, lora=LoraSettings(rank=8, alpha=16.0), seed=0)
    assert fake_gpu["llm"] and order[:2] == ["import vllm", "torch.cuda"], order
