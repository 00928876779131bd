"""A plugin whose registration misspells a keyword (``min_parent``): refused when it loads, with a row in
``populora plugins`` naming the keyword, as a plugin that fails at import is."""

from populora_core.api import hookimpl


def first_parent(parents, params, generator):  # type: ignore[no-untyped-def]
    """The first parent unchanged (never run: the registration is refused)."""
    return parents[0]


@hookimpl
def register_operators(register):  # type: ignore[no-untyped-def]
    register("first_parent", first_parent, min_parent=1, max_parents=1)
