"""A run whose loss or trained state is not finite: an ERROR, never compared or recorded.

Checked once, after the last step (no sync per step): the first step whose loss is not
finite, and the trained tensors (parameters, optimizer state, state modules) that hold NaN
or infinity at the end.
"""

from __future__ import annotations

import torch

from .state.bits import dense
from .contract import TrainSetup
from .state.state import sort_key, state_tensors


class NonFiniteError(Exception):
    """The loss or the trained state is not finite: nothing of such a run is compared or recorded."""


def check_finite(setup: TrainSetup, losses: list[torch.Tensor], start_step: int) -> None:
    """Raise ``NonFiniteError`` naming the first step whose loss is not finite and the state
    tensors that hold non-finite values at the end (one check, after the last step: no sync per step)."""
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
    raise NonFiniteError("; ".join(said) + ": the training diverged (a learning rate too high, a log of 0, a division "
                         "by zero?); a run that is not finite is never compared with or recorded as a golden")
