"""Wrapping sums of many flat integer tensors at once: the kernels behind the fingerprints.

Each sum is taken modulo 2**32 for elements of up to 32 bits (accumulated in int32) and
modulo 2**64 for 64-bit elements, so it is exact and independent of reduction order; the
many-tensor forms give exactly what one reduction per tensor gives, in fewer calls.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import torch

_INDEX_CACHE_MAX = 1024  # layouts kept; a gradient present at some steps only makes one per pattern
_INDEX_CACHE: dict[tuple[Any, ...], tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}


_DIRECT = 4096  # elements from which an array is reduced by itself: a copy costs more than the call


def array_sums(arrays: list[np.ndarray], workspace: dict[Any, Any] | None = None, key: Any = None) -> np.ndarray:
    """Wrapping sum of each flat numpy integer array, as int64, in input order. A large array
    is reduced where it lies (one read); the small ones, per width, are copied into a reused
    buffer and reduced by one ``np.add.reduceat`` (a call per array costs more than the adds
    themselves for the small tensors of a model). Elements of up to 32 bits are widened to
    int32 as ``np.add.reduce(a, dtype=np.int32)`` would, so the values are those of one
    reduction per array. ``key``, where the caller has one, names the layout (the arrays'
    sizes and widths) so that it is not read from every array again."""
    workspace = {} if workspace is None else workspace
    plan = workspace.get(("plan", key)) if key is not None else None
    if plan is None:
        # the layout: a wide array's size negated; a large one's kept apart (reduced directly)
        layout = tuple(0 if a.size >= _DIRECT else a.size * (-1 if a.itemsize == 8 else 1) for a in arrays)
        plan = workspace.get(layout)
        if plan is None:
            if len(workspace) > _INDEX_CACHE_MAX:
                workspace.clear()
            direct = [(i, np.int64 if a.itemsize == 8 else np.int32) for i, a in enumerate(arrays) if a.size >= _DIRECT]
            plan = workspace[layout] = (direct, _plan(layout))
        if key is not None:
            workspace[("plan", key)] = plan
    direct, groups = plan
    out = np.zeros(len(arrays), dtype=np.int64)
    for i, acc in direct:
        out[i] = np.add.reduce(arrays[i], dtype=acc)
    for acc, idx, starts, total in groups:
        buf = workspace.get(acc)
        if buf is None or buf.size < total:
            buf = workspace[acc] = np.empty(total, dtype=acc)
        flat = buf[:total]
        np.concatenate([arrays[i] for i in idx], out=flat, casting="unsafe")  # widening, or the same width
        out[idx] = np.add.reduceat(flat, starts, dtype=acc)
    return out


def _plan(layout: tuple[int, ...]) -> list[tuple[Any, list[int], np.ndarray, int]]:
    """Per width (int32, int64): which arrays, where each starts in the copy, and its length.
    Empty arrays are left out (their sum is 0), so no segment of the copy is empty."""
    plan = []
    for acc, wide in ((np.int32, False), (np.int64, True)):
        idx = [i for i, n in enumerate(layout) if n and (n < 0) == wide]
        if idx:
            sizes = [abs(layout[i]) for i in idx]
            starts = np.zeros(len(idx), dtype=np.intp)
            np.cumsum(sizes[:-1], out=starts[1:])
            plan.append((acc, idx, starts, sum(sizes)))
    return plan


def grouped_sums(views: list[torch.Tensor]) -> torch.Tensor:
    """``segment_sums`` over tensors on any mix of devices, as one CPU row in input order
    (one host copy per device: for one-off rows, not per step)."""
    out = torch.zeros(len(views), dtype=torch.int64)
    by_device: dict[str, list[int]] = {}
    for i, v in enumerate(views):
        by_device.setdefault(str(v.device), []).append(i)
    for idxs in by_device.values():
        out[idxs] = segment_sums([views[i] for i in idxs]).cpu()
    return out


def segment_sums(views: list[torch.Tensor], workspace: dict[Any, torch.Tensor] | None = None) -> torch.Tensor:
    """Wrapping sum of each flat integer tensor, in input order, in few kernels.

    ``workspace`` keeps the concatenation and running-sum buffers between calls: large
    fresh CPU buffers cost page faults on every step, reused ones do not. (A gradient that
    exists at some steps only changes the total; the buffers are kept at the largest.)
    """
    if not views:
        return torch.zeros(0, dtype=torch.int64)
    device = views[0].device
    groups: dict[torch.dtype, list[int]] = {}
    for i, v in enumerate(views):
        groups.setdefault(v.dtype, []).append(i)
    out = torch.zeros(len(views), dtype=torch.int64, device=device)
    for dtype, idxs in groups.items():
        members = [views[i] for i in idxs]
        lengths = tuple(m.numel() for m in members)
        total = sum(lengths)
        if total == 0:
            continue
        ends, leading, where = _segment_index(lengths, tuple(idxs), device)
        # Exact: integer adds wrap modulo 2**w, and so do the differences of the running
        # sums. Elements of up to 32 bits accumulate in int32 (half the memory traffic of
        # widening to int64), 64-bit elements in int64.
        acc = torch.int64 if members[0].element_size() == 8 else torch.int32
        if workspace is None:
            running = torch.cat(members).cumsum(0, dtype=acc)
        else:  # one pair of buffers per width, grown to the largest total seen, used as a prefix
            key = (dtype, str(device))
            if key not in workspace or workspace[key].numel() < total:
                workspace[key] = torch.empty(total, dtype=dtype, device=device)
                workspace[(key, "sum")] = torch.empty(total, dtype=acc, device=device)
            flat = torch.cat(members, out=workspace[key][:total])
            running = torch.cumsum(flat, 0, dtype=acc, out=workspace[(key, "sum")][:total])
        # A segment's total is the running sum at its last element; an empty one repeats the
        # total before it (its sum is 0), and before the first element that total is 0.
        totals = running[ends].masked_fill(leading, 0)
        sums = torch.diff(totals, prepend=totals.new_zeros(1))
        out[where] = sums.to(torch.int64)
    return out


def _segment_index(lengths: tuple[int, ...], idxs: tuple[int, ...], device: torch.device):
    """(segment end positions, mask of the empty segments before the first element, output
    positions), made once per layout."""
    key = (lengths, idxs, str(device))
    hit = _INDEX_CACHE.get(key)
    if hit is None:
        if len(_INDEX_CACHE) >= _INDEX_CACHE_MAX:
            _INDEX_CACHE.clear()
        cumulative = list(itertools.accumulate(lengths))
        hit = (torch.tensor([max(e - 1, 0) for e in cumulative], dtype=torch.long, device=device),
               torch.tensor([e == 0 for e in cumulative], dtype=torch.bool, device=device),
               torch.tensor(idxs, dtype=torch.long, device=device))
        _INDEX_CACHE[key] = hit
    return hit
