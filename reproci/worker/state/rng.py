"""Every RNG state a training process holds in its own memory: python, numpy, torch, CUDA."""

from __future__ import annotations

import random
from typing import Any, TypedDict, Union

import numpy as np
import torch


class _HostStates(TypedDict):
    python: tuple[Any, ...]  # random.getstate()
    numpy: Any  # np.random.get_state(): a tuple, or a dict
    torch: torch.Tensor  # torch.get_rng_state()


class RngStates(_HostStates, total=False):
    """Every RNG state of the process (``states``): CUDA's only where CUDA is in use."""

    cuda: list[torch.Tensor]  # torch.cuda.get_rng_state_all()


def states() -> RngStates:
    out: RngStates = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = torch.cuda.get_rng_state_all()
    return out


def set_states(saved: RngStates, *, torch_rng: bool = True) -> None:
    random.setstate(saved["python"])
    np.random.set_state(saved["numpy"])
    if torch_rng:
        torch.set_rng_state(saved["torch"])
        if "cuda" in saved and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(saved["cuda"])


def to_cpu(saved: RngStates) -> RngStates:
    """RNG states loaded with ``map_location`` set back on the CPU, where torch wants them."""
    out = saved.copy()
    if isinstance(out["torch"], torch.Tensor):
        out["torch"] = out["torch"].cpu()
    if "cuda" in out:
        out["cuda"] = [s.cpu() for s in out["cuda"]]
    return out


# RNG objects a plugin's data pipeline may hold: their states can be read and put back.
RNG_TYPES = (torch.Generator, np.random.Generator, np.random.RandomState, random.Random)
Rng = Union[torch.Generator, np.random.Generator, np.random.RandomState, random.Random]


def is_rng(obj: object) -> bool:
    return isinstance(obj, RNG_TYPES)


def kind(obj: object) -> str:
    """An RNG object's type as users spell it: torch.Generator, numpy.random.Generator, ..."""
    for cls, name in ((torch.Generator, "torch.Generator"), (np.random.Generator, "numpy.random.Generator"),
                      (np.random.RandomState, "numpy.random.RandomState"), (random.Random, "random.Random")):
        if isinstance(obj, cls):
            return name
    return type(obj).__qualname__


def get_state(obj: Any) -> Any:
    """The state of one RNG object (a copy: later draws do not change it)."""
    if isinstance(obj, torch.Generator):
        return obj.get_state()
    if isinstance(obj, np.random.Generator):
        import copy

        return copy.deepcopy(obj.bit_generator.state)
    if isinstance(obj, np.random.RandomState):
        return obj.get_state()
    return obj.getstate()


def set_state(obj: Any, state: Any) -> None:
    if isinstance(obj, torch.Generator):
        obj.set_state(state.cpu() if isinstance(state, torch.Tensor) else state)
    elif isinstance(obj, np.random.Generator):
        obj.bit_generator.state = state
    elif isinstance(obj, np.random.RandomState):
        obj.set_state(state)
    else:
        obj.setstate(state)


def held(obj: object, prefix: str) -> dict[str, Rng]:
    """The RNG objects ``obj`` holds as attributes (or is), by path: ``sampler.rng``."""
    if isinstance(obj, RNG_TYPES):
        return {prefix: obj}
    try:
        attrs = vars(obj)
    except TypeError:
        return {}
    return {f"{prefix}.{k}": v for k, v in attrs.items() if is_rng(v)}
