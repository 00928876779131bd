"""``python -m populora_core.cli``: the ``populora`` command."""

from .commands import main

main()
