"""Who touched a determinism control during a run, and where.

A strict run switches every control on before the model's code runs and attests it. A
factory, or a library it calls, can still switch one off later
(``torch.use_deterministic_algorithms(False)``, ``torch.backends.cudnn.benchmark = True``,
``with torch.backends.cudnn.flags(deterministic=False)``). ``ControlWatch`` wraps torch's
setters for the run's duration and records every call made from outside torch and the
harness, with the caller's file and line; the run then says plainly which control was
switched off, and where, beside re-attestations at the checkpoint and at the end.
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path
from types import FrameType
from typing import Any, Callable, TypedDict

import torch

_TORCH_DIR = str(Path(torch.__file__).resolve().parent)
_HARNESS_DIR = str(Path(__file__).resolve().parent)
_STDLIB_DIR = os.path.dirname(os.__file__)
_THIS_FILE = str(Path(__file__).resolve())


def _skipped(path: str) -> bool:
    """torch, the harness and the standard library (contextlib, functools) are not callers."""
    if path.startswith((_TORCH_DIR, _HARNESS_DIR)):
        return True
    return path.startswith(_STDLIB_DIR) and "-packages" not in path


_CUDNN_SETTERS = ("_set_cudnn_deterministic", "_set_cudnn_benchmark", "_set_cudnn_allow_tf32")
_CUDNN_FLAGS_FILE = str(Path(torch.backends.cudnn.__file__).resolve())


def _inside_cudnn_off() -> bool:
    """Whether this call comes from ``torch.backends.cudnn.flags(enabled=False, ...)``: cuDNN is
    off for that block, so the cuDNN settings that ``flags`` also sets (``deterministic=False``,
    ``allow_tf32=True`` by default) choose no kernel. Library code does this around ops without a
    cuDNN path (the CTC loss of transformers); it leaves no control open."""
    f: FrameType | None = sys._getframe(2)
    while f is not None:
        if f.f_code.co_name == "set_flags" and _resolved(f.f_code.co_filename) == _CUDNN_FLAGS_FILE:
            return not torch._C._get_cudnn_enabled()
        f = f.f_back
    return False


def _strict_off(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether this setter call leaves strict determinism."""
    value = args[0] if args else None
    if name in _CUDNN_SETTERS and _inside_cudnn_off():
        return False
    if name == "_set_deterministic_algorithms":
        return not value or bool(kwargs.get("warn_only", args[1] if len(args) > 1 else False))
    if name in ("_set_cudnn_deterministic", "_set_deterministic_fill_uninitialized_memory"):
        return not value
    if name in ("_set_cudnn_benchmark", "_set_cudnn_allow_tf32", "_set_cublas_allow_tf32"):
        return bool(value)
    if name == "_set_float32_matmul_precision":
        return value != "highest"
    if name == "_set_fp32_precision_setter":  # (backend, op, precision)
        return len(args) > 2 and args[2] not in ("ieee", "none")
    return False


MAX_EVENTS = 100  # calls recorded per run

# torch._C setter -> the control it sets, as attest() names it.
WATCHED = {
    "_set_deterministic_algorithms": "deterministic_algorithms",
    "_set_cudnn_deterministic": "cudnn_deterministic",
    "_set_cudnn_benchmark": "cudnn_benchmark",
    "_set_cudnn_allow_tf32": "cudnn_fp32_precision",
    "_set_cublas_allow_tf32": "matmul_fp32_precision",
    "_set_float32_matmul_precision": "matmul_fp32_precision",
    "_set_fp32_precision_setter": "fp32_precision",
    "_set_deterministic_fill_uninitialized_memory": "fill_uninitialized_memory",
}


@functools.lru_cache(maxsize=None)
def _resolved(filename: str) -> str:
    return "" if filename.startswith("<") else str(Path(filename).resolve())


def _caller() -> tuple[str, int, str] | None:
    """The innermost frame outside torch, the harness and the stdlib; None if the harness
    itself made the call (it toggles some controls around its own checksums)."""
    f: FrameType | None = sys._getframe(2)
    while f is not None:
        name = _resolved(f.f_code.co_filename)
        if name == _THIS_FILE:  # this module's own routing of cuDNN's properties
            f = f.f_back
            continue
        if name and not _skipped(name):
            return f.f_code.co_filename, f.f_lineno, f.f_code.co_name
        if name.startswith(_HARNESS_DIR):
            return None
        f = f.f_back
    return None


class ControlEvent(TypedDict):
    """One call to a determinism setter from the model's code."""

    control: str  # the control it sets, as attest() names it (``WATCHED``)
    setter: str  # torch._C's setter, without its leading underscore
    value: str  # the repr of the value set
    off: bool  # whether it leaves strict determinism
    file: str
    line: int
    function: str
    step: int  # the step being taken (0: before the first)
    where: str  # FILE:LINE, the file's name only


class Controls(TypedDict):
    """A strict run's record of its determinism controls (``controls``)."""

    events: list[ControlEvent]  # every call recorded (``MAX_EVENTS`` at most)
    switched_off: list[ControlEvent]  # those that left strict determinism


class ControlWatch:
    """Record calls to torch's determinism setters from the model's code (context manager)."""

    def __init__(self, step: Callable[[], int]) -> None:
        self.step = step
        self.events: list[ControlEvent] = []
        self._saved: list[tuple[Any, str, Any]] = []

    def _wrap(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def setter(*args: Any, **kwargs: Any) -> Any:
            where = _caller()
            if where is not None and len(self.events) < MAX_EVENTS:  # a setter called every step: the first ones tell
                self.events.append({
                    "control": WATCHED[name], "setter": name.lstrip("_"), "value": repr(args[-1] if args else None),
                    "off": _strict_off(name, args, kwargs), "file": where[0], "line": where[1],
                    "function": where[2], "step": self.step(), "where": f"{Path(where[0]).name}:{where[1]}",
                })
            return original(*args, **kwargs)
        return setter

    def __enter__(self) -> "ControlWatch":
        for name in WATCHED:
            original = getattr(torch._C, name, None)
            if original is None:
                continue
            self._saved.append((torch._C, name, original))
            setattr(torch._C, name, self._wrap(name, original))
        # cuDNN's module properties hold their setter functions: route them through torch._C.
        cudnn_cls = type(torch.backends.cudnn)
        for attr, name in (("deterministic", "_set_cudnn_deterministic"), ("benchmark", "_set_cudnn_benchmark"),
                           ("allow_tf32", "_set_cudnn_allow_tf32")):
            prop = cudnn_cls.__dict__.get(attr)
            if prop is not None and hasattr(prop, "setter") and hasattr(torch._C, name):
                self._saved.append((prop, "setter", prop.setter))
                prop.setter = (lambda n: lambda v: getattr(torch._C, n)(v))(name)
        return self

    def __exit__(self, *exc: object) -> None:
        for obj, attr, original in reversed(self._saved):
            setattr(obj, attr, original)
        self._saved.clear()

    def switched_off(self) -> list[ControlEvent]:
        return [e for e in self.events if e["off"]]

    def record(self) -> Controls:
        """The record's ``controls``: every call, and those that switched a control off."""
        return {"events": self.events, "switched_off": self.switched_off()}

