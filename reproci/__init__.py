"""reproci's public API: what a model plugin imports.

    from reproci import ModelContext, TrainSetup               # the plugin contract
    from reproci import EveryEpoch                             # a scheduler stepped once per epoch
    from reproci import hf_setup, lightning_setup              # a library's model as it trains

This is the stable surface (docs/plugins.md); the code lives in ``pipeline/``, whose module paths
(``pipeline.worker.contract``, ``pipeline.adapters.hf``) are internal and deprecated as imports
for plugins. It runs in the worker, inside any image: it imports only the standard library,
torch, numpy and the worker side of ``pipeline``. The adapters import their library, so they
are imported when first named (``from reproci import hf_setup``), never by ``import reproci``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from pipeline import __version__
from pipeline.worker.contract import ModelContext, TrainSetup
from pipeline.worker.steppers import EveryEpoch

if TYPE_CHECKING:
    from pipeline.adapters.hf import hf_setup
    from pipeline.adapters.lightning import lightning_setup

__all__ = ["EveryEpoch", "ModelContext", "TrainSetup", "__version__", "hf_setup", "lightning_setup"]

_ADAPTERS = {"hf_setup": "pipeline.adapters.hf", "lightning_setup": "pipeline.adapters.lightning"}


def __getattr__(name: str) -> Any:
    """An adapter, imported with its library on first use (a missing library raises as its import does)."""
    if name not in _ADAPTERS:
        raise AttributeError(f"module 'reproci' has no attribute {name!r}")
    value = getattr(importlib.import_module(_ADAPTERS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
