"""A batch as a tree: the one walk that moves it to the device and that checksums it.

A batch is whatever the loader yields: a tensor, or any nesting of the containers torch's
``default_collate`` produces and the libraries users train with pass around: ``Mapping``
(``dict``, and HF's ``BatchEncoding``, a ``UserDict``), ``list``, ``tuple`` and
namedtuples, dataclasses, numpy arrays, Python scalars and strings. An object of another
type with a ``.to(device)`` method is moved with it (and is not seen inside). Leaves of
any other type pass through unchanged; the checksum names them once in the record
(``opaque``), so that what it cannot see is said, not silently left out.

Mappings are walked in sorted key order, sequences and dataclass fields in their order.
Moving a batch keeps its container types: a ``BatchEncoding`` stays a ``BatchEncoding``
(copied, then updated, as torch's own ``pin_memory`` does), a namedtuple stays that
namedtuple, a dataclass is copied with its fields replaced.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from typing import Any, Callable, Iterator

import numpy as np
import torch

SCALARS = (bool, int, float, complex, str, bytes, type(None))


def _is_namedtuple(obj: object) -> bool:
    return isinstance(obj, tuple) and hasattr(type(obj), "_fields")


def _is_dataclass_instance(obj: object) -> bool:
    return dataclasses.is_dataclass(obj) and not isinstance(obj, type)


def _key(k: Any) -> tuple[str, str]:
    return (type(k).__name__, str(k))


def leaves(obj: object, path: str = "batch") -> Iterator[tuple[str, object]]:
    """Every leaf of a batch with its path (``batch['input_ids']``, ``batch[0].x``), in a
    fixed order."""
    if isinstance(obj, torch.Tensor) or isinstance(obj, np.ndarray) or isinstance(obj, SCALARS):
        yield path, obj
    elif isinstance(obj, Mapping):
        for k in sorted(obj, key=_key):
            yield from leaves(obj[k], f"{path}[{k!r}]")
    elif _is_namedtuple(obj):
        for name in type(obj)._fields:  # type: ignore[attr-defined]
            yield from leaves(getattr(obj, name), f"{path}.{name}")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from leaves(v, f"{path}[{i}]")
    elif _is_dataclass_instance(obj):
        for f in dataclasses.fields(obj):  # type: ignore[arg-type]
            yield from leaves(getattr(obj, f.name), f"{path}.{f.name}")
    else:
        yield path, obj


def apply(obj: Any, fn: Callable[[torch.Tensor], Any], other: Callable[[Any], Any] | None = None) -> Any:
    """The batch with ``fn`` applied to every tensor (and ``other``, if given, to every leaf
    that is neither a tensor, an array nor a scalar), its containers' types kept."""
    def walk(o: Any) -> Any:
        if isinstance(o, torch.Tensor):
            return fn(o)
        if isinstance(o, (np.ndarray, *SCALARS)):
            return o
        if isinstance(o, Mapping):
            moved = {k: walk(v) for k, v in o.items()}
            if type(o) is dict:
                return moved
            try:  # BatchEncoding and other mappings: a copy updated in place, as torch's pin_memory does
                clone = copy.copy(o)
                clone.update(moved)  # type: ignore[attr-defined]
                return clone
            except Exception:
                return moved
        if _is_namedtuple(o):
            return type(o)(*(walk(v) for v in o))
        if isinstance(o, (list, tuple)):
            return type(o)(walk(v) for v in o)
        if _is_dataclass_instance(o):
            clone = copy.copy(o)
            for f in dataclasses.fields(o):
                object.__setattr__(clone, f.name, walk(getattr(o, f.name)))  # frozen dataclasses too
            return clone
        return other(o) if other is not None else o

    return walk(obj)


def _move(obj: Any, device: torch.device) -> Any:
    to = getattr(obj, "to", None)
    return to(device) if callable(to) else obj


def to_device(batch: Any, device: torch.device) -> Any:
    """A batch on the device: every tensor in it moved, its container types kept; an
    object of another type with a ``.to`` method is moved by it."""
    return apply(batch, lambda t: t.to(device, non_blocking=False), lambda o: _move(o, device))


def opaque(batch: object) -> list[str]:
    """The leaves the checksum cannot see into, as ``path (type)``."""
    return [f"{path} ({type(leaf).__module__}.{type(leaf).__qualname__})" for path, leaf in leaves(batch)
            if not isinstance(leaf, (torch.Tensor, np.ndarray, *SCALARS))]
