"""A full training checkpoint: everything a fresh process needs to continue bit for bit."""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .contract import TrainSetup

CHECKPOINT_VERSION = 1


@dataclass
class LoopPosition:
    step: int = 0  # optimizer steps taken
    epoch: int = 0
    batch_in_epoch: int = 0  # batches of this epoch already consumed
    epoch_generator_state: torch.Tensor | None = None  # loader generator before this epoch's iter()


def rng_states() -> dict[str, Any]:
    states: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states: dict[str, Any], *, torch_rng: bool = True) -> None:
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    if torch_rng:
        torch.set_rng_state(states["torch"])
        if "cuda" in states and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(states["cuda"])


def save(path: str, setup: TrainSetup, pos: LoopPosition) -> None:
    state = {
        "version": CHECKPOINT_VERSION,
        "model": setup.model.state_dict(),
        "optimizer": setup.optimizer.state_dict(),
        "scheduler": setup.scheduler.state_dict() if setup.scheduler is not None else None,
        "scaler": setup.scaler.state_dict() if setup.scaler is not None else None,
        "extra": setup.get_extra_state() if setup.get_extra_state is not None else None,
        "position": {
            "step": pos.step,
            "epoch": pos.epoch,
            "batch_in_epoch": pos.batch_in_epoch,
            "epoch_generator_state": pos.epoch_generator_state,
        },
        "rng": rng_states(),
    }
    tmp = f"{path}.tmp"
    torch.save(state, tmp)
    os.replace(tmp, path)


def load(path: str, setup: TrainSetup, device: torch.device) -> tuple[LoopPosition, dict[str, Any]]:
    """Restore model, optimizer, scheduler, scaler and extra state; return position and RNG states."""
    state = torch.load(path, map_location=device, weights_only=False)
    if state.get("version") != CHECKPOINT_VERSION:
        raise ValueError(f"checkpoint {path} has version {state.get('version')}, expected {CHECKPOINT_VERSION}")
    setup.model.load_state_dict(state["model"])
    setup.optimizer.load_state_dict(state["optimizer"])
    if setup.scheduler is not None and state["scheduler"] is not None:
        setup.scheduler.load_state_dict(state["scheduler"])
    if setup.scaler is not None and state["scaler"] is not None:
        setup.scaler.load_state_dict(state["scaler"])
    if setup.set_extra_state is not None and state["extra"] is not None:
        setup.set_extra_state(state["extra"])
    p = state["position"]
    gen_state = p["epoch_generator_state"]
    if isinstance(gen_state, torch.Tensor):
        gen_state = gen_state.cpu()
    pos = LoopPosition(p["step"], p["epoch"], p["batch_in_epoch"], gen_state)
    rng = state["rng"]
    if isinstance(rng.get("torch"), torch.Tensor):
        rng["torch"] = rng["torch"].cpu()
    if "cuda" in rng:
        rng["cuda"] = [s.cpu() for s in rng["cuda"]]
    return pos, rng
