"""What ``populora eval TARGET`` evaluates: a run directory, one adapter directory, or a base model."""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from populora_core.api import UserError
from populora_core.api.components import AdapterRef, BaseModel, LoraSettings
from populora_core.services.adapters import CONFIG_FILE, adapter_hash, is_adapter_dir


@dataclass
class Subject:
    """One model to evaluate: the base alone, or base + one adapter version."""

    label: str
    group: str  # "base" | "population" | "baseline" | "adapter"
    adapter: AdapterRef | None = None
    adapter_hash: str | None = None
    member: dict[str, Any] = field(default_factory=dict)

    def identity(self) -> str:
        """Cache identity: adapter version name + weights hash (the base: "base")."""
        return f"{self.adapter.name}#{self.adapter_hash}" if self.adapter else "base"


@dataclass
class Target:
    kind: str  # "run" | "adapter" | "base"
    base_model: BaseModel
    base_fingerprint: str
    subjects: list[Subject]
    run_dir: Path | None = None
    recipe: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def context(self) -> int | None:
        """The base model's context in tokens (``max_position_embeddings`` of its config.json); None: not stated."""
        return context_length(self.base_model.path)

    def prompt_lengths(self, prompts: list[str]) -> list[int]:
        """Each prompt's tokens as the engines feed them (``populora_engines.completions.encode_prompts``: the base's
        tokenizer, through its chat template when the base uses one)."""
        tokenizer = _tokenizer(self.base_model.path)
        if not self.base_model.chat_template:
            return [len(ids) for ids in tokenizer(prompts, verbose=False)["input_ids"]]  # too long: counted by us
        out = []
        for prompt in prompts:
            ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True)
            out.append(len(ids["input_ids"] if hasattr(ids, "keys") else ids))
        return out

    def lora_settings(self) -> LoraSettings:
        """Largest rank and all target modules over the adapters (what an engine must accept)."""
        configs = [json.loads((Path(s.adapter.path) / CONFIG_FILE).read_text()) for s in self.subjects if s.adapter]
        if not configs:
            return LoraSettings()
        rank = max(int(c["r"]) for c in configs)  # every PEFT LoRA config states its rank (lora_scale reads it)
        alpha = max(float(c.get("lora_alpha", rank)) for c in configs)
        modules: list[str] = []
        for c in configs:
            tm = c.get("target_modules") or []
            for m in [tm] if isinstance(tm, str) else tm:
                if m not in modules:
                    modules.append(m)
        return LoraSettings(rank=rank, alpha=alpha, target_modules=tuple(sorted(modules)))


@functools.cache
def _tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def context_length(path: str) -> int | None:
    """``max_position_embeddings`` of a local model's config.json (or of its ``text_config``); None if absent."""
    config = Path(path) / "config.json"
    try:
        data = json.loads(config.read_text())
    except (OSError, ValueError):
        return None
    for section in (data, data.get("text_config") or {}):
        value = section.get("max_position_embeddings")
        if isinstance(value, int) and value > 0:
            return value
    return None


def model_fingerprint(path: str) -> str:
    """Identity of a base model for the cache: config + weight file names/sizes for a local dir."""
    p = Path(path)
    if not p.is_dir():
        return f"name:{path}"
    digest = hashlib.sha256()
    for f in sorted(p.iterdir()):
        if f.name == "config.json":
            digest.update(f.read_bytes())
        elif f.suffix in (".safetensors", ".bin", ".pt", ".gguf"):
            digest.update(f"{f.name}:{f.stat().st_size}".encode())
    return f"{p.resolve()}:{digest.hexdigest()[:16]}"


def resolve_base_model(spec: Any, *, relative_to: Path | None = None, dtype: str = "auto") -> BaseModel:
    """A recipe's ``base_model`` (str or {name, params}) through the core; a relative path may be the run's."""
    from dataclasses import replace

    from populora_core.api import get_registry

    params: dict[str, Any] = {}
    if isinstance(spec, dict):
        params = dict(spec.get("params") or {})
        spec = spec.get("name") or spec.get("path")
    if not isinstance(spec, str) or not spec:
        raise UserError(f"base_model must name a model (registered name, path or hub id), not {spec!r}")
    if relative_to is not None and not Path(spec).expanduser().exists() and (relative_to / spec).exists():
        spec = str(relative_to / spec)
    model = get_registry().base_model(spec, params)
    return model if dtype == "auto" else replace(model, dtype=dtype)


def _load_yaml(path: Path) -> dict[str, Any]:
    import yaml

    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise UserError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a mapping")
    return data


