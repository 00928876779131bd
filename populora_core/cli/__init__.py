"""Floor 6, the ``populora`` command: its verbs (:mod:`.commands`, :mod:`.tools`), its group (:mod:`.group`), the
progress line, export, ``populora doctor`` and the printed plan, and :mod:`.driver`, the public entry for scripts
that drive runs. May import every floor below; nothing in the core imports it.

``main`` is the console script's entry (``populora = "populora_core.cli.commands:main"``; installs made before
the floors name ``populora_core.cli:main``, which still works)."""

from .commands import main

__all__ = ["main"]
