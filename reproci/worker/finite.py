"""A run whose loss or trained state is not finite: an ERROR, never compared or recorded.

Checked once, after the last step (no sync per step): the first step whose loss is not
finite, and the trained tensors (parameters, optimizer state, state modules) that hold NaN
or infinity at the end. Under ``--amp fp16`` the cause is most often float16's range
(65504): the message then names the first tensor that overflowed (``overflow``) and what to
use instead, not a divergence.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from .contract import TrainSetup
from .overflow import Overflow
from .state.state import sort_key, state_tensors
from .state.tensor_bits import dense

GOLDEN = "a run that is not finite is never compared with or recorded as a golden"


class NonFiniteError(Exception):
    """The loss or the trained state is not finite: nothing of such a run is compared or recorded."""


def check_finite(setup: TrainSetup, losses: list[torch.Tensor], start_step: int, amp: str | None = None,
                 overflow: Callable[[], Overflow | None] = lambda: None) -> None:
    """Raise ``NonFiniteError`` naming the first step whose loss is not finite and the state
    tensors that hold non-finite values at the end (one check, after the last step: no sync per step).
    Under fp16, ``overflow`` is asked for the first tensor that passed float16's range."""
    bad_loss = None
    if losses:
        finite = torch.isfinite(torch.stack(losses)).cpu()
        if not bool(finite.all()):
            i = int((~finite).nonzero()[0])
            bad_loss = (start_step + i + 1, float(losses[i]))
    tensors = state_tensors(setup.model, setup.optimizer, with_grads=False, modules=setup.state_modules)
    # Parameters, optimizer state and state modules: what training updates. Buffers are left
    # out: a causal mask of -inf is a buffer a model may hold on purpose.
    bad = [n for n in sorted(tensors, key=sort_key) if not n.startswith("buffer:")
           and tensors[n].is_floating_point() and not bool(torch.isfinite(dense(tensors[n])).all())]
    if bad_loss is None and not bad:
        return
    said = [f"the loss is {bad_loss[1]} from step {bad_loss[0]}"] if bad_loss else []
    if bad:
        said.append(f"at the end {len(bad)} state tensor{'s' if len(bad) > 1 else ''} hold non-finite values, first {bad[0]}")
    why = _fp16(setup, overflow()) if amp == "fp16" else (
        "the training diverged (a learning rate too high, a log of 0, a division by zero?)")
    raise NonFiniteError("; ".join(said) + f": {why}; {GOLDEN}")


def _fp16(setup: TrainSetup, found: Overflow | None) -> str:
    """Why a run under fp16 autocast is not finite, and what to use instead."""
    if found is not None:
        return (f"{found.sentence()}: it overflowed float16's range (max 65504); use --amp bf16 (float32's range in "
                "16 bits), or keep that module in float32 (a GradScaler scales the gradients, not the activations)")
    scaler: Any = setup.scaler
    off = scaler is not None and hasattr(scaler, "is_enabled") and not scaler.is_enabled()
    return ("under --amp fp16 this is most often a value that overflowed float16's range (max 65504); if the model "
            "is finite without --amp, use --amp bf16" + (", or enable the plugin's GradScaler (it is disabled)" if off else ""))
