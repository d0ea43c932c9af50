"""The training state as named tensors, and the final hash and dump taken of it.

The state is every parameter, buffer and optimizer-state tensor (gradients too, where a
caller asks), keyed ``kind:name``. The final hash is a sha256 over the name, dtype,
shape and raw bytes of every parameter, buffer and optimizer-state tensor, in sorted
name order: the authoritative identity of a run's result.
"""

from __future__ import annotations

import hashlib

import torch

# Tensor kinds, in the order they are reported.
KINDS = ("param", "grad", "buffer", "optim")


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


def sort_key(name: str) -> int:
    """Group by kind; the stable sort keeps registration (forward) order within a kind."""
    kind = name.partition(":")[0]
    return KINDS.index(kind) if kind in KINDS else len(KINDS)


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
