"""Sandbox executor plugin: each untrusted program in its own isolated process from a warm zygote.

Registers the ``sandbox`` executor and the ``populora sandbox PROGRAM.py`` command. Design, fallback
and limits: README.md next to this file.
"""

from __future__ import annotations

from typing import Any

from populora_core.api import hookimpl

from .params import SandboxParams

__all__ = ["SandboxParams", "make_executor"]


def make_executor(params: SandboxParams) -> Any:
    """Factory of the ``sandbox`` executor: a started pool of zygotes (close() it when done)."""
    from .executor import SandboxExecutor

    return SandboxExecutor(params)


@hookimpl
def register_executors(register: Any) -> None:
    register(
        "sandbox",
        make_executor,
        params=SandboxParams,
        description="Process per program from warm zygotes: namespaces, unprivileged uid, rlimits, seccomp",
        doctor=doctor_check,
    )


def doctor_check() -> tuple[str, str, str | None]:
    """``populora doctor``'s sandbox row: one zygote started as a run would start it, and what it got."""
    from .cli import filter_status
    from .executor import SandboxExecutor, SyscallFilterUnavailable

    try:
        with SandboxExecutor(SandboxParams(workers=1)) as executor:
            isolation = executor.isolation
    except SyscallFilterUnavailable as exc:
        return "sandbox", "system-call filter: off", f"{exc} (runs with the sandbox refuse to start)"
    spaces = [kind for kind in ("net", "pid", "mount") if isolation.get(f"{kind}_namespace")]
    binding = isolation.get("syscall_filter_binding")
    where = f"namespaces {', '.join(spaces)}" if spaces else f"no namespaces ({isolation.get('fallback_reason')})"
    return "sandbox", f"system-call filter: {filter_status(isolation)} ({binding}); {where}", None


@hookimpl
def register_commands(cli: Any) -> None:
    from .cli import add_commands

    add_commands(cli)
