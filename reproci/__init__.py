"""reproci: containerised reproducibility CI for PyTorch, and the public API a plugin imports.

    from reproci import ModelContext, TrainSetup               # the plugin contract
    from reproci import EveryEpoch                             # a scheduler stepped once per epoch
    from reproci import hf_setup, lightning_setup              # a library's model as it trains

These names are the stable surface (docs/plugins.md); the modules under them
(``reproci.worker.contract``, ``reproci.adapters.hf``) are internal. The source folder is
``reproci/`` (the repository's layout); the installed package is ``reproci``.

This file imports nothing heavy on purpose: the CLI imports it before torch (which it
imports in a background thread), and ``reproci.worker`` runs inside arbitrary training
images that have only python3, torch and numpy. The public names are imported when first
named (PEP 562): the contract with torch, an adapter with its library.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .adapters.hf import hf_setup
    from .adapters.lightning import lightning_setup
    from .worker.contract import ModelContext, TrainSetup
    from .worker.steppers import EveryEpoch

__version__ = "0.1.0"
__all__ = ["EveryEpoch", "ModelContext", "TrainSetup", "__version__", "hf_setup", "lightning_setup"]

_LAZY = {"ModelContext": "reproci.worker.contract", "TrainSetup": "reproci.worker.contract",
         "EveryEpoch": "reproci.worker.steppers",
         "hf_setup": "reproci.adapters.hf", "lightning_setup": "reproci.adapters.lightning"}


def __getattr__(name: str) -> Any:
    """A public name, imported on first use (an adapter's missing library raises as its import does)."""
    if name not in _LAZY:
        raise AttributeError(f"module 'reproci' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
