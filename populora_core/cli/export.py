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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..api.errors import UserError
from ..api.names import MEMBER_ID, VERSION_NAME
from ..run.run_dir import RunDir
from ..services.files import atomic_dir, remove_stale


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


@dataclass(frozen=True)
class PortableBase:
    """How an export names its base so that another machine can find it: ``name`` goes into
    ``adapter_config.json``'s ``base_model_name_or_path``; ``kind`` is ``registered`` (a name a populora plugin
    registers, e.g. ``nano``), ``hub`` (a hub id) or ``local`` (a folder: its absolute path, this machine's only)."""

    name: str
    kind: str
    path: str  # where this process found the base
    params: dict[str, Any]
    plugin_files: tuple[str, ...] = ()  # the --plugin file that registers it, if a file does
    provider: str = ""  # the plugin (and its package and version) that registers it


def portable_base(recipe: dict[str, Any], registry: Any, manager: Any = None) -> PortableBase:
    """The recipe's base model as an export names it: never the clone's or the cache's path of a registered name or
    hub id (an adapter would then load only on the machine that made it)."""
    ref = recipe.get("base_model", {})
    ref = {"name": ref} if isinstance(ref, str) else ref
    name, params = str(ref.get("name")), dict(ref.get("params") or {})
    base = registry.base_model(name, params or None)
    if name in registry.names("base_model"):
        plugin = registry.get("base_model", name).plugin
        info = getattr(manager, "plugins", {}).get(plugin)
        files = (info.source,) if info is not None and plugin.startswith("file:") else ()
        provider = f"plugin {plugin}" + (f" ({info.source} {info.version})" if info is not None else "")
        return PortableBase(name, "registered", base.path, params, files, provider)
    if Path(name).expanduser().exists():
        return PortableBase(str(Path(name).expanduser().resolve()), "local", base.path, {})
    return PortableBase(name, "hub", base.path, {})


def card(
    run_dir: RunDir,
    version_name: str,
    record: dict[str, Any] | None,
    recipe: dict[str, Any],
    folder: Path,
    base: PortableBase,
    merged: bool,
) -> str:
    """The folder's README.md; ``folder`` is where it will be found."""
    how = " (merged into these weights)" if merged else " (load this adapter on it)"
    named = {
        "registered": f"`{base.name}`, a name registered by {base.provider}: installed with it, on any machine",
        "hub": f"`{base.name}` (Hugging Face hub id)",
        "local": f"the local folder `{base.name}`: a path on the machine that made this export; elsewhere load "
        "your copy of the base and this adapter on it",
    }[base.kind]
    lines = [
        f"# {version_name} from the PopuLoRA run `{run_dir.path.name}`",
        "",
        f"- run: `{run_dir.path.resolve()}` (recipe `{recipe.get('name', '?')}`, seed {recipe.get('seed')}, "
        f"{recipe.get('steps')} steps)",
        f"- base model: {named}{how}",
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
    # the snippet names this folder by its absolute path, so it runs from any working folder; a registered base
    # (the hub does not know "nano") is found through the installed plugin that registers it, wherever that is
    here = folder.resolve()
    lora_name = version_name.replace("@", "-")
    if merged:
        imports = "from transformers import AutoModelForCausalLM, AutoTokenizer"
        load = [
            f'model = AutoModelForCausalLM.from_pretrained("{here}")',
            f'tokenizer = AutoTokenizer.from_pretrained("{here}")',
        ]
        serve = f"vLLM: `vllm serve {here}`"
    elif base.kind == "registered":
        lookup = f"get_registry({list(base.plugin_files)!r})" if base.plugin_files else "get_registry()"
        args = f'"{base.name}"' + (f", {base.params!r}" if base.params else "")
        imports = (
            "from peft import PeftModel\nfrom transformers import AutoModelForCausalLM, AutoTokenizer\n\n"
            "from populora_core.api import get_registry"
        )
        load = [
            f"base = {lookup}.base_model({args}).path  # where the installed plugin keeps {base.name}",
            f'model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), "{here}")',
            "tokenizer = AutoTokenizer.from_pretrained(base)",
        ]
        serve = f"vLLM: `vllm serve BASE --enable-lora --lora-modules {lora_name}={here}` (BASE: the snippet's `base`)"
    else:
        imports = "from peft import AutoPeftModelForCausalLM\nfrom transformers import AutoTokenizer"
        load = [
            f'model = AutoPeftModelForCausalLM.from_pretrained("{here}")  # the base named in adapter_config.json',
            f'tokenizer = AutoTokenizer.from_pretrained("{base.name}")',
        ]
        serve = f"vLLM: `vllm serve {base.name} --enable-lora --lora-modules {lora_name}={here}`"
    usage = ["", "## Use", "", "```python", imports, "", *load, "```", "", serve]
    return "\n".join(lines + usage) + "\n"


def export(
    run_path: str,
    member: str,
    out: str,
    *,
    merge: bool,
    registry: Any,
    manager: Any = None,
    note: Callable[[str], None] | None = None,
) -> Path:
    """Write ``member`` of the run at ``run_path`` to ``out`` (a new or empty folder); returns ``out``.
    ``manager`` (optional) names the plugin that registers a registered base, and its file for a ``--plugin``. What
    an export of ``out`` killed mid-write left (its hidden ``.OUT.<pid>-<hex>/``, a merged model's size) is removed
    first, and ``note`` says so."""
    run_dir = RunDir(run_path)
    if not (run_dir.path / "recipe.yaml").is_file():
        raise UserError(f"{run_path}: not a run directory (no recipe.yaml)")
    target = Path(out)
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise UserError(f"--out {out}: exists and is not an empty folder; choose a new one")
    version_name, record = resolve_version(run_dir, member)
    recipe = run_dir.read_recipe()
    source = run_dir.adapter_path(version_name)
    base = portable_base(recipe, registry, manager)
    for left, size in remove_stale(target):
        (note or print)(f"removed {left} ({size:,} bytes), left by an export of {out} that was killed mid-write")
    with atomic_dir(target, replace=target.exists()) as tmp:
        if merge:
            _merge(base.path, source, tmp)
        else:
            for name in ("adapter_model.safetensors", "adapter_config.json"):
                shutil.copy2(source / name, tmp / name)
            config = json.loads((tmp / "adapter_config.json").read_text())
            config["base_model_name_or_path"] = base.name  # the hub id or registered name; a path only for a folder
            (tmp / "adapter_config.json").write_text(json.dumps(config, indent=2))
        (tmp / "README.md").write_text(card(run_dir, version_name, record, recipe, target, base, merge))
    return target


def _merge(base_path: str, adapter: Path, out: Path) -> None:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32)
    merged = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
    merged.save_pretrained(out)
    AutoTokenizer.from_pretrained(base_path).save_pretrained(out)
