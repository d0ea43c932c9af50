"""Held-out metrics shared by the reference models' ``eval_fn``: accuracy and mean loss
over (logits, targets) batches of a held-out set drawn from the model's own synthetic
generator with another seed offset, so it has the same structure and no training sample."""

from __future__ import annotations

from typing import Iterable

import torch
import torch.nn.functional as F

OFFSET = 10_007  # held-out seed = training data seed + OFFSET


def metrics(batches: Iterable[tuple[torch.Tensor, torch.Tensor]], *, binary: bool = False) -> dict[str, float]:
    """``accuracy`` (higher is better) and ``eval_loss`` (lower is better, per target):
    cross-entropy over the last dimension, or with ``binary`` one logit per target."""
    n, correct, loss = 0, 0, 0.0
    for logits, y in batches:
        if binary:
            loss += F.binary_cross_entropy_with_logits(logits, y, reduction="sum").item()
            correct += int(((logits > 0).to(y.dtype) == y).sum().item())
        else:
            loss += F.cross_entropy(logits, y, reduction="sum").item()
            correct += int((logits.argmax(dim=-1) == y).sum().item())
        n += y.numel()
    return {"accuracy": correct / n, "eval_loss": loss / n}


def device_of(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device
