"""Every hook is documented with its exact signature (as datasette does) and exercised by a test."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from populora_core import hookspecs
from populora_core.plugins import PluginManager

REPO = Path(__file__).resolve().parents[1]


def _hooks() -> dict[str, str]:
    names = PluginManager().hook_names()
    return {n: f"{n}({', '.join(inspect.signature(getattr(hookspecs, n)).parameters)})" for n in names}


def test_every_hook_is_documented_with_its_exact_signature():
    docs = (REPO / "CONTRIBUTING.md").read_text()
    documented = {name: sig for sig, name in re.findall(r"^### `((\w+)\([^)]*\))`", docs, flags=re.M)}
    hooks = _hooks()
    missing = sorted(set(hooks) - set(documented))
    assert not missing, f"hooks missing from CONTRIBUTING.md's hook reference: {missing}"
    wrong = {n: (documented[n], sig) for n, sig in hooks.items() if documented[n] != sig}
    assert not wrong, f"documented signatures differ from hookspecs.py: {wrong}"
    stale = sorted(n for n in documented if n not in hooks and n.startswith(("register_", "on_", "after_", "before_")))
    assert not stale, f"CONTRIBUTING.md documents hooks that do not exist: {stale}"


def test_every_hook_has_a_test():
    """Each hook name appears as an implemented hook or a registration in some test module."""
    sources = "\n".join(p.read_text() for p in (REPO / "tests").rglob("*.py") if p.name != Path(__file__).name)
    untested = [n for n in _hooks() if not re.search(rf"def {n}\(", sources)]
    assert not untested, f"hooks without a test implementing them: {untested}"
