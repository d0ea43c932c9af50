"""Where float16 overflowed first, for a run under ``--amp fp16`` whose loss is not finite.

Asked only once such a run has failed (``finite.check_finite``), so nothing here costs a
healthy run anything: one forward of the last batch under fp16 autocast, then one in
float32, both eager and without gradients, with a hook on every module. The first module
output that is not finite under fp16 but is in float32 is the tensor that passed float16's
range (65504). The state that forward leaves behind (running statistics, RNG) is never
recorded: the run is an error either way.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, ContextManager

import torch

from .contract import TrainSetup, loss_of
from .data.batches import Accumulated

FP16_MAX = 65504.0


@dataclass(frozen=True)
class Overflow:
    """The first tensor that is not finite under fp16 though it is in float32."""

    tensor: str  # "the output of `1` (Scale)", "the loss"
    value: float  # what fp16 gave: inf, -inf or nan
    fp32_max: float  # its largest magnitude in float32

    def sentence(self) -> str:
        inside = "" if self.fp32_max > FP16_MAX else " (a value computed inside it passed that range)"
        return (f"under --amp fp16 {self.tensor} is the first tensor that is not finite ({self.value} in float16, "
                f"at most {self.fp32_max:.3g} in float32{inside})")


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value] if value.is_floating_point() else []
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def _first_bad(ts: list[torch.Tensor]) -> float | None:
    """What the first tensor holding a non-finite value holds (inf, -inf or nan); None if all are finite."""
    for t in ts:
        bad = t.detach()[~torch.isfinite(t.detach())]
        if bad.numel():
            return float(bad.reshape(-1)[0])
    return None


def _largest(ts: list[torch.Tensor]) -> float:
    return max((float(t.detach().abs().max()) for t in ts if t.numel()), default=0.0)


def _forward(setup: TrainSetup, batch: Any, context: Callable[[], ContextManager[Any]]) -> list[tuple[str, list[torch.Tensor]]]:
    """Every module output of one forward and its loss, in the order they were computed."""
    seen: list[tuple[str, list[torch.Tensor]]] = []
    calls: dict[str, int] = {}
    handles = []
    for name, module in setup.model.named_modules():
        label = f"the output of `{name}` ({type(module).__name__})" if name else \
            f"the model's output ({type(module).__name__})"

        def hook(_m: Any, _args: Any, out: Any, label: str = label) -> None:
            calls[label] = calls.get(label, 0) + 1
            seen.append((label if calls[label] == 1 else f"{label}, call {calls[label]}", _tensors(out)))
        handles.append(module.register_forward_hook(hook))
    try:
        with torch.no_grad(), context():
            seen.append(("the loss", _tensors(loss_of(setup.loss_fn(setup.model, batch)))))
    finally:
        for h in handles:
            h.remove()
    return seen


def _ranks() -> int:
    dist = torch.distributed
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def first_overflow(setup: TrainSetup, batch: Any, device: torch.device) -> Overflow | None:
    """The first tensor of a forward of ``batch`` that fp16 autocast makes non-finite and float32
    does not; None when no such tensor is found (the model is not finite in float32 either,
    or the forward cannot be repeated outside the step), and above one rank."""
    if batch is None or _ranks() > 1:  # one rank's forward alone could wait for ever in a collective (SyncBatchNorm)
        return None
    part = batch[0] if isinstance(batch, Accumulated) else batch
    try:
        half = _forward(setup, part, lambda: torch.autocast(device_type=device.type, dtype=torch.float16))
        full = dict(_forward(setup, part, contextlib.nullcontext))
    except Exception:  # noqa: BLE001 - a loss_fn that only runs inside a step: the plain message stands
        return None
    for label, ts in half:
        value = _first_bad(ts)
        if value is None:
            continue
        fp32 = full.get(label)
        if fp32 is None or _first_bad(fp32) is not None:
            return None  # not finite in float32 either: not an overflow of float16
        return Overflow(tensor=label, value=value, fp32_max=_largest(fp32))
    return None
