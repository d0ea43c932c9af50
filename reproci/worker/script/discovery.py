"""Finding a script's training state without its help: every optimizer alive, and the module
tree whose names name their parameters (``hooks.ScriptTrace`` asks once, before the first
training forward or the first step)."""

from __future__ import annotations

from typing import Any

import torch

from ..steppers import Optimizers


def find_optimizers(objects: list[Any]) -> list[torch.optim.Optimizer]:
    """Every optimizer alive, once each: a wrapper that shares its optimizer's state (accelerate's
    ``AcceleratedOptimizer``) stands for it, and torch's own class is taken over a wrapper."""
    by_state: dict[int, torch.optim.Optimizer] = {}
    for o in objects:
        if not isinstance(o, torch.optim.Optimizer) or isinstance(o, Optimizers):
            continue
        try:
            key, groups = id(o.state), o.param_groups
        except Exception:  # noqa: BLE001 - a half-made wrapper
            continue
        if not any(g.get("params") for g in groups):
            continue
        held = by_state.get(key)
        if held is None or (type(o).__module__.startswith("torch.optim")
                            and not type(held).__module__.startswith("torch.optim")):
            by_state[key] = o
    return list(by_state.values())


def find_model(objects: list[Any], optimizers: list[torch.optim.Optimizer],
           called: torch.nn.Module | None) -> torch.nn.Module:
    """The smallest module tree alive that holds every parameter the optimizers update (the one
    being called on a tie); where none holds them all, a module gathering the trees that hold
    some, and the parameters no module holds."""
    wanted = {id(p) for o in optimizers for g in o.param_groups for p in g["params"]}
    modules = [o for o in objects if isinstance(o, torch.nn.Module)]
    children = {id(c) for m in modules for c in m._modules.values() if c is not None}
    roots = [m for m in modules if id(m) not in children]
    best: tuple[int, int, torch.nn.Module] | None = None
    partial: list[torch.nn.Module] = []
    for r in roots:
        held = {id(p) for p in r.parameters()}
        if wanted <= held:
            key = (len(held), 0 if r is called else 1)
            if best is None or key < best[:2]:
                best = (*key, r)
        elif wanted & held:
            partial.append(r)
    if best is not None:
        return best[2]
    holder = torch.nn.Module()
    seen: set[int] = set()
    for i, r in enumerate(partial):
        holder.add_module(f"{type(r).__name__}{i}", r)
        seen |= {id(p) for p in r.parameters()}
    loose = [p for o in optimizers for g in o.param_groups for p in g["params"] if id(p) not in seen]
    for i, p in enumerate(dict.fromkeys(loose)):
        holder.register_parameter(f"param{i}", p if isinstance(p, torch.nn.Parameter) else torch.nn.Parameter(p))
    return holder
