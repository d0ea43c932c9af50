"""A shuffling loader that repeats its order: a forgotten ``set_epoch``, or a shuffle re-seeded
each epoch.

A ``DistributedSampler`` (and any sampler seeded per epoch) draws each epoch's order from
``seed + epoch``: without ``set_epoch`` every epoch visits the samples in the same order;
so does a sampler that seeds a fresh generator in each ``__iter__``. Checked at every world
size, from run A's record.
The harness calls ``set_epoch`` on the loader, its sampler, batch sampler and dataset, but
not on a sampler wrapped inside a custom batch sampler. The worker records the epoch of
every step's batch beside the batch's checksum (row-order sensitive); two consecutive
epochs that start with the same batches, from a loader that says it shuffles, repeated
their order. Batches that are augmented at random differ anyway and hide a repeat: this
check names what it sees and is silent otherwise.
"""

from __future__ import annotations

from typing import Any

from ...worker.run_record import RunRecord
from ..runs import repeated

COMPARED = 2  # first batches of each epoch compared: enough to tell two permutations apart


def first_batches(record: RunRecord) -> dict[int, list[Any]]:
    """Epoch -> the checksums of its first batches, in the order the run took them."""
    out: dict[int, list[Any]] = {}
    for epoch, checksum in zip(record.batch_epochs, record.batch_fingerprints):
        batches = out.setdefault(epoch, [])
        if len(batches) < COMPARED:
            batches.append(checksum)
    return out


def repeated_order(record: RunRecord) -> str | None:
    """'epoch 2 visits the samples in the same order as epoch 1: ...' for a shuffling loader
    whose consecutive epochs start alike, else None."""
    if not (record.loader or {}).get("shuffles"):
        return None
    epochs = first_batches(record)
    for e in sorted(epochs):
        now, after = epochs[e], epochs.get(e + 1)
        n = min(len(now), len(after or []))
        if after and n and now[:n] == after[:n]:
            return repeated(e + 1, f"first {n} batches compared")
    return None