def read_members(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "members.json"
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise UserError(f"{path}: cannot read members ({exc})") from None
    members = raw.get("members") if isinstance(raw, dict) else raw
    if not isinstance(members, list) or not all(isinstance(m, dict) for m in members):
        raise UserError(f"{path}: expected a list of member objects with id, role, version")
    for m in members:
        for key in ("id", "role", "version"):
            if key not in m:
                raise UserError(f"{path}: member {m} lacks {key!r} (expected fields id, role, version)")
    return members


ROLE_FILTERS = {"students": ("student", "both"), "teachers": ("teacher", "both"), "all": ("teacher", "student", "both")}


def run_subjects(run_dir: Path, roles: str, group: str, prefix: str = "") -> tuple[list[Subject], list[str]]:
    """The final population's members (by role) as subjects; adapters at adapters/<id>@v<version>/."""
    members = read_members(run_dir)
    notes = []
    chosen = [m for m in members if m["role"] in ROLE_FILTERS[roles]]
    if not chosen:
        notes.append(f"{run_dir}: no member with role in {ROLE_FILTERS[roles]}; evaluating all members")
        chosen = members
    subjects = []
    for m in chosen:
        name = f"{m['id']}@v{m['version']}"
        path = run_dir / "adapters" / name
        if not is_adapter_dir(path):
            raise UserError(f"{run_dir}: member {m['id']} version {m['version']} has no adapter at {path}")
        subjects.append(
            Subject(
                label=f"{prefix}{name}",
                group=group,
                adapter=AdapterRef(f"{prefix}{name}", str(path.resolve())),
                adapter_hash=adapter_hash(path),
                member=dict(m),
            )
        )
    return subjects, notes


def _check_not_a_missing_folder(target: str) -> None:
    """A TARGET written as a path that does not exist (``runs/nanoo``: its folder ``runs/`` is here) is named as a
    missing run directory with the nearest one, not sent to the hub as a model id; a registered name passes."""
    import difflib

    from populora_core.api import get_registry

    path = Path(target).expanduser()
    if path.exists() or target in get_registry().names("base_model"):
        return
    written_as_path = target.startswith((".", "/", "~")) or target.endswith("/") or target.count("/") > 1
    parent = path.parent
    if not written_as_path and not (str(parent) not in ("", ".") and parent.is_dir()):
        return  # org/name: a hub id
    siblings = sorted(p.name for p in parent.iterdir() if p.is_dir()) if parent.is_dir() else []
    near = difflib.get_close_matches(path.name, siblings, n=1)
    hint = f"did you mean {parent / near[0]}? " if near else ""
    held = f"{parent}/ holds: {', '.join(siblings[:12])}" if siblings else f"{parent}/ does not exist"
    raise UserError(
        f"{target}: no such run directory, adapter folder or model folder ({hint}{held}); "
        "`populora runs` lists the runs"
    )


def resolve_target(
    target: str,
    *,
    base_model: str | None = None,
    roles: str = "students",
    baseline: str | None = None,
    dtype: str = "auto",
    include_base: bool = True,
) -> Target:
    path = Path(target).expanduser()
    notes: list[str] = []
    if path.is_dir() and (path / "members.json").is_file():
        recipe = _load_yaml(path / "recipe.yaml") if (path / "recipe.yaml").is_file() else {}
        spec = base_model or recipe.get("base_model")
        if spec is None:
            raise UserError(f"{path}: recipe.yaml has no base_model; pass --base-model")
        model = resolve_base_model(spec, relative_to=path, dtype=dtype)
        subjects, notes = run_subjects(path, roles, "population")
        subjects.insert(0, Subject("base", "base"))
        kind, run_dir = "run", path
    elif is_adapter_dir(path):
        config = json.loads((path / CONFIG_FILE).read_text())
        spec = base_model or config.get("base_model_name_or_path")
        if not spec:
            raise UserError(f"{path}: adapter_config.json has no base_model_name_or_path; pass --base-model")
        model = resolve_base_model(spec, relative_to=path, dtype=dtype)
        name = path.resolve().name
        subjects = [
            Subject("base", "base"),
            Subject(name, "adapter", AdapterRef(name, str(path.resolve())), adapter_hash(path)),
        ]
        kind, run_dir, recipe = "adapter", None, {}
    elif path.is_dir() and (path / "adapter_config.json").is_file():
        raise UserError(f"{path}: adapter_config.json present but no adapter_model.safetensors")
    else:
        if base_model is None:
            _check_not_a_missing_folder(target)
        model = resolve_base_model(base_model or target, dtype=dtype)
        subjects = [Subject("base", "base")]
        kind, run_dir, recipe = "base", None, {}
    if baseline:
        bpath = Path(baseline).expanduser()
        if not (bpath / "members.json").is_file():
            raise UserError(f"--baseline {bpath}: not a run directory (no members.json)")
        brecipe = _load_yaml(bpath / "recipe.yaml") if (bpath / "recipe.yaml").is_file() else {}
        bspec = brecipe.get("base_model")
        if bspec is not None and base_model is None:
            bmodel = resolve_base_model(bspec, relative_to=bpath, dtype=dtype)
            if model_fingerprint(bmodel.path) != model_fingerprint(model.path):
                raise UserError(
                    f"--baseline {bpath} uses base model {bmodel.path}, the target uses "
                    f"{model.path}: a comparison needs one base model"
                )
        bsubjects, bnotes = run_subjects(bpath, roles, "baseline", prefix="baseline:")
        subjects += bsubjects
        notes += bnotes
    if not include_base and kind != "base":
        subjects = [s for s in subjects if s.group != "base"]
    return Target(kind, model, model_fingerprint(model.path), subjects, run_dir, recipe, notes)
