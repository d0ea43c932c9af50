"""Plugins written the way people write training code with plain torch (test-only): batch
types torch's collate keeps, state that is replaced rather than updated in place, sparse
gradients, samplers of their own. Each correct one must PASS; the buggy ones are named.

- ``namedtuple_batch`` / ``dataclass_batch``: batches that are a namedtuple (``default_collate``
  keeps them) and a dataclass (a collate function of the user's).
- ``running_stats``: a buffer reassigned every step (``self.mean = 0.9 * self.mean + ...``).
- ``sparse_embedding``: ``nn.Embedding(sparse=True)`` trained by ``SparseAdam``.
- ``own_batch_sampler``: a batch sampler that seeds itself, with its generator under ``.rng``,
  and two loader workers.
- ``clock_order``: a sampler seeded from the wall clock, to the second (the bug).
- ``long_epoch``: 40 batches an epoch, more than a short run takes.
"""

from __future__ import annotations

import collections
import dataclasses
import random
import time
from typing import Any, Iterator

import torch
from torch import nn

from reproci import ModelContext, TrainSetup

FEATURES, BATCH, SAMPLES = 8, 4, 16  # 4 batches an epoch

Sample = collections.namedtuple("Sample", "x y")


@dataclasses.dataclass
class Batch:
    x: torch.Tensor
    y: torch.Tensor
    source: str = "synthetic"


def _tensors(seed: int, n: int = SAMPLES) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, FEATURES, generator=g)
    return x, x[:, :1] * 2 + 0.1


class Samples(torch.utils.data.Dataset):
    """Each item a ``Sample`` namedtuple."""

    def __init__(self, seed: int, n: int = SAMPLES) -> None:
        self.x, self.y = _tensors(seed, n)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> Sample:
        return Sample(self.x[i], self.y[i])


def _model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Dropout(0.1), nn.Linear(16, 1))


def _setup(ctx: ModelContext, loader: Any, model: nn.Module | None = None, loss_fn: Any = None, **kw: Any) -> TrainSetup:
    model = model if model is not None else _model(ctx.seed)
    opt = kw.pop("optimizer", None) or torch.optim.Adam(model.parameters(), lr=1e-2)
    loss_fn = loss_fn or (lambda m, b: nn.functional.mse_loss(m(b.x), b.y))
    return TrainSetup(model=model, optimizer=opt, loader=loader, loss_fn=loss_fn, batch_size=BATCH, **kw)


def namedtuple_batch(ctx: ModelContext) -> TrainSetup:
    data = Samples(ctx.seed)
    return _setup(ctx, torch.utils.data.DataLoader(data, batch_size=BATCH, shuffle=True, generator=ctx.generator()))


def _as_batch(items: list[Sample]) -> Batch:
    return Batch(torch.stack([s.x for s in items]), torch.stack([s.y for s in items]))


def dataclass_batch(ctx: ModelContext) -> TrainSetup:
    data = Samples(ctx.seed)
    return _setup(ctx, torch.utils.data.DataLoader(data, batch_size=BATCH, shuffle=True, generator=ctx.generator(),
                                                   collate_fn=_as_batch))


class RunningNorm(nn.Module):
    """Normalises by running statistics, kept as buffers that are reassigned, not updated in place."""

    def __init__(self, features: int) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(features))
        self.register_buffer("var", torch.ones(features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.mean = 0.9 * self.mean + 0.1 * x.detach().mean(0)
            self.var = 0.9 * self.var + 0.1 * x.detach().var(0)
        return (x - self.mean) / (self.var + 1e-5).sqrt()


def running_stats(ctx: ModelContext) -> TrainSetup:
    torch.manual_seed(ctx.seed)
    model = nn.Sequential(RunningNorm(FEATURES), nn.Linear(FEATURES, 16), nn.ReLU(), nn.Linear(16, 1))
    data = Samples(ctx.seed)
    return _setup(ctx, torch.utils.data.DataLoader(data, batch_size=BATCH, shuffle=True, generator=ctx.generator()),
                  model=model)


VOCAB = 32


class Clicks(torch.utils.data.Dataset):
    def __init__(self, seed: int, n: int = SAMPLES) -> None:
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, VOCAB, (n, 3), generator=g)
        self.y = (self.ids.sum(1, keepdim=True) % 2).float()

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.ids[i], self.y[i]


def sparse_embedding(ctx: ModelContext) -> TrainSetup:
    """An embedding with sparse gradients, its rows read by a fixed projection."""
    torch.manual_seed(ctx.seed)
    emb = nn.Embedding(VOCAB, 4, sparse=True)
    head = torch.randn(4, 1)
    data = Clicks(ctx.seed)
    loader = torch.utils.data.DataLoader(data, batch_size=BATCH, shuffle=True, generator=ctx.generator())
    return TrainSetup(model=emb, optimizer=torch.optim.SparseAdam(emb.parameters(), lr=1e-2), loader=loader,
                      loss_fn=lambda m, b: nn.functional.mse_loss(m(b[0]).sum(1) @ head, b[1]), batch_size=BATCH)


class SeededBatches(torch.utils.data.Sampler):
    """A batch sampler of its own: shuffles with a generator it keeps under ``.rng``."""

    def __init__(self, n: int, size: int, seed: int) -> None:
        self.n, self.size = n, size
        self.rng = torch.Generator().manual_seed(seed)

    def __iter__(self) -> Iterator[list[int]]:
        order = torch.randperm(self.n, generator=self.rng).tolist()
        for i in range(0, self.n, self.size):
            yield order[i:i + self.size]

    def __len__(self) -> int:
        return (self.n + self.size - 1) // self.size


def own_batch_sampler(ctx: ModelContext) -> TrainSetup:
    """Its generator is private state: a trainer's checkpoint does not hold it, so a resume in
    a later epoch draws another order (the state census names ``loader.batch_sampler.rng``)."""
    data = Samples(ctx.seed)
    loader = torch.utils.data.DataLoader(data, batch_sampler=SeededBatches(len(data), BATCH, ctx.seed), num_workers=2,
                                         worker_init_fn=ctx.seed_worker)
    return _setup(ctx, loader)


def own_batch_sampler_exposed(ctx: ModelContext) -> TrainSetup:
    """The same batch sampler, its generator's state returned from get_extra_state."""
    data = Samples(ctx.seed)
    batches = SeededBatches(len(data), BATCH, ctx.seed)
    loader = torch.utils.data.DataLoader(data, batch_sampler=batches, num_workers=2, worker_init_fn=ctx.seed_worker)
    setup = _setup(ctx, loader)
    setup.get_extra_state = lambda: {"order_rng": batches.rng.get_state()}
    setup.set_extra_state = lambda s: batches.rng.set_state(s["order_rng"])
    return setup


class ClockOrder(torch.utils.data.Sampler):
    """Shuffles from a ``random.Random`` seeded with the current second (the bug)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.rng = random.Random(int(time.time()))

    def __iter__(self) -> Iterator[int]:
        order = list(range(self.n))
        self.rng.shuffle(order)
        return iter(order)

    def __len__(self) -> int:
        return self.n


def clock_order(ctx: ModelContext) -> TrainSetup:
    data = Samples(ctx.seed)
    return _setup(ctx, torch.utils.data.DataLoader(data, batch_size=BATCH, sampler=ClockOrder(len(data))))


def long_epoch(ctx: ModelContext) -> TrainSetup:
    data = Samples(ctx.seed, n=40 * BATCH)
    return _setup(ctx, torch.utils.data.DataLoader(data, batch_size=BATCH, shuffle=True, generator=ctx.generator()))
