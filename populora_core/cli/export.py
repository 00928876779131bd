"""``populora export``: one member of a run as a PEFT adapter folder (with a card) or merged into its base.

The adapter folder is what ``peft.PeftModel.from_pretrained(base, OUT)`` and ``vllm serve BASE --enable-lora
--lora-modules NAME=OUT`` load; its card (``README.md``) says where it came from: the run, its lineage back to the
fresh adapter it started as, its rating and its probe accuracy. ``--merge`` writes a full model (base + LoRA delta,
``merge_and_unload``) with the base's tokenizer, loadable by ``transformers`` and vLLM alone.
torch, transformers and peft are imported only for ``--merge``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from ..api.errors import UserError
from ..api.files import MEMBER_ID, VERSION_NAME, atomic_dir
from ..run.run_dir import RunDir


def resolve_version(run_dir: RunDir, member: str) -> tuple[str, dict[str, Any] | None]:
    """``s0`` (its current version, from ``members.json``) or ``s0@v3`` -> (version name, member record or None)."""
    members_file = run_dir.path / "members.json"
    if not members_file.is_file():
        raise UserError(f"{run_dir.path}: no members.json (the run has no checkpoint yet); nothing to export")
    if MEMBER_ID.fullmatch(member) is None and VERSION_NAME.fullmatch(member) is None:
        raise UserError(
            f"member {member!r} is neither a member id (s0) nor a version (s0@v3) of {run_dir.path}: "
            "a member names a folder of the run's adapters/, nothing outside it"
        )
    members = {m["id"]: m for m in json.loads(members_file.read_text())["members"]}
    member_id, _, version = member.partition("@")
    record = members.get(member_id)
    if not version:
        if record is None:
            raise UserError(f"member {member!r} is not in {run_dir.path} (members: {', '.join(sorted(members))})")
        version_name = f"{member_id}@v{record['version']}"
    else:
        version_name = member
    if not run_dir.adapter_path(version_name).is_dir():
        kept = sorted(p.name for p in run_dir.adapters.iterdir() if p.name.startswith(f"{member_id}@"))
        raise UserError(
            f"adapter {version_name} is not in {run_dir.adapters} "
            f"(kept versions of {member_id}: {', '.join(kept) or 'none'}; `adapters.keep` decides which stay)"
        )
    return version_name, record if record is not None and version_name == f"{member_id}@v{record['version']}" else None


def lineage_chain(run_dir: RunDir, version_name: str) -> list[dict[str, Any]]:
    """The births from the fresh adapter to ``version_name``'s member: each child record, oldest first."""
    births = {r["child"]: r for r in run_dir.read_log("lineage.jsonl")}
    chain, name = [], f"{version_name.split('@')[0]}@v0"
    while name in births:
        record = births[name]
        chain.append(record)
        parents = record.get("parents") or []
        name = f"{parents[0].split('@')[0]}@v0" if parents else ""
    return chain[::-1]


def probe_accuracy(run_dir: RunDir, version_name: str) -> dict[str, float]:
    """Greedy probe accuracy per task type of ``version_name`` at its last probe ({} when it was never probed)."""
    mine = [r for r in run_dir.read_log("probe.jsonl") if r.get("version") == version_name]
    last = max((r["step"] for r in mine), default=None)
    return {r["task_type"]: float(r["accuracy"]) for r in mine if r["step"] == last}


def card(
    run_dir: RunDir,
    version_name: str,
    record: dict[str, Any] | None,
    recipe: dict[str, Any],
    folder: Path,
    base_path: str,
    merged: bool,
) -> str:
    """The folder's README.md; ``folder`` is where it will be found, ``base_path`` where the base was found."""
    base = recipe.get("base_model", {}).get("name", "?")
    lines = [
        f"# {version_name} from the PopuLoRA run `{run_dir.path.name}`",
        "",
        f"- run: `{run_dir.path.resolve()}` (recipe `{recipe.get('name', '?')}`, seed {recipe.get('seed')}, "
        f"{recipe.get('steps')} steps)",
        f"- base model: `{base}`" + (" (merged into these weights)" if merged else " (load this adapter on it)"),
    ]
    if record is not None:
        rating = record.get("rating", {})
        lines.append(
            f"- role: {record.get('role')}; rating mu {rating.get('mu', float('nan')):.2f}, "
            f"sigma {rating.get('sigma', float('nan')):.2f}; {record.get('counters', {}).get('updates', 0)} updates"
        )
    accuracy = probe_accuracy(run_dir, version_name)
    if accuracy:
        lines.append(
            "- probe accuracy (greedy): " + ", ".join(f"{task} {value:.2f}" for task, value in sorted(accuracy.items()))
        )
    chain = lineage_chain(run_dir, version_name)
    if chain:
        lines += ["", "## Lineage", "", "| step | born | parents | operator |", "| --- | --- | --- | --- |"]
        for birth in chain:
            parents = ", ".join(birth.get("parents") or []) or "-"
            lines.append(f"| {birth['step']} | {birth['child']} | {parents} | {birth['operator']} |")
    # the snippet names this folder and the base where this process found it (never a registered short name
    # such as "nano", which the hub does not know), so it runs as written on this machine
    here = folder.resolve()
    if merged:
        imports = "from transformers import AutoModelForCausalLM, AutoTokenizer"
        load = [
            f'model = AutoModelForCausalLM.from_pretrained("{here}")',
            f'tokenizer = AutoTokenizer.from_pretrained("{here}")',
        ]
        serve = f"vLLM: `vllm serve {here}`"
    else:
        imports = "from peft import AutoPeftModelForCausalLM\nfrom transformers import AutoTokenizer"
        load = [
            f'model = AutoPeftModelForCausalLM.from_pretrained("{here}")  # the base named in adapter_config.json',
            f'tokenizer = AutoTokenizer.from_pretrained("{base_path}")',
        ]
        serve = f"vLLM: `vllm serve {base_path} --enable-lora --lora-modules {version_name.replace('@', '-')}={here}`"
    usage = ["", "## Use", "", "```python", imports, "", *load, "```", "", serve]
    return "\n".join(lines + usage) + "\n"


def export(run_path: str, member: str, out: str, *, merge: bool, registry: Any) -> Path:
    """Write ``member`` of the run at ``run_path`` to ``out`` (a new or empty folder); returns ``out``."""
    run_dir = RunDir(run_path)
    if not (run_dir.path / "recipe.yaml").is_file():
        raise UserError(f"{run_path}: not a run directory (no recipe.yaml)")
    target = Path(out)
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise UserError(f"--out {out}: exists and is not an empty folder; choose a new one")
    version_name, record = resolve_version(run_dir, member)
    recipe = run_dir.read_recipe()
    source = run_dir.adapter_path(version_name)
    ref = recipe.get("base_model", {})
    base = registry.base_model(ref.get("name"), ref.get("params") or None)
    with atomic_dir(target, replace=target.exists()) as tmp:
        if merge:
            _merge(base.path, source, tmp)
        else:
            for name in ("adapter_model.safetensors", "adapter_config.json"):
                shutil.copy2(source / name, tmp / name)
            config = json.loads((tmp / "adapter_config.json").read_text())
            config["base_model_name_or_path"] = base.path  # where this process found the base
            (tmp / "adapter_config.json").write_text(json.dumps(config, indent=2))
        (tmp / "README.md").write_text(card(run_dir, version_name, record, recipe, target, base.path, merge))
    return target


def _merge(base_path: str, adapter: Path, out: Path) -> None:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32)
    merged = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
    merged.save_pretrained(out)
    AutoTokenizer.from_pretrained(base_path).save_pretrained(out)
