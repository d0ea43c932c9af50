"""Every RNG state a training process holds in its own memory: python, numpy, torch, CUDA."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def states() -> dict[str, Any]:
    out: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = torch.cuda.get_rng_state_all()
    return out


def set_states(saved: dict[str, Any], *, torch_rng: bool = True) -> None:
    random.setstate(saved["python"])
    np.random.set_state(saved["numpy"])
    if torch_rng:
        torch.set_rng_state(saved["torch"])
        if "cuda" in saved and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(saved["cuda"])


def to_cpu(saved: dict[str, Any]) -> dict[str, Any]:
    """RNG states loaded with ``map_location`` set back on the CPU, where torch wants them."""
    out = dict(saved)
    if isinstance(out.get("torch"), torch.Tensor):
        out["torch"] = out["torch"].cpu()
    if "cuda" in out:
        out["cuda"] = [s.cpu() for s in out["cuda"]]
    return out
