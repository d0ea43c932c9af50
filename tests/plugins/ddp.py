"""Plugins for ``--world-size N`` (test-only), as people write them for DDP: a correct one,
and its twin with the two mistakes made most often (one run of it shows both).

- ``sharded``: BatchNorm, dropout, a seeded DistributedSampler through ``ctx.shuffling``.
- ``careless``: the same with ``broadcast_buffers=False`` (a common speed-up: each rank keeps
  the BatchNorm statistics of its own shard, so the replicas' buffers part), and its sampler
  wrapped in a batch sampler of its own that does not pass ``set_epoch`` on (every epoch
  visits the samples in the same order).
- ``forgets_the_epoch``: one process, a ``DistributedSampler`` (as code written for several
  ranks keeps at one) inside that batch sampler: every epoch repeats the first's order.
- ``unsharded``: a plain shuffling loader at any world size (no ``DistributedSampler``): every
  rank trains on all the data, the same batches as rank 0.
- ``stalls``: a step that hangs, so the run times out (every rank must be stopped).

Small: 32 samples, 4 per batch, so two ranks take 4 batches each per epoch.
"""

from __future__ import annotations

from typing import Any, Iterator

import torch
from torch import nn

from reproci import ModelContext, TrainSetup

FEATURES, BATCH, SAMPLES = 8, 4, 32


def _data(seed: int) -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(SAMPLES, FEATURES, generator=g)
    return torch.utils.data.TensorDataset(x, x[:, :1] * 2 + 0.1)


def _mse(m: nn.Module, b: Any) -> torch.Tensor:
    return nn.functional.mse_loss(m(b[0]), b[1])


def _setup(ctx: ModelContext, loader: Any, loss_fn: Any = _mse, **kw: Any) -> TrainSetup:
    model = nn.Sequential(nn.Linear(FEATURES, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.1), nn.Linear(16, 1))
    return TrainSetup(model=model.to(ctx.device), optimizer=torch.optim.SGD(model.parameters(), lr=0.05),
                      loader=loader, loss_fn=loss_fn, batch_size=BATCH, **kw)


def sharded(ctx: ModelContext) -> TrainSetup:
    data = _data(ctx.seed)
    loader = torch.utils.data.DataLoader(data, batch_size=BATCH, **ctx.shuffling(data), generator=ctx.generator())
    return _setup(ctx, loader)


def unsharded(ctx: ModelContext) -> TrainSetup:
    data = _data(ctx.seed)
    return _setup(ctx, torch.utils.data.DataLoader(data, batch_size=BATCH, shuffle=True, generator=ctx.generator()))


class Batches(torch.utils.data.Sampler):
    """Groups another sampler's indices into batches; has no ``set_epoch`` (the bug)."""

    def __init__(self, sampler: torch.utils.data.Sampler, size: int) -> None:
        self.sampler, self.size = sampler, size

    def __iter__(self) -> Iterator[list[int]]:
        batch: list[int] = []
        for i in self.sampler:
            batch.append(i)
            if len(batch) == self.size:
                yield batch
                batch = []

    def __len__(self) -> int:
        return len(self.sampler) // self.size  # type: ignore[arg-type]


def careless(ctx: ModelContext) -> TrainSetup:
    data = _data(ctx.seed)
    sampler = ctx.shuffling(data).get("sampler") or torch.utils.data.RandomSampler(data, generator=ctx.generator())
    return _setup(ctx, torch.utils.data.DataLoader(data, batch_sampler=Batches(sampler, BATCH)),
                  ddp_options={"broadcast_buffers": False})


def forgets_the_epoch(ctx: ModelContext) -> TrainSetup:
    data = _data(ctx.seed)
    sampler = torch.utils.data.DistributedSampler(data, num_replicas=1, rank=0, shuffle=True, seed=ctx.seed)
    return _setup(ctx, torch.utils.data.DataLoader(data, batch_sampler=Batches(sampler, BATCH)))


def stalls(ctx: ModelContext) -> TrainSetup:
    """A step that never ends in time (a hung collective, a deadlock): the run times out."""
    import time

    def loss(m: nn.Module, b: Any) -> torch.Tensor:
        open(f"stalled.rank{ctx.rank}", "w").close()  # in the run's directory: this rank got here
        time.sleep(120)
        return _mse(m, b)

    return _setup(ctx, [(torch.ones(BATCH, FEATURES), torch.ones(BATCH, 1))], loss_fn=loss)
