"""A tensor's raw bits read as integers: the one reading every checksum in the worker uses.

Floats are read as signed integers of their width (float32 as int32, bfloat16 as int16,
...), bool and float8 as uint8, integer types as themselves, complex tensors as their real
and imaginary parts. Integer addition modulo 2**w is associative, so sums of these
readings are exact and independent of reduction order on any device.

A sparse tensor (a COO or compressed-layout gradient, say) is read as its stored values
after coalescing: their wrapping sum is exactly the sum of the dense tensor's readings,
since the positions it does not store hold +0.0, whose bits are zero.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import numpy as np
import torch

INT_VIEW = {
    torch.float64: torch.int64,
    torch.float32: torch.int32,
    torch.float16: torch.int16,
    torch.bfloat16: torch.int16,
    torch.bool: torch.uint8,
}
if hasattr(torch, "float8_e4m3fn"):
    INT_VIEW[torch.float8_e4m3fn] = torch.uint8
    INT_VIEW[torch.float8_e5m2] = torch.uint8


# dtypes whose numpy array is read directly (floats through a view as the integer of their width)
_NP_VIEW = {torch.float32: np.int32, torch.float64: np.int64, torch.int64: None, torch.int32: None,
            torch.int16: None, torch.int8: None, torch.uint8: None}


def dense(t: torch.Tensor) -> torch.Tensor:
    """The tensor itself, or a sparse tensor's dense form (for whole-tensor hashes and dumps)."""
    return t if t.layout == torch.strided else t.detach().to_dense()


def stored_values(t: torch.Tensor) -> torch.Tensor:
    """A strided tensor itself; a sparse tensor's stored values (coalesced first, so that a
    duplicate index counts once, as in its dense form)."""
    if t.layout == torch.strided:
        return t
    t = t.detach()
    if t.layout == torch.sparse_coo:
        return t.coalesce().values()
    return t.values()


def flat_int(t: torch.Tensor) -> torch.Tensor:
    """A flat integer view of a tensor's bits (shares its storage when contiguous)."""
    t = stored_values(t.detach())
    if t.is_complex():
        t = torch.view_as_real(t)
    t = t.contiguous().reshape(-1)
    view = INT_VIEW.get(t.dtype)
    return t.view(view) if view is not None else t


def np_bits(t: torch.Tensor) -> np.ndarray:
    """A CPU tensor's raw bits as a flat numpy integer array (sharing its memory when it is
    contiguous), with the same integer reading as ``flat_int``: floats as signed integers
    of their width, bool as uint8, integer types as themselves."""
    view = _NP_VIEW.get(t.dtype, False)
    if view is not False and t.layout == torch.strided and t.is_contiguous():  # most tensors: fewest calls
        a = (t.detach() if t.requires_grad else t).numpy().reshape(-1)
        return a if view is None else a.view(view)
    t = stored_values(t.detach())
    if t.is_complex():
        t = torch.view_as_real(t)
    if t.element_size() <= 2 and t.dtype in INT_VIEW:  # bfloat16, float16, bool, float8: not numpy types
        t = t.view(INT_VIEW[t.dtype])
    a = t.contiguous().numpy().reshape(-1)
    return a if a.dtype.kind in "iu" else a.view(f"i{a.itemsize}")


@contextlib.contextmanager
def no_fill() -> Iterator[None]:
    """Skip filling fresh buffers with NaN/garbage while checksumming: every buffer made
    here is written in full before it is read, so the fill only costs time."""
    det = getattr(torch.utils, "deterministic", None)
    saved = getattr(det, "fill_uninitialized_memory", None)
    if saved:
        det.fill_uninitialized_memory = False  # type: ignore[union-attr]
    try:
        yield
    finally:
        if saved:
            det.fill_uninitialized_memory = saved  # type: ignore[union-attr]
