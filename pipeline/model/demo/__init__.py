"""Test helpers: offline SenseVoiceSmall model directories (see :mod:`.build_model`).

Names are re-exported lazily (PEP 562) so that ``python -m
pipeline.model.demo.build_model`` does not import the module twice.
"""

from __future__ import annotations

import importlib

__all__ = ["VARIANTS", "build_model_dir", "ensure_model_dir", "is_demo_model"]


def __getattr__(name: str):
    if name in __all__:
        return getattr(importlib.import_module(".build_model", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
