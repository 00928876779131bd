"""Errors the CLI turns into a clear message and an exit code instead of a traceback."""

from __future__ import annotations

from collections.abc import Callable, Iterable


class PopuloraError(Exception):
    """Base class of every error the toolkit raises on purpose."""


class UserError(PopuloraError):
    """Bad input from the user (recipe, file, argument): exit code 2, no traceback."""

    exit_code = 2


class RecipeError(UserError):
    """A recipe that does not validate. ``location`` names the recipe file and YAML path."""

    def __init__(
        self,
        message: str,
        *,
        recipe: str | None = None,
        path: str | None = None,
        component: str | None = None,
        plugin: str | None = None,
    ) -> None:
        self.recipe, self.path, self.component, self.plugin = recipe, path, component, plugin
        self.detail = message
        parts = []
        if recipe:
            parts.append(recipe)
        if path and not message.startswith(path):
            parts.append(f"at '{path}'")
        if component:
            parts.append(f"(component {component}" + (f" from plugin {plugin})" if plugin else ")"))
        where = " ".join(parts)
        super().__init__(f"{where}: {message}" if where else message)


class PluginError(PopuloraError):
    """A plugin failed to load or register (strict mode) or two plugins claim one name."""


def run_all(actions: Iterable[Callable[[], object]]) -> None:
    """Run every action even if one fails (closing or restoring several things); the first failure is raised
    after the last action has run."""
    errors = []
    for action in actions:
        try:
            action()
        except Exception as exc:
            errors.append(exc)
    if errors:
        raise errors[0]
