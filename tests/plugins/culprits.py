"""Models each nondeterministic for one reason only, as people write them: what the bisection
(``reproci bisect``) must name.

- ``clock_workers``: loader workers that seed their augmentation from the clock;
- ``autocast_rounding``: stochastic rounding to bf16, only under autocast, from an OS-seeded generator;
- ``compiled_jitter``: a "fused" path taken only while compiling, behind a graph break, that
  draws from an OS-seeded ``random.Random``;
- ``urandom_noise``: a step that draws from ``os.urandom`` whatever the settings;
- ``tiny``: deterministic, fast to compile (goldens of compiled runs).
"""

from __future__ import annotations

import os
import random
import time

import numpy as np
import torch
from torch import nn

from reproci import ModelContext, TrainSetup


class Noisy(torch.utils.data.Dataset):
    """Features plus augmentation noise from numpy's global RNG (in a worker: the worker's)."""

    def __init__(self, n: int = 64) -> None:
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(n, 8, generator=g), torch.randn(n, 1, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        jitter = torch.from_numpy(np.random.normal(0.0, 0.01, size=8).astype(np.float32))
        return self.x[i] + jitter, self.y[i]


def _seed_from_clock(worker_id: int) -> None:
    np.random.seed((time.time_ns() + worker_id) % 2**32)  # "different noise in every worker"


def _loader(ctx: ModelContext, workers: int = 0, **kw: object) -> torch.utils.data.DataLoader:
    return torch.utils.data.DataLoader(Noisy(), batch_size=8, shuffle=True, generator=ctx.generator(),
                                       num_workers=workers, **kw)


def _setup(ctx: ModelContext, model: nn.Module, loader: torch.utils.data.DataLoader) -> TrainSetup:
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    return TrainSetup(model=model, optimizer=opt, loader=loader, batch_size=8,
                      loss_fn=lambda m, b: nn.functional.mse_loss(m(b[0]), b[1]))


def clock_workers(ctx: ModelContext) -> TrainSetup:
    torch.manual_seed(ctx.seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    return _setup(ctx, model, _loader(ctx, workers=2, worker_init_fn=_seed_from_clock, persistent_workers=False))


class StochasticRounding(nn.Module):
    """Rounds activations to bf16 stochastically under autocast (unbiased low-precision
    training), with noise from a generator seeded by the OS; in fp32 it is the identity."""

    def __init__(self) -> None:
        super().__init__()
        self.gen = torch.Generator()
        self.gen.seed()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.is_autocast_enabled(x.device.type):
            return x
        x = x.float()  # add up to one bf16 ulp of noise in fp32, then round: up or down by chance
        noise = (torch.rand(x.shape, generator=self.gen) - 0.5).to(x.device)
        return (x + noise * x.abs() * 2.0**-7).to(torch.bfloat16)


def autocast_rounding(ctx: ModelContext) -> TrainSetup:
    torch.manual_seed(ctx.seed)
    model = nn.Sequential(nn.Linear(8, 16), StochasticRounding(), nn.ReLU(), nn.Linear(16, 1))
    return _setup(ctx, model, _loader(ctx))


_jitter_source = random.Random()  # seeded from the OS at import


@torch.compiler.disable
def _fused_jitter(x: torch.Tensor) -> torch.Tensor:
    return x * (1.0 + 1e-3 * _jitter_source.random())


class CompiledJitter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.fc1(x))
        if torch.compiler.is_compiling():  # the compiled path's "fused" scaling: a graph break, unseeded
            h = _fused_jitter(h)
        return self.fc2(h)


def compiled_jitter(ctx: ModelContext) -> TrainSetup:
    torch.manual_seed(ctx.seed)
    return _setup(ctx, CompiledJitter(), _loader(ctx))


class UrandomNoise(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = 1.0 + int.from_bytes(os.urandom(2), "little") / 65536 * 1e-3
        return self.fc(x) * scale


def urandom_noise(ctx: ModelContext) -> TrainSetup:
    torch.manual_seed(ctx.seed)
    return _setup(ctx, UrandomNoise(), _loader(ctx))


def tiny(ctx: ModelContext) -> TrainSetup:
    torch.manual_seed(ctx.seed)
    return _setup(ctx, nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1)), _loader(ctx))


def self_compiled(ctx: ModelContext) -> TrainSetup:
    """A plugin that compiles its own model, as a training script does."""
    setup = tiny(ctx)
    setup.model = torch.compile(setup.model)
    return setup
