"""Whether the training state still lives in the tensors it was bound to, asked every step.

``state_identity`` answers it by walking the module tree: exact, and after a training step
most of its cost is reading modules that are no longer in any cache. ``StateWatch`` answers
the same question from what it saw last time: the slot dictionaries of every module (each
module's ``_parameters``, ``_buffers`` and ``_modules``, mutated in place by every assignment
to a module), the optimizer's groups and state, and the data pointer of every tensor among
them. When all of them still hold the very same objects, no tensor moved; otherwise it
walks the tree again, exactly as ``state_identity`` does, and compares.
"""

from __future__ import annotations

import operator
from typing import Any, NamedTuple

import torch

from .state import Modules, state_identity


class _Holder(NamedTuple):
    """A module of the tree with its slot dictionaries, each mutated in place by an assignment to the module."""

    attributes: dict[str, Any]  # the module's ``__dict__``, which holds the three below
    parameters: dict[str, torch.nn.Parameter | None]
    buffers: dict[str, torch.Tensor | None]
    children: dict[str, torch.nn.Module | None]


class StateWatch:
    """``changed()``: has the state's identity (``state_identity``) changed since the last call?
    True at the first call."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, modules: Modules | None = None) -> None:
        self.model = model
        self.optimizer = optimizer
        self.modules = modules
        self._identity: list[int] | None = None
        self._seen: _Seen | None = None

    def changed(self) -> bool:
        if self._seen is not None and self._seen.same(self._slots(self._seen.holders)):
            return False
        identity = state_identity(self.model, self.optimizer, self.modules)
        changed = identity != self._identity
        self._identity = identity
        holders = self._holders()
        self._seen = _Seen(holders, self._slots(holders))
        return changed

    def _holders(self) -> list[_Holder]:
        """Each module of the tree (in ``state_identity``'s walk) with its slot dictionaries."""
        out = []
        seen: set[int] = set()
        stack: list[torch.nn.Module] = [self.model]
        while stack:
            m = stack.pop()
            if id(m) in seen:
                continue
            seen.add(id(m))
            d = m.__dict__
            out.append(_Holder(d, d.get("_parameters"), d.get("_buffers"), d.get("_modules")))
            stack.extend(c for c in reversed(m._modules.values()) if c is not None)
        return out

    def _slots(self, holders: list[_Holder]) -> list[Any]:
        """Every object in a state slot, in a fixed order: modules' parameters, buffers and
        children, the optimizer's parameters, which have state, and that state's values, and
        the state modules' tensors."""
        out: list[Any] = []
        extend = out.extend
        for _, params, buffers, children in holders:
            extend(params.values())
            extend(buffers.values())
            extend(children.values())
        for group in self.optimizer.param_groups:
            extend(group["params"])
        state = self.optimizer.state
        extend(state)
        for values in state.values():
            extend(values.values())
        for module in (self.modules or {}).values():
            extend(module.state_dict(keep_vars=True).values())
        return out


class _Seen:
    """What the last walk found: the holders, the objects in their slots, and the pointers."""

    def __init__(self, holders: list[_Holder], objects: list[Any]) -> None:
        self.holders = holders
        self.dicts = [(d, name, held) for d, *held_three in holders
                      for name, held in zip(("_parameters", "_buffers", "_modules"), held_three)]
        self.length = len(objects)
        # positions that held a number (a step count): it may change freely, but must not
        # become a tensor; every other position must hold the very same object
        loose = [i for i, o in enumerate(objects) if isinstance(o, (int, float, complex))]
        loose_set = set(loose)
        self.fixed = _picker([i for i in range(len(objects)) if i not in loose_set])
        self.held = self.fixed(objects)
        self.loose = _picker(loose)
        tensors = [o for o in objects if isinstance(o, torch.Tensor)]
        self.strided = [t for t in tensors if t.layout == torch.strided]
        self.pointers = list(map(torch.Tensor.data_ptr, self.strided))

    def same(self, objects: list[Any]) -> bool:
        return (all(d.get(name) is held for d, name, held in self.dicts)  # no slot dictionary replaced
                and len(objects) == self.length
                and all(map(operator.is_, self.fixed(objects), self.held))
                and not any(isinstance(o, torch.Tensor) for o in self.loose(objects))
                and list(map(torch.Tensor.data_ptr, self.strided)) == self.pointers)


def _picker(positions: list[int]):
    """A function taking these positions of a list, as a tuple (C-speed ``itemgetter``)."""
    if not positions:
        return lambda objects: ()
    if len(positions) == 1:
        i = positions[0]
        return lambda objects: (objects[i],)
    return operator.itemgetter(*positions)
