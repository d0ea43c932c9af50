"""The held-out evaluation a plugin may offer (``TrainSetup.eval_fn``), run once after the
last step of a run whose spec asks for it (the variance stage's runs)."""

from __future__ import annotations

import math

import torch

from .contract import ContractError, TrainSetup


def evaluate(setup: TrainSetup, ref: str) -> dict[str, float] | None:
    """``eval_fn(model)`` under ``torch.no_grad()`` in eval mode, train mode put back after;
    its metrics as floats (None when the plugin has no eval_fn)."""
    if setup.eval_fn is None:
        return None
    model = setup.model
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            metrics = setup.eval_fn(model)
    finally:
        model.train(was_training)
    if not isinstance(metrics, dict) or not all(isinstance(k, str) for k in metrics):
        raise ContractError(f"{ref}: eval_fn returned {type(metrics).__name__}, not a dict of metric name -> number")
    out: dict[str, float] = {}
    for name, value in metrics.items():
        try:
            out[name] = float(value)
        except (TypeError, ValueError):
            raise ContractError(f"{ref}: eval_fn's metric {name!r} is {value!r}, not a number") from None
    return {k: (v if math.isfinite(v) else repr(v)) for k, v in out.items()}  # type: ignore[misc]
