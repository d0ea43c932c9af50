"""The training state as named tensors, and the final hash and dump taken of it.

The state is every parameter, buffer and optimizer-state tensor (gradients too, where a
caller asks), and every tensor of the modules that are training state besides the model
(``TrainSetup.state_modules``: an EMA, a teacher), keyed ``kind:name``. The final hash is a
sha256 over the name, dtype, shape and raw bytes of every one of them (sparse tensors in
their dense form), in sorted name order: the authoritative identity of a run's result.
State that is not a tensor (``TrainSetup.get_extra_state``) has its own hash,
``object_sha256``.
"""

from __future__ import annotations

import hashlib
from typing import Any, Mapping

import torch

from .tensor_bits import dense

# Tensor kinds, in the order they are reported; "state": a tensor of a state module.
KINDS = ("param", "grad", "buffer", "optim", "state")
Modules = Mapping[str, torch.nn.Module]


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
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, *, with_grads: bool, modules: Modules | None = None
) -> dict[str, torch.Tensor]:
    """Every tensor of the training state, keyed ``kind:name``; a state module's tensors
    (its parameters and buffers, as its ``state_dict`` has them) as ``state:MODULE.NAME``."""
    out: dict[str, torch.Tensor] = {}
    for n, p in model.named_parameters():
        out[f"param:{n}"] = p
        if with_grads and p.grad is not None:
            out[f"grad:{n}"] = p.grad
    for n, b in model.named_buffers():
        out[f"buffer:{n}"] = b
    for n, t in optimizer_state_named(model, optimizer).items():
        out[f"optim:{n}"] = t
    for mname, module in (modules or {}).items():
        for n, t in module.state_dict(keep_vars=True).items():
            if isinstance(t, torch.Tensor):
                out[f"state:{mname}.{n}"] = t
    return out


def transient_buffers(model: torch.nn.Module) -> list[str]:
    """The ``buffer:NAME`` of every non-persistent buffer: no checkpoint holds one (a rotary
    embedding's ``inv_freq``), so a resumed run has it as its constructor made it until a
    forward rewrites it."""
    out = []
    for mname, module in model.named_modules():
        for name in getattr(module, "_non_persistent_buffers_set", ()):
            if module._buffers.get(name) is not None:
                out.append(f"buffer:{mname}.{name}" if mname else f"buffer:{name}")
    return sorted(out)


def state_identity(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                   modules: Modules | None = None) -> list[int]:
    """Which tensor objects hold the state and where their data is (id and data pointer of
    every tensor ``state_tensors`` returns without gradients, in a fixed walk order), with
    no names made: one walk of the module tree reading each module's own parameter and
    buffer slots, several times cheaper per step than naming them. Equal lists: the same
    tensors in the same places. A state module's tensors are taken as its ``state_dict``
    has them (a module may add tensors there that are not in its slots)."""
    out: list[int] = []

    def add(t: torch.Tensor | None) -> None:
        if isinstance(t, torch.Tensor):
            out.append(id(t))
            out.append(t.data_ptr() if t.layout == torch.strided else 0)

    seen: set[int] = set()
    stack: list[torch.nn.Module] = [model]
    while stack:
        m = stack.pop()
        if id(m) in seen:
            continue
        seen.add(id(m))
        for t in m._parameters.values():
            add(t)
        for t in m._buffers.values():
            add(t)
        stack.extend(c for c in reversed(m._modules.values()) if c is not None)
    for group in optimizer.param_groups:
        for p in group["params"]:
            for value in (optimizer.state.get(p) or {}).values():
                add(value)
    for module in (modules or {}).values():
        out.append(-1)
        for t in module.state_dict(keep_vars=True).values():
            add(t)
    return out


def sort_key(name: str) -> int:
    """Group by kind; the stable sort keeps registration (forward) order within a kind."""
    kind = name.partition(":")[0]
    return KINDS.index(kind) if kind in KINDS else len(KINDS)


def tensor_bytes(t: torch.Tensor) -> bytes:
    t = dense(t.detach()).cpu().contiguous().reshape(-1)  # 0-dim tensors cannot be viewed as bytes
    return t.view(torch.uint8).numpy().tobytes() if t.numel() else b""


def final_hash(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
               modules: Modules | None = None) -> tuple[str, dict[str, str]]:
    """(sha256 of the whole state, sha256 per tensor) over params, buffers, optimizer state
    and the state modules' tensors."""
    tensors = state_tensors(model, optimizer, with_grads=False, modules=modules)
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


def dump_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, path: str,
               modules: Modules | None = None) -> None:
    """Every state tensor (grads included) on the CPU, for magnitude comparisons."""
    tensors = state_tensors(model, optimizer, with_grads=True, modules=modules)
    torch.save({k: dense(v.detach()).cpu().clone() for k, v in tensors.items()}, path)


def object_sha256(obj: Any) -> str:
    """A sha256 of a nested value (``get_extra_state``'s dict): tensors by dtype, shape and
    bytes, numpy arrays likewise, mappings in sorted key order, sequences in order, other
    values by ``repr``."""
    h = hashlib.sha256()

    def feed(o: Any) -> None:
        if isinstance(o, torch.Tensor):
            h.update(f"T{str(o.dtype)}{tuple(o.shape)}|".encode())
            h.update(tensor_bytes(o))
        elif type(o).__module__ == "numpy" and hasattr(o, "tobytes"):
            h.update(f"N{o.dtype}{getattr(o, 'shape', ())}|".encode())
            h.update(o.tobytes())
        elif isinstance(o, Mapping):
            h.update(b"{")
            for k in sorted(o, key=lambda k: (type(k).__name__, str(k))):
                h.update(repr(k).encode() + b":")
                feed(o[k])
            h.update(b"}")
        elif isinstance(o, (list, tuple)):
            h.update(b"[")
            for v in o:
                feed(v)
            h.update(b"]")
        else:
            text = repr(o)
            if " at 0x" in text:  # an object's default repr carries its address: the type alone is stable
                text = type(o).__qualname__
            h.update(text.encode() + b";")

    feed(obj)
    return h.hexdigest()
