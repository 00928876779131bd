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
        description="Process per program from warm zygotes: namespaces, unprivileged uid, rlimits",
    )


@hookimpl
def register_commands(cli: Any) -> None:
    from .cli import add_commands

    add_commands(cli)
