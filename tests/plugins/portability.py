"""Plugin models with the hidden dependencies the portability probes look for, as users
write them, each beside a fixed twin (test-only).

``leaky``: a vocabulary numbered in ``set()`` order (PYTHONHASHSEED), data shards read in
``os.listdir`` order, augmentation in DataLoader workers from their own RNG streams
(num_workers), and a sampler that re-seeds itself every epoch (the same order each epoch).
``clean``: the same model with sorted vocabulary and shards, no worker randomness, and a
sampler that follows ``set_epoch``.

``pooled`` / ``pooled_clean``: adaptive average pooling, which strict mode refuses on CUDA
(no deterministic backward kernel), and its fixed twin with a plain average pool.
"""

from __future__ import annotations

import os
import tempfile

import torch
from torch import nn

from reproci import ModelContext, TrainSetup

WORDS = [f"w{i}" for i in range(40)]


class Shards(torch.utils.data.Dataset):
    """Token sequences from shard files; with ``noisy``, a random token swap per fetch."""

    def __init__(self, ctx: ModelContext, *, sort: bool, noisy: bool) -> None:
        words = sorted(set(WORDS)) if sort else list(set(WORDS))  # set order follows the hash seed
        self.vocab = {w: i for i, w in enumerate(words)}
        g = torch.Generator().manual_seed(ctx.seed)
        with tempfile.TemporaryDirectory(prefix="reproci-shards-") as folder:
            for s in range(4):
                picks = torch.randint(len(WORDS), (16, 6), generator=g)
                with open(os.path.join(folder, f"shard-{s}.txt"), "w") as f:
                    f.write("\n".join(" ".join(WORDS[i] for i in row) for row in picks.tolist()))
            names = sorted(os.listdir(folder)) if sort else os.listdir(folder)
            lines = [line for n in names for line in open(os.path.join(folder, n)).read().splitlines()]
        self.rows = torch.tensor([[self.vocab[w] for w in line.split()] for line in lines])  # (64, 6)
        self.noisy = noisy

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.rows[i].clone()
        if self.noisy:
            j = int(torch.randint(6, (1,)))  # this process's torch RNG: per worker with num_workers > 0
            x[j] = 0
        return x, (x.sum() % 2).float().reshape(1)


class EpochSampler(torch.utils.data.Sampler):
    """Shuffles by seed; ``reseeds`` forgets the epoch (the same order every epoch)."""

    def __init__(self, n: int, seed: int, *, reseeds: bool) -> None:
        self.n, self.seed, self.epoch, self.reseeds = n, seed, 0, reseeds

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed if self.reseeds else self.seed * 1000 + self.epoch)
        return iter(torch.randperm(self.n, generator=g).tolist())

    def __len__(self) -> int:
        return self.n


class Bag(nn.Module):
    """Token embeddings, a 2-d convolution over them (leaky: its CPU backward splits the
    batch over threads) and their mean, then 16 logits per sample: a matrix product
    (``nn.Linear``, whose kernel depends on the batch size) or, with ``invariant``, an
    elementwise product and a sum per sample (the same bits whatever the batch)."""

    def __init__(self, vocab: int, *, invariant: bool) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, 64)
        self.conv = None if invariant else nn.Conv2d(1, 8, 3, padding=1)
        self.head = nn.Linear(64, 16)
        self.invariant = invariant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.emb(x)  # (B, T, 64)
        if self.conv is not None:
            h = self.conv(h.unsqueeze(1)).mean(dim=1)  # (B, 8, T, 64) -> (B, T, 64)
        h = h.mean(dim=1)  # (B, 64)
        if self.invariant:
            return (h.unsqueeze(1) * self.head.weight).sum(dim=2) + self.head.bias  # (B, 16)
        return self.head(h)  # (B, 16)


def _loss(m: nn.Module, b: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return nn.functional.binary_cross_entropy_with_logits(m(b[0]).mean(dim=1, keepdim=True), b[1])


def _text(ctx: ModelContext, *, clean: bool) -> TrainSetup:
    data = Shards(ctx, sort=clean, noisy=not clean)
    sampler = EpochSampler(len(data), ctx.seed, reseeds=not clean)
    loader = torch.utils.data.DataLoader(data, batch_size=16, sampler=sampler, num_workers=0 if clean else 2,
                                         generator=ctx.generator(), worker_init_fn=ctx.seed_worker)
    torch.manual_seed(ctx.seed)
    model = Bag(len(WORDS), invariant=clean)
    return TrainSetup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), loader=loader,
                      loss_fn=_loss, batch_size=16)


def leaky(ctx: ModelContext) -> TrainSetup:
    return _text(ctx, clean=False)


def clean(ctx: ModelContext) -> TrainSetup:
    return _text(ctx, clean=True)


class Gain(nn.Module):
    """A learned gain per channel, so the pooling's backward runs."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(3, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight


def _pooled(ctx: ModelContext, pool: nn.Module) -> TrainSetup:
    model = nn.Sequential(Gain(), pool, nn.Flatten(), nn.Linear(3 * 2 * 2, 2))
    g = torch.Generator().manual_seed(ctx.seed)
    x, y = torch.randn(64, 3, 8, 8, generator=g), torch.randint(2, (64,), generator=g)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16, shuffle=True,
                                         generator=ctx.generator())
    return TrainSetup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), loader=loader,
                      loss_fn=lambda m, b: nn.functional.cross_entropy(m(b[0]), b[1]))


def pooled(ctx: ModelContext) -> TrainSetup:
    """Adaptive pooling to 2×2: no deterministic CUDA backward."""
    return _pooled(ctx, nn.AdaptiveAvgPool2d((2, 2)))


def pooled_clean(ctx: ModelContext) -> TrainSetup:
    """The same pooling as a fixed 4×4 average pool: deterministic on CUDA."""
    return _pooled(ctx, nn.AvgPool2d(4))
