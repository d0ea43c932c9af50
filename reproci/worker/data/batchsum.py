"""The batch checksum: which data each step trained on, told apart from what it computed.

Recorded per step beside the state fingerprints, so that where two runs diverge the
record says whether their batches differed (in content or in order) or only what was
computed from them. The scheme's name is recorded with every run: checksums of
different schemes are never compared.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..state.tensor_bits import dense, flat_int, no_fill, np_bits
from . import batchtree

BATCH_CHECKSUM = "position-weighted-v2"
# Beside it, per step, an order-free checksum of the batch's samples: each row (the first
# dimension of every tensor) is checksummed by position within the row, mixed, and the rows'
# values summed. Reordering samples, within a batch or across an epoch's batches, leaves the
# sums equal; other samples or other contents (augmentation, masking) change them.
BATCH_CONTENTS = "row-multiset-v1"
_MIX = 0x9E3779B1
_WEIGHTS: dict[str, torch.Tensor] = {}  # per device
_NP_WEIGHTS: dict[int, np.ndarray] = {}  # the CPU's, as numpy
_STARTS: dict[tuple[int, ...], np.ndarray] = {}
_ODD: dict[tuple[int, str], torch.Tensor] = {}


def batch_checksum(batch: object) -> torch.Tensor | None:
    """Exact, order-sensitive checksum over every tensor of a (nested) batch: tells data
    order from compute. Each 32-bit word of raw bits is multiplied by a weight of its
    position, modulo 2**32 (int32 products wrap), and summed in int64: rows or tokens
    reordered within a batch change it, not only a different set of samples, and the value
    is the same on every device. Two kernels per tensor, on the batch's device; on the CPU
    one numpy call (the weights, one array grown to the largest size seen).
    """
    tensors = tensors_of(batch)
    if not tensors:
        return None
    if all(t.device.type == "cpu" for t in tensors):  # the same arithmetic in numpy, without torch's per-op cost
        return torch.tensor(cpu_checksum(tensors), dtype=torch.int64)
    return device_checksum(tensors)


def device_checksum(tensors: list[torch.Tensor]) -> torch.Tensor:
    """``batch_checksum`` in torch ops, on the tensors' devices (the reference arithmetic)."""
    acc = None
    with no_fill():
        for i, t in enumerate(tensors):
            words = _words(t)
            s = (words * _position_weights(words.numel(), words.device)).sum(dtype=torch.int64) % 2**32
            s = s * (2 * i + 1)  # which input of the batch it is
            acc = s if acc is None else acc + s.to(acc.device)
    return acc


