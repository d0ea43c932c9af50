"""Two portability probes that need no second run (``reproci/stages/probes/``): does
each epoch visit the samples in a new order, and is a sample's output the same alone as
inside a batch? Both look at the plugin's own loader and model, fresh from its factory,
before any training step. (Worker side: stdlib and torch only.)"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any, Iterator, TypedDict

import torch

from .contract import TrainSetup
from .data import batchtree
from .data import loader as loader_mod
from .data.batchsum import batch_checksum
from .data.batchtree import to_device

FIRST_BATCHES = 16  # batches compared per epoch: enough to tell one order from another


@contextlib.contextmanager
def _sampled_indices(out: list[Any]) -> Iterator[None]:
    """Every index batch a DataLoader draws from its (batch) sampler, in this process."""
    cls = torch.utils.data.dataloader._BaseDataLoaderIter
    original = cls._next_index

    def recording(self: Any) -> Any:
        index = original(self)
        out.append(index.tolist() if isinstance(index, torch.Tensor) else index)
        return index

    cls._next_index = recording
    try:
        yield
    finally:
        cls._next_index = original


def _flat(batches: list[Any]) -> list[Any]:
    out: list[Any] = []
    for b in batches:
        out.extend(b if isinstance(b, (list, tuple)) else [b])
    return out


class _Order(TypedDict):
    kind: str  # "indices": a DataLoader's sampled indices were compared; "batches": the batches' checksums
    same: bool  # epoch 1 began as epoch 0 did
    sequential: bool | None  # epoch 0's indices ran in order (None: batches compared)
    batches: int  # batches compared


class EpochOrder(_Order, total=False):
    """The epoch-order probe's finding (``epoch_order``)."""

    first_indices: list[list[Any]]  # indices: the first 8 of epochs 0 and 1


class BatchInvariance(TypedDict, total=False):
    """The batch probe's finding (``batch_invariance``): applicable, and either why not or what differed."""

    applicable: bool
    why: str
    sizes: list[int]  # the batch sizes sample 0 was run in
    differs_at: list[int]  # the sizes at which its output differed from its output alone
    max_abs: float


class Inspection(TypedDict):
    """What ``inspect`` writes: both probes' findings."""

    epoch_order: EpochOrder
    batch: BatchInvariance


def epoch_order(setup: TrainSetup) -> tuple[EpochOrder, Any]:
    """The first batches of epochs 0 and 1, as the harness starts them (``set_epoch``, then
    ``iter``). Returns the finding and the first batch (for the batch probe)."""
    epochs: list[list[Any]] = []
    sums: list[list[int]] = []
    first_batch = None
    for epoch in (0, 1):
        drawn: list[Any] = []
        seen: list[int] = []
        with _sampled_indices(drawn):
            it = loader_mod.begin_epoch(setup, epoch)
            for _, batch in zip(range(FIRST_BATCHES), it):
                first_batch = batch if first_batch is None else first_batch
                s = batch_checksum(batch)
                seen.append(int(s) if s is not None else 0)
            del it  # ends the epoch's worker processes
        epochs.append(drawn[:FIRST_BATCHES])
        sums.append(seen)
    if epochs[0]:  # a DataLoader: compare the sampled indices
        flat = _flat(epochs[0])
        sequential = flat == sorted(flat) and flat == list(range(flat[0], flat[0] + len(flat))) if flat else True
        same = epochs[0] == epochs[1]
        return {"kind": "indices", "same": same, "sequential": sequential, "batches": len(epochs[0]),
                "first_indices": [flat[:8], _flat(epochs[1])[:8]]}, first_batch
    return {"kind": "batches", "same": bool(sums[0]) and sums[0] == sums[1], "sequential": None,
            "batches": len(sums[0])}, first_batch


def _slice(batch: Any, n: int, size: int) -> Any:
    """The first ``n`` samples of a batch of ``size``: every tensor whose first dim is ``size``."""
    return batchtree.apply(batch, lambda t: t[:n] if t.dim() > 0 and t.shape[0] == size else t)


def _batch_size(batch: Any) -> int | None:
    return next((int(t.shape[0]) for _, t in batchtree.leaves(batch) if isinstance(t, torch.Tensor) and t.dim() > 0),
                None)


def _first_row(output: Any, n: int) -> torch.Tensor | None:
    """Row 0 of the model's output for a batch of ``n`` (a tensor, or any structure of them:
    a tuple, an HF ``ModelOutput``)."""
    for _, t in batchtree.leaves(output):
        if isinstance(t, torch.Tensor) and t.dim() > 0 and t.shape[0] == n and t.is_floating_point():
            return t[0].detach().float().cpu()
    return None


def batch_invariance(setup: TrainSetup, batch: Any, device: torch.device) -> BatchInvariance:
    """Sample 0's output (eval mode, no grad) alone, in half the batch and in the whole
    batch: equal bits, or how far apart."""
    size = _batch_size(batch)
    if batch is None or size is None or size < 2:
        return {"applicable": False, "why": "no batch with a leading batch dimension"}
    outputs: dict[int, torch.Tensor] = {}
    captured: list[Any] = []
    handle = setup.model.register_forward_hook(lambda m, a, out: captured.append(out))
    setup.model.eval()
    try:
        with torch.no_grad():
            for n in sorted({1, max(size // 2, 1), size}):
                captured.clear()
                setup.loss_fn(setup.model, to_device(_slice(batch, n, size), device))
                row = _first_row(captured[0], n) if captured else None
                if row is None:
                    return {"applicable": False, "why": "the model's output has no floating row per sample"}
                outputs[n] = row
    except Exception as e:  # noqa: BLE001 - a loss that needs the whole batch: the probe does not apply
        return {"applicable": False, "why": f"the loss failed on a smaller batch ({type(e).__name__}: {e})"[:200]}
    finally:
        handle.remove()
        setup.model.train()
    alone = outputs[1]
    diffs = {n: float((o - alone).abs().max()) for n, o in outputs.items() if n != 1 and not torch.equal(o, alone)}
    return {"applicable": True, "sizes": sorted(outputs), "differs_at": sorted(diffs),
            "max_abs": max(diffs.values()) if diffs else 0.0}


def inspect(setup: TrainSetup, device: torch.device, path: str) -> None:
    """Both probes, written to ``path`` as JSON."""
    order, batch = epoch_order(setup)
    result: Inspection = {"epoch_order": order, "batch": batch_invariance(setup, batch, device)}
    with open(path + ".tmp", "w") as f:
        json.dump(result, f)
    os.replace(path + ".tmp", path)
