"""Plugin models that break reproducibility on purpose, one way each (test-only)."""

from __future__ import annotations

import time

import torch
from torch import nn

from reproci.worker.contract import ModelContext, TrainSetup


def _base(ctx: ModelContext, **kw) -> TrainSetup:
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
    g = torch.Generator().manual_seed(ctx.seed)
    x = torch.randn(256, 8, generator=g)
    y = x[:, :1] * 2
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=32, shuffle=True,
                                         generator=ctx.generator())
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    defaults = dict(model=model, optimizer=opt, loader=loader, loss_fn=lambda m, b: nn.functional.mse_loss(m(b[0]), b[1]))
    defaults.update(kw)
    return TrainSetup(**defaults)


def _noisy_loss(noise: torch.Generator):
    def loss_fn(m: nn.Module, b) -> torch.Tensor:
        x = b[0] + 0.01 * torch.randn(b[0].shape, generator=noise)  # input noise from a private generator
        return nn.functional.mse_loss(m(x), b[1])
    return loss_fn


def private_rng_hidden(ctx: ModelContext) -> TrainSetup:
    """A private generator the checkpoint never sees: resume replays the wrong noise."""
    noise = torch.Generator().manual_seed(ctx.seed + 99)
    return _base(ctx, loss_fn=_noisy_loss(noise))


def private_rng_exposed(ctx: ModelContext) -> TrainSetup:
    """The same model, exposing its generator through extra state: resume is exact."""
    noise = torch.Generator().manual_seed(ctx.seed + 99)
    return _base(ctx, loss_fn=_noisy_loss(noise),
                 get_extra_state=lambda: {"noise": noise.get_state()},
                 set_extra_state=lambda s: noise.set_state(s["noise"]))


def clock_seed(ctx: ModelContext) -> TrainSetup:
    """Draws its noise seed from the clock: every run differs from step 1."""
    noise = torch.Generator().manual_seed(time.time_ns())
    return _base(ctx, loss_fn=_noisy_loss(noise))


class _Tracked(nn.Module):
    """An unused-in-the-loss buffer that drifts by run-dependent noise."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
        self.register_buffer("stat", torch.zeros(4))
        self._jitter = (time.time_ns() % 1000) * 1e-9

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            self.stat += self._jitter
        return self.net(x)


def silent_buffer_drift(ctx: ModelContext) -> TrainSetup:
    """Loss identical in every run, but a buffer drifts: must still fail."""
    model = _Tracked()
    return _base(ctx, model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05))


def not_a_setup(ctx: ModelContext) -> dict:
    """Breaks the contract: returns a dict."""
    return {"model": nn.Linear(1, 1)}


def unseeded_loader(ctx: ModelContext) -> TrainSetup:
    """Breaks the contract: a shuffling DataLoader without a generator."""
    setup = _base(ctx)
    setup.loader = torch.utils.data.DataLoader(setup.loader.dataset, batch_size=32, shuffle=True)
    return setup


def crash_at_step_3(ctx: ModelContext) -> TrainSetup:
    calls = {"n": 0}

    def loss_fn(m, b):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("CUDA error: an illegal memory access was encountered (simulated)")
        return nn.functional.mse_loss(m(b[0]), b[1])

    return _base(ctx, loss_fn=loss_fn)


def hang(ctx: ModelContext) -> TrainSetup:
    def loss_fn(m, b):
        time.sleep(3600)
        return m(b[0]).sum()

    return _base(ctx, loss_fn=loss_fn)


def nan_loss(ctx: ModelContext) -> TrainSetup:
    """A loss that turns NaN at step 3 (a log of a negative number, say): a diverged run."""
    calls = [0]

    def loss_fn(m: nn.Module, b) -> torch.Tensor:
        calls[0] += 1
        loss = nn.functional.mse_loss(m(b[0]), b[1])
        return loss * float("nan") if calls[0] >= 3 else loss
    return _base(ctx, loss_fn=loss_fn)


def allocate_forever(ctx: ModelContext) -> TrainSetup:
    """A loss that keeps every batch's 64 MiB of scratch alive: memory grows without end (a leak)."""
    hoard: list[torch.Tensor] = []

    def loss_fn(m: nn.Module, b) -> torch.Tensor:
        while True:
            hoard.append(torch.ones(16 * 1024 * 1024))  # written, so resident: 64 MiB each
    return _base(ctx, loss_fn=loss_fn)


def fork_forever(ctx: ModelContext) -> TrainSetup:
    """A loss that starts helper processes and never reaps them: processes grow without end."""
    import os

    def loss_fn(m: nn.Module, b) -> torch.Tensor:
        while True:
            if os.fork() == 0:
                time.sleep(3600)
                os._exit(0)
    return _base(ctx, loss_fn=loss_fn)


def fork_forever_retrying(ctx: ModelContext) -> TrainSetup:
    """``fork_forever`` that, refused a process, waits and tries again: it never fails, it waits at
    the process limit until its run times out."""
    import os

    def loss_fn(m: nn.Module, b) -> torch.Tensor:
        while True:
            try:
                if os.fork() == 0:
                    time.sleep(3600)
                    os._exit(0)
            except OSError:
                time.sleep(0.01)
    return _base(ctx, loss_fn=loss_fn)
