"""Each step's batch checksums over a run (``batchsum``), kept as cheaply as a step allows.

A run records, for every step, the order-sensitive checksum of its batch and the order-free
checksum of its samples. Both must read the batch as the loader handed it over, before the
step; on the CPU only the order-free checksum's last half (mixing each row's sum and adding
them up) can wait, and it does: the row sums of many steps are mixed together in a few numpy
calls instead of a few calls a step. The values are those of ``batch_checksum`` and
``contents_checksum``, whenever they are computed.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .. import kernels
from ..state.tensor_bits import flat_int
from .batchsum import (
    batch_checksum,
    contents_checksum,
    cpu_checksum,
    device_sums,
    mix_rows,
    np_words,
    row_sums,
    tensors_of,
)

PENDING_ROWS = 1 << 18  # row sums held before they are mixed (1 MiB of int32)


class BatchLog:
    """Per step, in step order: ``checksums`` (order-sensitive) and ``contents`` (order-free,
    modulo 2**32), each a Python int (a CPU batch) or a 0-d tensor on the batch's device (no
    sync per step). Read them through ``values``."""

    def __init__(self) -> None:
        self.checksums: list[int | torch.Tensor] = []
        self.contents: list[int | torch.Tensor] = []
        self._pending: list[tuple[int, tuple[np.ndarray, np.ndarray]]] = []  # (step's slot, its row sums)
        self._rows = 0
        self._fused: kernels.BatchSums | None = None  # on a GPU with Triton
        self._device_rows: list[tuple[int, torch.Tensor]] = []  # (step's slot, its row of kernels.BatchSums)

    def __len__(self) -> int:
        return len(self.checksums)

    def add(self, batch: Any) -> None:
        """The checksums of the batch of the next step."""
        if type(batch).__name__ == "Accumulated":  # the samples of all of a step's micro-batches, as one multiset
            parts = [c for c in (contents_checksum(b) for b in batch) if c is not None]
            self._append(batch_checksum(batch), sum(parts, torch.zeros((), dtype=torch.int64)) % 2**32)
            return
        tensors = tensors_of(batch)
        if not tensors:
            self._append(None, None)
            return
        device = tensors[0].device
        if kernels.usable(device) and all(t.device == device for t in tensors):  # a few launches, however many tensors
            words = [_unwidened_words(t) for t in tensors]
            if kernels.batch_usable(words):
                if self._fused is None:
                    self._fused = kernels.BatchSums(device)
                rows = [t.shape[0] if t.dim() > 0 and t.shape[0] > 0 else 1 for t in tensors]
                self._append(0, 0)
                self._device_rows.append((len(self.contents) - 1, self._fused.add(words, rows)))
                return
        if all(t.device.type == "cpu" for t in tensors):  # numpy arithmetic, the same values
            words = [np_words(t) for t in tensors]
            self._append(cpu_checksum(tensors, words), 0)
            sums = row_sums(tensors, words)
            self._pending.append((len(self.contents) - 1, sums))
            self._rows += sums[0].size
            if self._rows >= PENDING_ROWS:
                self._mix()
        else:
            checksum, contents = device_sums(tensors)
            self._append(checksum, contents % 2**32)

    def values(self) -> tuple[list[int], list[int]]:
        """Both lists as ints (a device's values in one copy)."""
        self._mix()
        return _ints(self.checksums), _ints(self.contents)

    def _append(self, checksum: int | torch.Tensor | None, contents: int | torch.Tensor | None) -> None:
        self.checksums.append(0 if checksum is None else checksum)
        self.contents.append(0 if contents is None else contents)

    def _mix(self) -> None:
        if self._device_rows:
            for (slot, _), (checksum, contents) in zip(self._device_rows,
                                                       kernels.batch_values([r for _, r in self._device_rows])):
                self.checksums[slot], self.contents[slot] = checksum, contents
            self._device_rows = []
        if self._pending:
            for (slot, _), value in zip(self._pending, mix_rows([sums for _, sums in self._pending])):
                self.contents[slot] = value % 2**32
            self._pending, self._rows = [], 0


def _unwidened_words(t: torch.Tensor) -> torch.Tensor:
    """``batchsum._words`` without widening: the kernels widen narrow elements as they read them."""
    flat = flat_int(t)
    return flat.view(torch.int32) if flat.element_size() == 8 else flat


def _ints(per_step: list[int | torch.Tensor]) -> list[int]:
    where = [i for i, v in enumerate(per_step) if isinstance(v, torch.Tensor)]
    tensors = [v for v in per_step if isinstance(v, torch.Tensor)]
    out = list(per_step)
    if where:
        for i, v in zip(where, torch.stack([t.cpu() for t in tensors]).tolist()):
            out[i] = v
    return out
