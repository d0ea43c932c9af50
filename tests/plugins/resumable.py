"""Plugin models of the kind people really write, each a correct version beside a buggy twin
(test-only). Small on purpose: 4 batches per epoch, so a 10-step run crosses two epoch
boundaries and a resume point can fall in the first epoch, on a boundary or in a later one.
"""

from __future__ import annotations

import random

import numpy as np
import torch
from torch import nn

from reproci import ModelContext, TrainSetup

FEATURES, BATCH, SAMPLES = 8, 4, 16  # 4 batches per epoch


def _data(seed: int, n: int = SAMPLES) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, FEATURES, generator=g)
    return x, x[:, :1] * 2 + 0.1


def _model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Dropout(0.1), nn.Linear(16, 1))


def _mse(m: nn.Module, b) -> torch.Tensor:
    return nn.functional.mse_loss(m(b[0]), b[1])


def _setup(ctx: ModelContext, loader, model: nn.Module | None = None, **kw) -> TrainSetup:
    model = model if model is not None else _model(ctx.seed)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    return TrainSetup(model=model, optimizer=opt, loader=loader, loss_fn=kw.pop("loss_fn", _mse), batch_size=BATCH, **kw)


# -- a map-style dataset that augments with a private numpy Generator ------------------------

class NoisyDataset(torch.utils.data.Dataset):
    """Augmentation from its own ``numpy.random.Generator``: advances once per sample fetched."""

    def __init__(self, seed: int, n: int = SAMPLES) -> None:
        self.x, self.y = _data(seed, n)
        self.rng = np.random.default_rng(seed + 7)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        noise = torch.from_numpy(self.rng.normal(0.0, 0.05, FEATURES).astype(np.float32))
        return self.x[i] + noise, self.y[i]


def _noisy_loader(ctx: ModelContext, ds: NoisyDataset, **kw) -> torch.utils.data.DataLoader:
    return torch.utils.data.DataLoader(ds, batch_size=BATCH, shuffle=True, generator=ctx.generator(), **kw)


def dataset_rng_exposed(ctx: ModelContext) -> TrainSetup:
    """Exposes the dataset's generator through extra state: resume is exact at every step."""
    ds = NoisyDataset(ctx.seed)
    return _setup(ctx, _noisy_loader(ctx, ds),
                  get_extra_state=lambda: {"rng": ds.rng.bit_generator.state},
                  set_extra_state=lambda s: setattr(ds.rng.bit_generator, "state", s["rng"]))


def dataset_rng_hidden(ctx: ModelContext) -> TrainSetup:
    """The same dataset with its generator left out of the checkpoint: resume replays the wrong noise."""
    return _setup(ctx, _noisy_loader(ctx, NoisyDataset(ctx.seed)))


def dataset_rng_exposed_ragged(ctx: ModelContext) -> TrainSetup:
    """18 samples in batches of 4, last batch kept (drop_last off): 5 batches an epoch, one of 2."""
    ds = NoisyDataset(ctx.seed, n=18)
    return _setup(ctx, _noisy_loader(ctx, ds, drop_last=False),
                  get_extra_state=lambda: {"rng": ds.rng.bit_generator.state},
                  set_extra_state=lambda s: setattr(ds.rng.bit_generator, "state", s["rng"]))


# -- augmentation in two worker processes, order from the loader generator -------------------

class WorkerAugmented(torch.utils.data.Dataset):
    """Noise from torch's RNG of whichever worker process fetches the sample."""

    def __init__(self, seed: int) -> None:
        self.x, self.y = _data(seed)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i] + 0.05 * torch.randn(FEATURES), self.y[i]


def worker_augmented(ctx: ModelContext) -> TrainSetup:
    loader = torch.utils.data.DataLoader(WorkerAugmented(ctx.seed), batch_size=BATCH, shuffle=True, num_workers=2,
                                         worker_init_fn=ctx.seed_worker, generator=ctx.generator())
    return _setup(ctx, loader)


# -- a sampler that seeds itself and keeps its own position ----------------------------------

class ResumableSampler(torch.utils.data.Sampler[int]):
    """Order from its own seed and the epoch (``set_epoch``, as DistributedSampler users
    expect), and a cursor of consumed samples that its state exposes."""

    def __init__(self, n: int, seed: int) -> None:
        self.n, self.seed, self.epoch, self.cursor = n, seed, 0, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        order = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed + self.epoch)).tolist()
        while self.cursor < self.n:
            self.cursor += 1
            yield order[self.cursor - 1]
        self.cursor = 0

    def __len__(self) -> int:
        return self.n


def own_sampler(ctx: ModelContext) -> TrainSetup:
    """No loader generator: the sampler seeds itself (accepted by the contract)."""
    sampler = ResumableSampler(SAMPLES, ctx.seed)
    x, y = _data(ctx.seed)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=BATCH, sampler=sampler)
    return _setup(ctx, loader, get_extra_state=lambda: {"cursor": sampler.cursor, "epoch": sampler.epoch},
                  set_extra_state=lambda s: sampler.__dict__.update(cursor=s["cursor"], epoch=s["epoch"]))


class DrawingSampler(torch.utils.data.Sampler[int]):
    """A new permutation each epoch from a private generator that lives across epochs."""

    def __init__(self, n: int, seed: int) -> None:
        self.n, self.rng = n, np.random.default_rng(seed)

    def __iter__(self):
        return iter(self.rng.permutation(self.n).tolist())

    def __len__(self) -> int:
        return self.n


