"""Per-step tensor fingerprints and the final state hash.

A fingerprint is the wrapping int64 sum of a tensor's raw bits (float32 viewed as
int32, bfloat16 as int16, ...). Integer addition modulo 2**64 is associative, so the
sum is exact and independent of reduction order: equal tensors always give equal
fingerprints on any device, and a one-ULP change anywhere changes it. It is computed
on the tensor's device; the per-step rows stay there until the run ends, so there is
no host copy per step.

The final hash is a sha256 over the name, dtype, shape and raw bytes of every
parameter, buffer and optimizer-state tensor, in sorted name order.
"""

from __future__ import annotations

import hashlib
from typing import Iterable

import torch

# Tensor kinds, in the order they are reported.
KINDS = ("param", "grad", "buffer", "optim")

_INT_VIEW = {
    torch.float64: torch.int64,
    torch.float32: torch.int32,
    torch.float16: torch.int16,
    torch.bfloat16: torch.int16,
    torch.bool: torch.uint8,
}
if hasattr(torch, "float8_e4m3fn"):
    _INT_VIEW[torch.float8_e4m3fn] = torch.uint8
    _INT_VIEW[torch.float8_e5m2] = torch.uint8


def bit_checksum(t: torch.Tensor) -> torch.Tensor:
    """Order-independent exact checksum of a tensor's bits, as a 0-dim int64 on its device."""
    t = t.detach()
    if t.is_complex():
        t = torch.view_as_real(t)
    view = _INT_VIEW.get(t.dtype)
    if view is not None:
        t = t.contiguous().reshape(-1).view(view)
    return t.sum(dtype=torch.int64)


def optimizer_state_named(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """Optimizer state tensors named after their parameter: ``fc.weight.exp_avg``."""
    names = {id(p): n for n, p in model.named_parameters()}
    out: dict[str, torch.Tensor] = {}
    unnamed = 0
    for group in optimizer.param_groups:
        for p in group["params"]:
            state = optimizer.state.get(p)
            if not state:
                continue
            pname = names.get(id(p))
            if pname is None:
                pname = f"param{unnamed}"
                unnamed += 1
            for key, value in state.items():
                if isinstance(value, torch.Tensor):
                    out[f"{pname}.{key}"] = value
    return out


def state_tensors(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, *, with_grads: bool
) -> dict[str, torch.Tensor]:
    """Every tensor of the training state, keyed ``kind:name``."""
    out: dict[str, torch.Tensor] = {}
    for n, p in model.named_parameters():
        out[f"param:{n}"] = p
        if with_grads and p.grad is not None:
            out[f"grad:{n}"] = p.grad
    for n, b in model.named_buffers():
        out[f"buffer:{n}"] = b
    for n, t in optimizer_state_named(model, optimizer).items():
        out[f"optim:{n}"] = t
    return out


class StepFingerprints:
    """Collects one row of tensor checksums per step, kept on the device."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model = model
        self.optimizer = optimizer
        self.names: list[str] | None = None
        self._tensors: list[torch.Tensor] | None = None
        self.rows: list[torch.Tensor] = []

    def _bind(self) -> None:
        tensors = state_tensors(self.model, self.optimizer, with_grads=True)
        self.names = sorted(tensors, key=_sort_key)
        # Grads are re-created each step (zero_grad(set_to_none=True)): look them up
        # again per step; the other tensors are updated in place and kept.
        self._tensors = [tensors[n] for n in self.names]

    def record(self) -> None:
        if self.names is None:
            self._bind()
        assert self.names is not None
        params = dict(self.model.named_parameters())
        values: list[torch.Tensor] = []
        for name, t in zip(self.names, self._tensors or []):
            if name.startswith("grad:"):
                g = params[name[5:]].grad
                values.append(bit_checksum(g) if g is not None else _zero(t))
            else:
                values.append(bit_checksum(t))
        self.rows.append(torch.stack(values))

    def to_lists(self) -> list[list[int]]:
        if not self.rows:
            return []
        return torch.stack(self.rows).cpu().tolist()


def _zero(like: torch.Tensor) -> torch.Tensor:
    return torch.zeros((), dtype=torch.int64, device=like.device)


def _sort_key(name: str) -> int:
    """Group by kind; the stable sort keeps registration (forward) order within a kind."""
    kind = name.partition(":")[0]
    return KINDS.index(kind) if kind in KINDS else len(KINDS)


def batch_checksum(batch: object) -> torch.Tensor | None:
    """Checksum over every tensor in a (nested) batch: tells data order from compute."""
    tensors = list(_iter_tensors(batch))
    if not tensors:
        return None
    total = torch.zeros((), dtype=torch.int64, device=tensors[0].device)
    for i, t in enumerate(tensors):
        # Weight by position so swapping two inputs of a batch is seen.
        total = total + bit_checksum(t.to(total.device)) * (2 * i + 1)
    return total


def _iter_tensors(obj: object) -> Iterable[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for k in sorted(obj):
            yield from _iter_tensors(obj[k])
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _iter_tensors(v)


def tensor_bytes(t: torch.Tensor) -> bytes:
    t = t.detach().cpu().contiguous().reshape(-1)  # 0-dim tensors cannot be viewed as bytes
    return t.view(torch.uint8).numpy().tobytes() if t.numel() else b""


def final_hash(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[str, dict[str, str]]:
    """(sha256 of the whole state, sha256 per tensor) over params, buffers, optimizer state."""
    tensors = state_tensors(model, optimizer, with_grads=False)
    whole = hashlib.sha256()
    per: dict[str, str] = {}
    for name in sorted(tensors):
        t = tensors[name]
        header = f"{name}|{str(t.dtype).removeprefix('torch.')}|{tuple(t.shape)}\n".encode()
        data = tensor_bytes(t)
        whole.update(header)
        whole.update(data)
        per[name] = hashlib.sha256(header + data).hexdigest()
    return whole.hexdigest(), per


def dump_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, path: str) -> None:
    """Every state tensor (grads included) on the CPU, for magnitude comparisons."""
    tensors = state_tensors(model, optimizer, with_grads=True)
    torch.save({k: v.detach().cpu().clone() for k, v in tensors.items()}, path)
