"""``populora sandbox PROGRAM.py``: run one file in the sandbox and print the result as JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from populora_core.api.errors import UserError


def filter_status(isolation: dict[str, Any]) -> str:
    """``active`` or ``off: <why>``: what ``populora sandbox`` and ``populora doctor`` show about the seccomp filter."""
    if isolation.get("syscall_filter"):
        return "active"
    return f"off: {isolation.get('syscall_filter_reason') or 'unknown'}"


def add_commands(cli: Any) -> None:
    @cli.command("sandbox")
    @click.argument("program", type=click.Path(dir_okay=False, path_type=Path))
    @click.option("--timeout", "timeout", type=float, default=None, help="Wall-clock limit in seconds.")
    @click.option("--memory-mb", "memory_mb", type=int, default=None, help="Address-space limit in MiB.")
    @click.option("--expr", default=None, help="Expression evaluated after the program; its repr is shown.")
    @click.option(
        "--no-syscall-filter",
        "no_filter",
        is_flag=True,
        help="Run without the seccomp filter on purpose (a kernel without seccomp).",
    )
    def sandbox(program: Path, timeout: float | None, memory_mb: int | None, expr: str | None, no_filter: bool) -> None:
        """Run PROGRAM.py in the sandbox with the default limits (or those given); print one JSON object.

        Exit code 0 whenever the sandbox itself worked, whatever the program did; 2 when the system-call filter
        cannot be installed (the reason is shown) and --no-syscall-filter was not given. ``syscall_filter`` in the
        output says whether the filter was active.

        \b
          populora sandbox program.py
          populora sandbox program.py --timeout 2 --memory-mb 256 --expr "f(3)"
        """
        from pydantic import ValidationError

        from populora_core.api.components import ExecJob

        from .executor import SandboxExecutor
        from .params import SandboxParams

        try:
            code = program.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise UserError(f"cannot read program {program}: {exc}") from None
        overrides: dict[str, Any] = {"workers": 1, "syscall_filter": not no_filter}
        if timeout is not None:
            overrides["timeout_s"] = timeout
        if memory_mb is not None:
            overrides["memory_mb"] = memory_mb
        try:
            params = SandboxParams(**overrides)
        except ValidationError as exc:
            from populora_core.api import format_validation_error

            raise UserError(f"bad sandbox option: {format_validation_error(exc, model=SandboxParams)}") from None
        with SandboxExecutor(params) as executor:
            result = executor.run_batch([ExecJob(code, expr)])[0]
        out = {
            "status": result.status,
            "stdout": result.stdout,
            "error": result.error,
            "wall_s": round(result.wall_s, 4),
            "syscall_filter": filter_status(executor.isolation),
        }
        if expr is not None:
            out["value"] = result.value
        click.echo(json.dumps(out))
