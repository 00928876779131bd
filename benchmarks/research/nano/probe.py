"""The model card's measurement: nano's probe accuracy and proposal validity (``populora_nano.probe``'s API).

CLI (engine ``hf``, tasks and ``sandbox`` executor from the registry)::

    python -m benchmarks.research.nano.probe [--adapter DIR ...] [--proposals 20] [--out result.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from populora_nano.probe import TASK_TYPES, evaluate_probe, load_probe, use_as_references

from populora_core.api.components import AdapterRef


def _adapter_name(path: Path) -> str:
    return path.name or str(path)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.research.nano.probe", description=__doc__.split("\n")[0])
    ap.add_argument("--adapter", action="append", default=[], type=Path, help="PEFT adapter dir (repeatable)")
    ap.add_argument("--base-model", default="nano", help="registered base model name")
    ap.add_argument("--probe", type=Path, default=None, help="probe file (default: the shipped probe.jsonl)")
    ap.add_argument("--model-dir", type=Path, default=None, help="evaluate this model dir instead of --base-model")
    ap.add_argument("--proposals", type=int, default=20, help="proposer prompts per task type (0: skip)")
    ap.add_argument("--limit", type=int, default=None, help="first N problems per task type")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None, help="also write the result JSON here")
    args = ap.parse_args(argv)

    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from populora_core.api import get_registry
    from populora_core.api.components import BaseModel, LoraSettings

    reg = get_registry()
    if args.model_dir is not None:
        base = BaseModel(path=str(args.model_dir), name=args.model_dir.name, dtype="float32")
    else:
        base = reg.base_model(args.base_model)
    problems = load_probe(args.probe)
    if args.limit is not None:
        problems = [p for t in TASK_TYPES for p in [q for q in problems if q.task_type == t][: args.limit]]
    executor = reg.get("executor", "sandbox").build()
    try:
        tasks: dict[str, Any] = {}
        for name in TASK_TYPES:
            tasks[name] = reg.get("task", name).build(
                {"style": "compact"}, executor=executor, rng=args.seed, tasks=tasks
            )
        use_as_references(tasks, problems)
        engine = reg.get("engine", "hf").build(base_model=base, lora=LoraSettings(), seed=args.seed)
        adapters: dict[str, AdapterRef | None] = {"base": None}
        for path in args.adapter:
            adapters[_adapter_name(path)] = AdapterRef(_adapter_name(path), str(path))
        try:
            result = evaluate_probe(engine, adapters, tasks, problems, proposals=args.proposals, seed=args.seed)
        finally:
            engine.close()
    finally:
        executor.close()
    text = json.dumps(result, indent=1)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
