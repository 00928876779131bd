"""``hookimpl``, the marker of a plugin's hook implementations (the specifications are
:mod:`populora_core.plugin.hookspecs`)."""

from __future__ import annotations

import pluggy

hookimpl = pluggy.HookimplMarker("populora")
