"""What the ``populora`` command is made of, beside its verbs: its group (plugin commands added lazily, user errors
as a message and exit 2), the command that takes recipe overrides, and ``--plugin`` accepted anywhere on the line.
Imports nothing heavy."""

from __future__ import annotations

import sys
from typing import Any

import click

from ..api.errors import PluginError, UserError
from ..plugin.manager import get_manager


class PopuloraGroup(click.Group):
    """Adds plugin commands lazily and turns user errors into a message and exit code 2."""

    def _plugin_commands(self, ctx: click.Context) -> None:
        """Let plugins add commands once per plugin manager (tests may swap the manager in one process)."""
        try:
            manager = get_manager(plugin_files_from_argv())
        except (UserError, PluginError) as exc:
            fail(exc)
        if getattr(self, "_commands_from", None) is manager:
            return
        self._commands_from = manager
        manager.hook.register_commands.call_historic(kwargs={"cli": self})  # plugins added later: as they are added

    def list_commands(self, ctx: click.Context) -> list[str]:
        self._plugin_commands(ctx)
        return super().list_commands(ctx)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        cmd = super().get_command(ctx, cmd_name)
        if cmd is None:
            self._plugin_commands(ctx)
            cmd = super().get_command(ctx, cmd_name)
        return cmd

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (UserError, PluginError) as exc:
            fail(exc)


class RecipeCommand(click.Command):
    """A command that takes recipe overrides: ``--steps 2`` (an option it does not have, named like a recipe key) is
    answered with the override to write instead of click's "Did you mean '--help'?"."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        given_args = list(args)  # the parser consumes its list
        try:
            return super().parse_args(ctx, args)
        except click.NoSuchOption as exc:
            from ..api.schema import Recipe

            key = exc.option_name.lstrip("-").split("=", 1)[0].replace("-", "_")
            if key.split(".")[0] not in Recipe.model_fields:
                raise
            given = next((a for a in given_args if a.split("=", 1)[0] == exc.option_name), exc.option_name)
            if "=" in given:
                value = given.split("=", 1)[1]
            else:
                following = given_args[given_args.index(given) + 1 :] if given in given_args else []
                value = following[0] if following and not following[0].startswith("-") else "VALUE"
            first = (self.params[0].name or "recipe").upper()
            raise UserError(
                f"populora {ctx.info_name} has no option {exc.option_name}: recipe keys are overrides, "
                f"write `{key}={value}` (populora {ctx.info_name} {first} {key}={value})"
            ) from None


def fail(exc: Exception) -> None:
    click.echo(f"Error: {exc}", err=True)
    sys.exit(getattr(exc, "exit_code", 2))


def split_plugin_options(argv: list[str]) -> tuple[list[str], list[str]]:
    """(the ``--plugin`` files, the other arguments): ``--plugin FILE`` is global, read early so plugin commands
    and components can come from it, and accepted after the command too, as users of other CLIs expect."""
    files: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(argv):
        if argv[i] == "--plugin" and i + 1 < len(argv):
            files.append(argv[i + 1])
            i += 2
            continue
        if argv[i].startswith("--plugin="):
            files.append(argv[i].split("=", 1)[1])
        else:
            rest.append(argv[i])
        i += 1
    return files, rest


def plugin_files_from_argv() -> list[str]:
    return split_plugin_options(sys.argv[1:])[0]


def warning_line(message: Any, category: Any, filename: str, lineno: int, line: str | None = None) -> str:
    return f"Warning: {message}\n"


def plugin_options_first(argv: list[str]) -> list[str]:
    """``--plugin`` options moved before the command (``populora run R --plugin F`` fails no more)."""
    files, rest = split_plugin_options(argv)
    return [arg for file in files for arg in ("--plugin", file)] + rest
