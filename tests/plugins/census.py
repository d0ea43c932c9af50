"""Private training state the checkpoint does not hold, where users keep it (test-only): an EMA
updated in ``after_step``, a loss EMA inside a scheduler's lambda, a length-bucketing batch
sampler's ``random.Random``, counters; each buggy model beside a twin that declares the state.

16 samples in batches of 4: 4 batches an epoch, so ``--steps 12 --resume-at 6`` resumes in the
middle of the second epoch.
"""

from __future__ import annotations

import random
from typing import Any, Iterator

import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from reproci import ModelContext, TrainSetup

SAMPLES, BATCH = 16, 4


def _data(seed: int) -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(SAMPLES, 8, generator=g)
    return torch.utils.data.TensorDataset(x, x[:, :1] * 2)


def _model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))


def _mse(m: nn.Module, b: Any) -> torch.Tensor:
    return nn.functional.mse_loss(m(b[0]), b[1])


def _setup(ctx: ModelContext, **kw: Any) -> TrainSetup:
    model = kw.pop("model", None) or _model(ctx.seed)
    loader = kw.pop("loader", None) or torch.utils.data.DataLoader(_data(ctx.seed), batch_size=BATCH, shuffle=True,
                                                                   generator=ctx.generator())
    kw.setdefault("loss_fn", _mse)
    return TrainSetup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05), loader=loader, **kw)


# -- a weight EMA updated after each step, no eval_fn -------------------------------------------

def _ema(ctx: ModelContext, declared: bool) -> TrainSetup:
    model = _model(ctx.seed)
    ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.9))
    extra = {"state_modules": {"ema": ema}} if declared else {}
    return _setup(ctx, model=model, after_step=lambda step: ema.update_parameters(model), **extra)


def ema_after_step_hidden(ctx: ModelContext) -> TrainSetup:
    """An EMA the checkpoint misses and nothing evaluates: no tensor the harness hashes differs."""
    return _ema(ctx, declared=False)


def ema_after_step_declared(ctx: ModelContext) -> TrainSetup:
    return _ema(ctx, declared=True)


# -- a loss EMA inside a LambdaLR's lambda (LambdaLR saves no plain function's state) ----------

def _loss_ema_schedule(ctx: ModelContext, declared: bool) -> TrainSetup:
    seen = {"loss_ema": torch.zeros(())}

    def loss_fn(m: nn.Module, b: Any) -> torch.Tensor:
        loss = _mse(m, b)
        seen["loss_ema"].mul_(0.9).add_(0.1 * loss.detach())
        return loss

    def lr_lambda(step: int) -> float:
        return 1.0 if float(seen["loss_ema"]) > 0.5 else 0.5  # the schedule reads the EMA

    model = _model(ctx.seed)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda)
    loader = torch.utils.data.DataLoader(_data(ctx.seed), batch_size=BATCH, shuffle=True, generator=ctx.generator())
    extra: dict[str, Any] = {}
    if declared:
        extra = {"get_extra_state": lambda: {"loss_ema": seen["loss_ema"].clone()},
                 "set_extra_state": lambda s: seen["loss_ema"].copy_(s["loss_ema"])}
    return TrainSetup(model=model, optimizer=opt, loader=loader, loss_fn=loss_fn, scheduler=sched, **extra)


def loss_ema_in_scheduler_hidden(ctx: ModelContext) -> TrainSetup:
    return _loss_ema_schedule(ctx, declared=False)


def loss_ema_in_scheduler_declared(ctx: ModelContext) -> TrainSetup:
    return _loss_ema_schedule(ctx, declared=True)


# -- a length-bucketing batch sampler with its own random.Random ------------------------------

class Bucketing(torch.utils.data.Sampler):
    """Batches of similar length (here: of similar first feature), shuffled by a private RNG."""

    def __init__(self, keys: list[float], size: int, seed: int) -> None:
        self.keys, self.size = keys, size
        self._rng = random.Random(seed)

    def __iter__(self) -> Iterator[list[int]]:
        order = sorted(range(len(self.keys)), key=self.keys.__getitem__)
        batches = [order[i:i + self.size] for i in range(0, len(order), self.size)]
        self._rng.shuffle(batches)
        return iter(batches)

    def __len__(self) -> int:
        return (len(self.keys) + self.size - 1) // self.size


def _bucketing(ctx: ModelContext, declared: bool) -> TrainSetup:
    data = _data(ctx.seed)
    sampler = Bucketing(data.tensors[0][:, 0].tolist(), BATCH, ctx.seed)
    loader = torch.utils.data.DataLoader(data, batch_sampler=sampler)
    extra: dict[str, Any] = {}
    if declared:
        extra = {"get_extra_state": lambda: {"rng": sampler._rng.getstate()},
                 "set_extra_state": lambda s: sampler._rng.setstate(s["rng"])}
    return _setup(ctx, loader=loader, **extra)


def bucketing_sampler_hidden(ctx: ModelContext) -> TrainSetup:
    return _bucketing(ctx, declared=False)


def bucketing_sampler_declared(ctx: ModelContext) -> TrainSetup:
    return _bucketing(ctx, declared=True)


# -- counters ---------------------------------------------------------------------------------

def logging_counter(ctx: ModelContext) -> TrainSetup:
    """Counts its calls for a log line only: a notice, never a failure."""
    calls = {"n": 0}

    def loss_fn(m: nn.Module, b: Any) -> torch.Tensor:
        calls["n"] += 1
        return _mse(m, b)

    return _setup(ctx, loss_fn=loss_fn)


def warmup_counter(ctx: ModelContext) -> TrainSetup:
    """Its loss weight warms up with a counter of its own: the resumed run starts it at 0."""
    calls = {"n": 0}

    def loss_fn(m: nn.Module, b: Any) -> torch.Tensor:
        calls["n"] += 1
        return min(1.0, calls["n"] / 10) * _mse(m, b)

    return _setup(ctx, loss_fn=loss_fn)


# -- torchmetrics: one metric for the log, one whose value enters the loss ---------------------

class MetricNet(nn.Module):
    """A regressor with two torchmetrics metrics as submodules (their states are not in the
    state dict): ``train_err`` only logged, ``running`` (the loss's running mean) scaling the loss."""

    def __init__(self) -> None:
        super().__init__()
        import torchmetrics

        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
        self.train_err = torchmetrics.MeanAbsoluteError()
        self.running = torchmetrics.MeanMetric()

    def loss(self, b: Any) -> torch.Tensor:
        pred = self.body(b[0])
        self.train_err.update(pred.detach(), b[1])  # for the log only
        raw = nn.functional.mse_loss(pred, b[1])
        self.running.update(raw.detach())
        return raw / (1.0 + self.running.compute())  # the loss reads the running mean


def metrics_unsaved(ctx: ModelContext) -> TrainSetup:
    torch.manual_seed(ctx.seed)
    return _setup(ctx, model=MetricNet(), loss_fn=lambda m, b: m.loss(b))
