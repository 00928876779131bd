"""``populora evolve``: one child adapter from parent PEFT directories, with a lineage record.

The operator is looked up in the registry, so operators of third-party plugins work the same way.
Heavy imports (torch, safetensors) happen only when the command runs.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from populora_core.api.errors import UserError
from populora_core.services.files import atomic_dir

LINEAGE_FILE = "lineage.json"


def parse_sets(sets: Sequence[str]) -> dict[str, Any]:
    """``key=value`` pairs, values read as YAML (``0.3``, ``true``, ``[0.7, 0.3]``, ``null``)."""
    import yaml

    raw: dict[str, Any] = {}
    for item in sets:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UserError(f"--set {item!r}: expected key=value")
        if key in raw:
            raise UserError(f"--set {key} given twice")
        try:
            raw[key] = yaml.safe_load(value) if value.strip() else None
        except yaml.YAMLError as exc:
            raise UserError(f"--set {key}: cannot parse value {value!r}: {exc}") from None
    return raw


def evolve(
    registry: Any, operator: str, parents: Sequence[str], out: str, sets: Sequence[str], seed: int
) -> dict[str, Any]:
    """Run one operator end to end; returns the lineage record (also written as ``lineage.json``)."""
    from pydantic import ValidationError

    from populora_core.api import format_validation_error
    from populora_core.services.adapters import adapter_hash, load_lora, write_peft_files
    from populora_core.services.operators import apply_operator

    comp = registry.get("operator", operator)
    try:
        params = comp.parse_params(parse_sets(sets))
    except ValidationError as exc:
        raise UserError(
            f"operator {operator!r}: bad --set: {format_validation_error(exc, model=comp.params_model)}"
        ) from None
    dest = Path(out)
    if dest.exists():
        raise UserError(f"--out {dest} exists (adapter versions are never overwritten)")
    child = apply_operator(comp, params, [load_lora(p) for p in parents], int(seed))

    record = {
        "operator": operator,
        "plugin": comp.plugin,
        "plugin_version": comp.version,
        "params": params.model_dump(mode="json"),
        "parents": [{"path": str(Path(p).resolve()), "hash": adapter_hash(p)} for p in parents],
        "seed": int(seed),
        "created_utc": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    with atomic_dir(dest) as tmp:  # the adapter appears with its lineage record, or not at all
        write_peft_files(child, tmp)
        record["hash"] = adapter_hash(tmp)
        (tmp / LINEAGE_FILE).write_text(json.dumps(record, indent=2) + "\n")
    return record


def add_evolve_command(cli: Any) -> None:
    import click

    @cli.command("evolve")
    @click.argument("operator")
    @click.option(
        "--parent",
        "parents",
        multiple=True,
        required=True,
        metavar="DIR",
        help="Parent PEFT adapter directory (repeat for crossovers; best first).",
    )
    @click.option("--out", required=True, metavar="DIR", help="New adapter directory (must not exist).")
    @click.option(
        "--set", "sets", multiple=True, metavar="KEY=VALUE", help="Operator parameter, value read as YAML (repeatable)."
    )
    @click.option("--seed", type=int, required=True, help="Seed of the operator's torch.Generator.")
    @click.pass_obj
    def evolve_cmd(
        manager: Any, operator: str, parents: tuple[str, ...], out: str, sets: tuple[str, ...], seed: int
    ) -> None:
        """Make one child adapter from parent PEFT dirs with a LoRA weight-space operator.

        \b
          populora evolve gaussian --parent runs/nano/adapters/s0@v8 --out child --seed 1 --set eps=0.1
          populora evolve svd --parent A --parent B --out child --seed 2
        """
        record = evolve(manager.registry, operator, parents, out, sets, seed)
        click.echo(f"{out}: {operator} of {len(parents)} parent(s), seed {seed}, hash {record['hash'][:12]}")
