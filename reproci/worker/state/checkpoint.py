"""A full training checkpoint: everything a fresh process needs to continue bit for bit.

Model, optimizer, scheduler, scaler, the state modules (an EMA, a teacher), the plugin's
extra state, a loader's own state (``StatefulDataLoader.state_dict()``) and every RNG state at
the checkpoint's step, plus the loop position: step, epoch, batches consumed in the epoch and
the epoch-start snapshot (``loader.EpochStart``) that lets the resumed run replay the
interrupted epoch exactly (``reproci/worker/data/loader.py``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

from ..contract import TrainSetup
from ..data.loader import EpochStart, extra_state, own_state
from . import rng
from .census import is_metric
from .state import object_sha256

CHECKPOINT_VERSION = 2


@dataclass
class LoopPosition:
    step: int = 0  # optimizer steps taken
    epoch: int = 0
    batch_in_epoch: int = 0  # batches of this epoch already consumed
    epoch_start: EpochStart | None = None  # taken just before this epoch's iter()
    replayed: str | None = None  # how a resumed run reached its batch: "index", "fetch" or "loader" (not saved)


@dataclass
class Resume:
    """What a resumed run puts back once its loader has replayed to the checkpoint's batch."""

    rng: rng.RngStates
    extra: Any = None
    loader: Any = None  # an own_state loader's state_dict() at the checkpoint


def save(path: str, setup: TrainSetup, pos: LoopPosition) -> None:
    state = {
        "version": CHECKPOINT_VERSION,
        "model": setup.model.state_dict(),
        "optimizer": setup.optimizer.state_dict(),
        "scheduler": setup.scheduler.state_dict() if setup.scheduler is not None else None,
        "scaler": setup.scaler.state_dict() if setup.scaler is not None else None,
        "extra": extra_state(setup),
        "state_modules": {name: m.state_dict() for name, m in setup.state_modules.items()},
        "position": {
            "step": pos.step,
            "epoch": pos.epoch,
            "batch_in_epoch": pos.batch_in_epoch,
            "epoch_start": pos.epoch_start.to_dict() if pos.epoch_start is not None else None,
        },
        "rng": rng.states(),
        "loader": _own_state(setup.loader),
    }
    tmp = f"{path}.tmp"
    torch.save(state, tmp)
    os.replace(tmp, path)


def load(path: str, setup: TrainSetup, device: torch.device) -> tuple[LoopPosition, Resume]:
    """Restore model, optimizer, scheduler and scaler; return the position and what to put
    back after the loader has replayed to it (RNG states, extra state)."""
    # Loaded on the CPU: load_state_dict copies onto the model's devices (and the optimizer
    # puts each state tensor where its parameter is), while generator states must stay CPU tensors.
    state = torch.load(path, map_location="cpu", weights_only=False)
    if state.get("version") != CHECKPOINT_VERSION:
        raise ValueError(f"checkpoint {path} has version {state.get('version')}, expected {CHECKPOINT_VERSION}")
    roots = (setup.model, *setup.state_modules.values())
    placed = _attribute_devices(roots)
    setup.model.load_state_dict(state["model"])
    setup.optimizer.load_state_dict(state["optimizer"])
    saved_modules = state.get("state_modules") or {}
    for name, module in setup.state_modules.items():
        if name in saved_modules:
            module.load_state_dict(saved_modules[name])
    _put_back(placed)
    if setup.scheduler is not None and state["scheduler"] is not None:
        setup.scheduler.load_state_dict(state["scheduler"])
    if setup.scaler is not None and state["scaler"] is not None:
        setup.scaler.load_state_dict(state["scaler"])
    p = state["position"]
    start = EpochStart.from_dict(p["epoch_start"]) if p.get("epoch_start") is not None else None
    pos = LoopPosition(p["step"], p["epoch"], p["batch_in_epoch"], start)
    return pos, Resume(rng=rng.to_cpu(state["rng"]), extra=state["extra"], loader=state.get("loader"))


def _own_state(loader: Any) -> Any:
    """An ``own_state`` loader's ``state_dict()``; None for any other."""
    return loader.state_dict() if own_state(loader) else None


WHOLE_METRIC = ""  # the name under which a torchmetrics Metric's own device is kept


def _attribute_devices(roots: tuple[torch.nn.Module, ...]) -> dict[tuple[torch.nn.Module, str], torch.device]:
    """Where each tensor a module keeps as a plain attribute (or a list of them) lives now, and
    where each torchmetrics ``Metric`` is (``m.device``): a list state empty now holds no tensor
    to tell, yet a persistent one is given the checkpoint's CPU tensors."""
    placed = {}
    for root in roots:
        for module in root.modules():
            if is_metric(module):
                placed[(module, WHOLE_METRIC)] = module.device
            for name, value in vars(module).items():
                first = value[0] if isinstance(value, list) and value else value
                if isinstance(first, torch.Tensor) and not isinstance(first, torch.nn.Parameter) \
                        and not name.startswith("_"):
                    placed[(module, name)] = first.device
    return placed


def _put_back(placed: dict[tuple[torch.nn.Module, str], torch.device]) -> None:
    """A module whose ``_load_from_state_dict`` assigns the loaded tensors as they come (a
    torchmetrics ``Metric`` with persistent states does) is given the checkpoint's CPU tensors
    on a device run: each goes back to the device it was on before the load, as a buffer's
    copy would (else the next update mixes devices: "Encountered different devices")."""
    for (module, name), device in placed.items():
        if name == WHOLE_METRIC:
            module.to(device)  # every state, list states included, and the metric's own record of its device
            continue
        value = getattr(module, name, None)
        if isinstance(value, torch.Tensor) and value.device != device:
            setattr(module, name, value.to(device))
        elif isinstance(value, list) and any(isinstance(v, torch.Tensor) and v.device != device for v in value):
            setattr(module, name, [v.to(device) if isinstance(v, torch.Tensor) else v for v in value])


def extra_sha256(setup: TrainSetup) -> str | None:
    """The hash of what the plugin's ``get_extra_state`` returns now (None without one)."""
    return object_sha256(setup.get_extra_state()) if setup.get_extra_state is not None else None
