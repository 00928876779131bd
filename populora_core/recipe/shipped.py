"""The recipes this package ships (``populora_core/recipes/``; a clone's ``recipes/`` links there), by name.

A pip install has no clone's ``recipes/`` folder, so ``populora run nano`` (or ``azr_7b``) finds the shipped file from
any folder; a path that names an existing file always wins. ``recipes/configs/`` holds the model configs that let
``populora plan`` size the 7B recipes offline (the hub repositories may be gated).
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path

from ..api.errors import UserError

#: The shipped recipes and, under ``configs/``, their base models' config.json files.
SHIPPED_DIR = Path(__file__).resolve().parents[1] / "recipes"


def shipped_recipes() -> dict[str, Path]:
    """Name (the file's stem) -> file, sorted by name."""
    return {p.stem: p for p in sorted(SHIPPED_DIR.glob("*.yaml"))}


def summary(path: Path, width: int = 110) -> str:
    """A recipe's one-line description: the first sentence of its header comment, cut at a word near ``width``."""
    header = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        header.append(line.lstrip("#").strip())
    text = " ".join(header)
    sentence = re.split(r"\.\s+(?=[A-Z])", text, maxsplit=1)[0].rstrip(".")
    if len(sentence) <= width:
        return sentence
    return sentence[:width].rsplit(" ", 1)[0] + " ..."


def _bare_name(spec: str) -> str | None:
    """``nano`` or ``nano.yaml`` (no folder) -> ``nano``; a path with a folder -> None."""
    if "/" in spec or "\\" in spec:
        return None
    return spec.removesuffix(".yaml").removesuffix(".yml")


def not_found(spec: str) -> UserError:
    """The error for a recipe that is neither a file nor a shipped name: did-you-mean and the list."""
    shipped = shipped_recipes()
    stem = Path(spec).name.removesuffix(".yaml").removesuffix(".yml")
    near = difflib.get_close_matches(stem, list(shipped), n=1, cutoff=0.6)
    if stem in shipped:  # a path such as recipes/nano.yaml outside a clone
        hint = f"`populora run {stem}` runs the shipped recipe of that name; "
    elif near:
        hint = f"did you mean {near[0]}? "
    else:
        hint = ""
    return UserError(
        f"recipe not found: {spec} (no such file, and no shipped recipe has that name); {hint}"
        f"shipped recipes: {', '.join(shipped) or 'none'} (`populora recipes` describes them, "
        "`populora recipes copy NAME` writes an editable copy)"
    )


def resolve_recipe(spec: str | Path) -> Path:
    """The recipe file ``spec`` names: an existing file as given, else the shipped recipe of that bare name."""
    file = Path(spec).expanduser()
    if file.is_file():
        return file
    name = _bare_name(str(spec))
    shipped = shipped_recipes()
    if name is not None and name in shipped:
        return shipped[name]
    raise not_found(str(spec))


def shipped_recipe(name: str) -> Path:
    """The shipped recipe ``name`` (``nano``, ``nano.yaml``); an unknown name is the not-found error."""
    bare = _bare_name(name)
    shipped = shipped_recipes()
    if bare is None or bare not in shipped:
        raise not_found(name)
    return shipped[bare]