def device_sums(tensors: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """``device_checksum`` and ``device_contents`` of tensors on one device, the same values in
    half their kernels and under half their scratch memory (what a step pays on a GPU): each
    tensor's words are read by two int32 products (position-weighted, and weighted by the
    position within the row), whose int64 sums keep the low 32 bits both checksums use; then
    the rows of every tensor are mixed at once. Tensors on several devices take the two
    reference functions."""
    device = tensors[0].device
    if any(t.device != device for t in tensors):
        return device_checksum(tensors), device_contents(tensors)
    fulls, rows, counts = [], [], []
    with no_fill():
        for t in tensors:
            words = _words(t)
            n = words.numel()
            r = t.shape[0] if t.dim() > 0 and t.shape[0] > 0 else 1
            weights = _position_weights(n, device)
            fulls.append((words * weights).sum(dtype=torch.int64))
            rows.append((words.view(r, n // r) * weights[: n // r]).sum(1, dtype=torch.int64))
            counts.append(r)
        mixed = _mixed(torch.cat(rows))
        parts = torch.stack([m.sum() for m in mixed.split(counts)])
        odd = _odd(len(tensors), device)  # which input of the batch each is
        return ((torch.stack(fulls) % 2**32) * odd).sum(), ((parts % 2**32) * odd).sum()


def _mixed(sums: torch.Tensor) -> torch.Tensor:
    """Row sums (int64, of which the low 32 bits count) mixed, in uint32 values: nonlinear in
    the row, so a value moved between rows shows (``mix_rows`` is the numpy form)."""
    s = sums & 0xFFFFFFFF
    return ((s * _MIX) ^ (s >> 15)) & 0xFFFFFFFF


def _odd(k: int, device: torch.device) -> torch.Tensor:
    """2i+1 for i < k, on the device (made there: no copy from the host)."""
    key = (k, str(device))
    odd = _ODD.get(key)
    if odd is None:
        if len(_ODD) >= 256:
            _ODD.clear()
        odd = _ODD[key] = torch.arange(k, dtype=torch.int64, device=device) * 2 + 1
    return odd


def cpu_checksum(tensors: list[torch.Tensor], words: list[np.ndarray] | None = None) -> int:
    """``batch_checksum`` on the CPU, in numpy arithmetic that wraps as torch's does (the same
    value, as a Python int)."""
    total = 0
    for i, t in enumerate(tensors):
        w = np_words(t) if words is None else words[i]
        # the int32 products and their int32 sum wrap modulo 2**32: one pass, no buffer of products
        s = int(np.einsum("i,i->", w, np_weights(w.size))) % 2**32
        total += s * (2 * i + 1)
    return total


def cpu_contents(tensors: list[torch.Tensor], words: list[np.ndarray] | None = None) -> int:
    """``contents_checksum`` on the CPU, in numpy arithmetic that wraps as torch's does, so
    every value is the same (``row_sums``, then ``mix_rows``)."""
    return mix_rows([row_sums(tensors, words)])[0]


def row_sums(tensors: list[torch.Tensor], words: list[np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The first half of the CPU's order-free checksum: each row's weighted sum in wrapping
    int32 (all that the checksum keeps of it), the rows of every tensor side by side in one
    array, and where each tensor's rows start in it."""
    rows = [t.shape[0] if t.dim() > 0 and t.shape[0] > 0 else 1 for t in tensors]
    starts = _row_starts(tuple(rows))
    sums = np.empty(starts[-1] + rows[-1], dtype=np.int32)
    for i, t in enumerate(tensors):
        w = (np_words(t) if words is None else words[i]).reshape(rows[i], -1)
        np.einsum("ij,j->i", w, np_weights(w.shape[1]), out=sums[starts[i]:starts[i] + rows[i]])
    return sums, starts


def mix_rows(batches: list[tuple[np.ndarray, np.ndarray]]) -> list[int]:
    """The second half, for many batches at once (``row_sums`` of each): every row mixed in
    uint32 (the low 32 bits of the reference's int64 arithmetic), summed per tensor modulo
    2**32 and weighted by the tensor's place in its batch; one value per batch, equal to
    ``contents_checksum`` of it. A handful of calls, however many batches."""
    sums = np.concatenate([b[0] for b in batches]).view(np.uint32) if len(batches) > 1 else batches[0][0].view(np.uint32)
    offsets = np.cumsum([0] + [b[0].size for b in batches[:-1]])
    starts = np.concatenate([b[1] + o for b, o in zip(batches, offsets)])
    mixed = sums * np.uint32(_MIX)  # uint32 products wrap: the low 32 bits, as the reference keeps
    mixed ^= sums >> 15  # nonlinear in the row: a value moved between rows shows
    parts = np.add.reduceat(mixed, starts, dtype=np.uint32).tolist()  # each tensor's rows, modulo 2**32
    out, first = [], 0
    for b in batches:  # tensor i of a batch counts 2i+1 times (which input it is), in exact Python ints
        out.append(sum(v * (2 * i + 1) for i, v in enumerate(parts[first:first + b[1].size])))
        first += b[1].size
    return out


def _row_starts(rows: tuple[int, ...]) -> np.ndarray:
    """Where each tensor's rows start in the buffer of row sums (every tensor has a row)."""
    starts = _STARTS.get(rows)
    if starts is None:
        starts = np.zeros(len(rows), dtype=np.intp)
        np.cumsum(rows[:-1], out=starts[1:])
        if len(_STARTS) < 256:
            _STARTS[rows] = starts
    return starts


def np_words(t: torch.Tensor) -> np.ndarray:
    """``_words`` of a CPU tensor, as a numpy array."""
    bits = np_bits(t)
    return bits.view(np.int32) if bits.itemsize == 8 else bits if bits.dtype == np.int32 else bits.astype(np.int32)


def _position_weights(n: int, device: torch.device) -> torch.Tensor:
    """One odd pseudo-random int32 weight per position (Knuth's multiplicative hash): a
    change of one word always changes the sum, and swapping two words changes it unless
    their difference times the weights' difference vanishes modulo 2**32. A weight depends
    on its position alone, so one array per device, grown to the largest size seen, serves
    every size as a prefix (batches of varying length add no arrays)."""
    key = str(device)
    w = _WEIGHTS.get(key)
    if w is None or w.numel() < n:
        pos = torch.arange(max(n, 2 * w.numel() if w is not None else 0), dtype=torch.int64, device=device)
        w = _WEIGHTS[key] = (((pos * 2654435761 + 0x7F4A7C15) & 0x7FFFFFFF) | 1).to(torch.int32)
    return w[:n]


def np_weights(n: int) -> np.ndarray:
    """The first ``n`` position weights (``_position_weights``) as a numpy int32 array, a
    prefix of one array grown to the largest size seen."""
    w = _NP_WEIGHTS.get(0)
    if w is None or w.size < n:
        w = _NP_WEIGHTS[0] = _position_weights(n, torch.device("cpu")).numpy()
    return w[:n]


def _words(t: torch.Tensor) -> torch.Tensor:
    """A tensor's raw bits as int32 words in memory order (64-bit elements give two words,
    narrower ones are widened)."""
    flat = flat_int(t)
    if flat.element_size() == 8:
        return flat.view(torch.int32)
    return flat if flat.dtype == torch.int32 else flat.to(torch.int32)


def tensors_of(batch: Any) -> list[torch.Tensor]:
    """Every leaf of a batch the checksums see, as a tensor: tensors (sparse ones densified),
    numeric numpy arrays, and Python scalars and strings (as their values' bytes)."""
    kind = type(batch)
    if kind is tuple or kind is list or (kind is dict and all(type(k) is str for k in batch)):
        # the usual batch: plain dense tensors in a list, a tuple or a dict, in the walk's order
        flat = list(batch) if kind is not dict else [batch[k] for k in sorted(batch)]
        if all(type(t) is torch.Tensor and t.layout == torch.strided for t in flat):
            return flat
    out = []
    for _, leaf in batchtree.leaves(batch):
        t = _as_tensor(leaf)
        if t is not None:
            out.append(t)
    return out


def _as_tensor(leaf: object) -> torch.Tensor | None:
    if isinstance(leaf, torch.Tensor):
        return dense(leaf)
    if isinstance(leaf, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(leaf)) if leaf.dtype.kind in "biufc" else None
    if isinstance(leaf, bool):
        return torch.tensor([int(leaf)], dtype=torch.uint8)
    if isinstance(leaf, int):
        return torch.tensor([leaf % 2**64 - (2**64 if leaf % 2**64 >= 2**63 else 0)], dtype=torch.int64)
    if isinstance(leaf, float):
        return torch.tensor([leaf], dtype=torch.float64)
    if isinstance(leaf, (str, bytes)):
        data = leaf.encode() if isinstance(leaf, str) else leaf
        return torch.tensor(list(data) or [0], dtype=torch.uint8)
    return None


def contents_checksum(batch: object) -> torch.Tensor | None:
    """The order-free checksum of a batch's samples (``BATCH_CONTENTS``): the same for the
    same rows in any order, on any device."""
    tensors = tensors_of(batch)
    if not tensors:
        return None
    if all(t.device.type == "cpu" for t in tensors):  # the same arithmetic in numpy, without torch's per-op cost
        return torch.tensor(cpu_contents(tensors), dtype=torch.int64)
    return device_contents(tensors)


def device_contents(tensors: list[torch.Tensor]) -> torch.Tensor:
    """``contents_checksum`` in torch ops, on the tensors' devices (the reference arithmetic),
    as a 0-d int64 on the first tensor's device: no copy to the host, so no wait for the
    device (int64 wraps modulo 2**64, which keeps the value modulo 2**32 exact)."""
    total = None
    with no_fill():
        for i, t in enumerate(tensors):
            rows = _words(t).reshape(t.shape[0] if t.dim() > 0 and t.shape[0] > 0 else 1, -1)
            sums = (rows.to(torch.int64) * _position_weights(rows.shape[1], rows.device).to(torch.int64)).sum(dim=1)
            part = (_mixed(sums).sum() % 2**32) * (2 * i + 1)
            total = part if total is None else total + part.to(total.device)  # on the device: no sync per step
    return total