def _drawing(ctx: ModelContext, exposed: bool) -> TrainSetup:
    sampler = DrawingSampler(SAMPLES, ctx.seed)
    x, y = _data(ctx.seed)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=BATCH, sampler=sampler)
    if not exposed:
        return _setup(ctx, loader)
    return _setup(ctx, loader, get_extra_state=lambda: {"rng": sampler.rng.bit_generator.state},
                  set_extra_state=lambda s: setattr(sampler.rng.bit_generator, "state", s["rng"]))


def drawing_sampler_exposed(ctx: ModelContext) -> TrainSetup:
    return _drawing(ctx, exposed=True)


def drawing_sampler_hidden(ctx: ModelContext) -> TrainSetup:
    """Its generator is not in the checkpoint: after the first epoch, a resumed run draws another order."""
    return _drawing(ctx, exposed=False)


# -- an IterableDataset with state: a stream with a private generator ------------------------

class Stream(torch.utils.data.IterableDataset):
    """Yields SAMPLES noisy samples per pass, noise from a generator that lives across passes."""

    def __init__(self, seed: int) -> None:
        self.x, self.y = _data(seed)
        self.gen = torch.Generator().manual_seed(seed + 11)

    def __iter__(self):
        for i in torch.randperm(SAMPLES, generator=self.gen).tolist():
            yield self.x[i] + 0.05 * torch.randn(FEATURES, generator=self.gen), self.y[i]


def _stream(ctx: ModelContext, exposed: bool) -> TrainSetup:
    ds = Stream(ctx.seed)
    loader = torch.utils.data.DataLoader(ds, batch_size=BATCH)
    if not exposed:
        return _setup(ctx, loader)
    return _setup(ctx, loader, get_extra_state=lambda: {"gen": ds.gen.get_state()},
                  set_extra_state=lambda s: ds.gen.set_state(s["gen"]))


def stream_exposed(ctx: ModelContext) -> TrainSetup:
    return _stream(ctx, exposed=True)


def stream_hidden(ctx: ModelContext) -> TrainSetup:
    return _stream(ctx, exposed=False)


# -- initialisation -------------------------------------------------------------------------

def _init_from(g: torch.Generator) -> nn.Module:
    model = nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Linear(16, 1))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2, generator=g)
    return model


def _plain_loader(ctx: ModelContext):
    x, y = _data(ctx.seed)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=BATCH, shuffle=True,
                                       generator=ctx.generator())


def unseeded_init(ctx: ModelContext) -> TrainSetup:
    """Weights drawn from a generator seeded from the OS: every run starts elsewhere."""
    g = torch.Generator()
    g.seed()
    return _setup(ctx, _plain_loader(ctx), model=_init_from(g))


def seeded_init(ctx: ModelContext) -> TrainSetup:
    return _setup(ctx, _plain_loader(ctx), model=_init_from(torch.Generator().manual_seed(ctx.seed)))


# -- rows of a batch assembled in a run-dependent order --------------------------------------

def _collate(shuffle_rows: bool):
    def collate(samples):
        if shuffle_rows:  # as a thread pool that assembles a batch in completion order would
            samples = list(samples)
            random.SystemRandom().shuffle(samples)
        return torch.stack([s[0] for s in samples]), torch.stack([s[1] for s in samples])
    return collate


def _rows(ctx: ModelContext, shuffle_rows: bool) -> TrainSetup:
    x, y = _data(ctx.seed)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=BATCH, shuffle=True,
                                         generator=ctx.generator(), collate_fn=_collate(shuffle_rows))

    def loss(m: nn.Module, b) -> torch.Tensor:  # per-row weights: the row order matters to the result
        w = torch.arange(1, b[0].shape[0] + 1, dtype=b[0].dtype, device=b[0].device).unsqueeze(1)
        return (w * (m(b[0]) - b[1]) ** 2).mean()
    return _setup(ctx, loader, loss_fn=loss)


def rows_in_completion_order(ctx: ModelContext) -> TrainSetup:
    return _rows(ctx, shuffle_rows=True)


def rows_in_order(ctx: ModelContext) -> TrainSetup:
    return _rows(ctx, shuffle_rows=False)


# -- determinism controls switched off by the model's own code ------------------------------

def flags_off_in_factory(ctx: ModelContext) -> TrainSetup:
    torch.use_deterministic_algorithms(False)  # as some libraries do on import or set-up
    return _setup(ctx, _plain_loader(ctx))


def _benchmark_in_forward(m: nn.Module, b) -> torch.Tensor:
    torch.backends.cudnn.benchmark = True  # "autotune for speed", as some training libraries do
    return nn.functional.mse_loss(m(b[0]), b[1])


def flags_off_in_forward(ctx: ModelContext) -> TrainSetup:
    """Library-style code in the step itself switches cuDNN benchmark mode on."""
    return _setup(ctx, _plain_loader(ctx), loss_fn=_benchmark_in_forward)


def flags_untouched(ctx: ModelContext) -> TrainSetup:
    return _setup(ctx, _plain_loader(ctx))


def persistent_workers(ctx: ModelContext) -> TrainSetup:
    """Augmentation in 2 worker processes that live across epochs: their RNG carries over."""
    loader = torch.utils.data.DataLoader(WorkerAugmented(ctx.seed), batch_size=BATCH, shuffle=True, num_workers=2,
                                         persistent_workers=True, worker_init_fn=ctx.seed_worker,
                                         generator=ctx.generator())
    return _setup(ctx, loader)
