"""How the state census reaches objects and digests what it finds (``census``): a function's
closure, bound object, partial arguments and the globals its code names (the plugin's own code
only); a container's first elements; an object's attributes or slots. Harness objects,
iterators and locks are not entered."""

from __future__ import annotations

import functools
import hashlib
import os
import sysconfig
import types
from typing import Any, Iterator

import torch

from . import rng
from .tensor_bits import flat_int

MAX_CONTAINER = 64  # elements of a list, tuple or dict looked at (a dataset's samples are data, not state)
_WORKER_PACKAGE = __name__.rsplit(".", 2)[0]  # "reproci.worker"
_HARNESS_PREFIX = _WORKER_PACKAGE + "."
# The adapters' bookkeeping (the batch a Lightning hook is given, the stand-in Trainer): the
# adapter's state, derived from what the checkpoint holds, not the plugin's.
_ADAPTERS_PREFIX = _WORKER_PACKAGE.rsplit(".", 1)[0] + ".adapters."
_WORKER_DIR = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
_SKIP_NAMES = {"__weakref__", "__dict__", "_iterator", "_lock", "_cache", "__cached__"}
_LIB_DIRS = tuple(os.path.realpath(p) for p in {sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"],
                                                sysconfig.get_paths()["platlib"]})


def children(obj: Any) -> Iterator[tuple[str, Any]]:
    """(path suffix, child) of one object: a function's closure, bound object, partial arguments
    and named globals; a container's first elements; an object's attributes (or slots)."""
    if isinstance(obj, types.MethodType):
        yield ".__self__", obj.__self__
        obj = obj.__func__
    if isinstance(obj, types.FunctionType):
        code = obj.__code__
        for name, cell in zip(code.co_freevars, obj.__closure__ or ()):
            try:
                yield f".<{name}>", cell.cell_contents
            except ValueError:  # an empty cell
                continue
        if user_code(code.co_filename):
            g = obj.__globals__
            for name in sorted(_global_names(code)):
                if name in g:
                    yield f".<global {name}>", g[name]
        return
    if isinstance(obj, functools.partial):
        yield ".func", obj.func
        for i, a in enumerate(obj.args):
            yield f".args[{i}]", a
        for k, v in obj.keywords.items():
            yield f".keywords[{k}]", v
        return
    if isinstance(obj, dict):
        for i, (k, v) in enumerate(obj.items()):
            if i >= MAX_CONTAINER:
                break
            if isinstance(k, (str, int)):
                yield f"[{k!r}]", v
        return
    if isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj[:MAX_CONTAINER]):
            yield f"[{i}]", v
        return
    if isinstance(obj, (set, frozenset)):
        return
    try:
        attrs = dict(vars(obj))
    except TypeError:
        attrs = {s: getattr(obj, s) for cls in type(obj).__mro__ for s in getattr(cls, "__slots__", ())
                 if isinstance(s, str) and hasattr(obj, s)}
    for name, child in attrs.items():
        if name not in _SKIP_NAMES and not (name.startswith("__") and name.endswith("__")):
            yield f".{name}", child


def _global_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


@functools.lru_cache(maxsize=None)
def user_code(filename: str) -> bool:
    """Whether a function's file is the plugin's own (not the stdlib, an installed package or torch)."""
    if filename.startswith("<"):
        return False
    path = os.path.realpath(filename)
    return not path.startswith(_LIB_DIRS) and "site-packages" not in path and "dist-packages" not in path \
        and not path.startswith(_WORKER_DIR)


def harness_object(obj: Any) -> bool:
    """An instance of the harness's own classes (ModelContext, the stepper wrappers, ...), or of
    the adapters' (``reproci.adapters``)."""
    module = type(obj).__module__
    return module.startswith((_HARNESS_PREFIX, _ADAPTERS_PREFIX)) or module == _HARNESS_PREFIX[:-1]


def is_iterator(obj: Any) -> bool:
    cls = type(obj)
    return hasattr(cls, "__next__") and hasattr(cls, "__iter__") or cls.__name__.endswith(("Lock", "Thread", "Event"))


# -- digests ----------------------------------------------------------------------------------

def digest(data: str | bytes | memoryview) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()[:16]


def rng_state(obj: Any) -> Any:
    state = rng.get_state(obj)
    return bytes(state.numpy()) if isinstance(state, torch.Tensor) else state


def tensor_type(t: torch.Tensor) -> str:
    return f"Tensor[{str(t.dtype).removeprefix('torch.')}, {tuple(t.shape)}]"


def tensor_digest(t: torch.Tensor) -> str:
    """Exact: a CPU tensor's bytes through sha256 (no copy when contiguous); on another device, two
    wrapping integer sums there (plain and position-weighted), so one host copy of two numbers."""
    t = t.detach()
    if t.layout != torch.strided:
        t = t.to_dense()
    if t.numel() == 0:
        return digest(f"empty{tuple(t.shape)}")
    ints = flat_int(t)
    if ints.device.type == "cpu":
        return digest(memoryview(ints.numpy()).cast("B"))
    wide = ints.to(torch.int64)
    weights = torch.arange(1, wide.numel() + 1, device=wide.device, dtype=torch.int64)
    return digest(f"{int(wide.sum())}:{int((wide * weights).sum())}")
