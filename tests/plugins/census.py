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


# -- derived state: a dataset's cache of prepared samples, filled as it reads them ------------

class Prepared(torch.utils.data.Dataset):
    """Each sample prepared once (as a tokeniser's or decoder's output is) and kept in a dict by
    index, filled by ``__getitem__``: A holds every sample it has read, C only those read since the
    resume, and the entries both hold agree. ``counted``: the twin also scales what it returns by
    the samples read so far, a count that no checkpoint holds."""

    def __init__(self, seed: int, counted: bool) -> None:
        self.x, self.y = _data(seed).tensors
        self.cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.counted, self.reads = counted, 0

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if i not in self.cache:
            self.cache[i] = (torch.tanh(self.x[i]) * 2, self.y[i])
        x, y = self.cache[i]
        if self.counted:
            self.reads += 1
            x = x * min(1.0, 0.5 + self.reads / 100)  # a warm-up over the samples read
        return x, y


def _prepared(ctx: ModelContext, counted: bool) -> TrainSetup:
    loader = torch.utils.data.DataLoader(Prepared(ctx.seed, counted), batch_size=BATCH, shuffle=True,
                                         generator=ctx.generator())
    return _setup(ctx, loader=loader)


def dataset_cache(ctx: ModelContext) -> TrainSetup:
    return _prepared(ctx, counted=False)


def dataset_cache_and_counter(ctx: ModelContext) -> TrainSetup:
    return _prepared(ctx, counted=True)


# -- a non-persistent buffer rewritten each forward (dynamic rotary frequencies) --------------

LENGTH = 8  # features, read as a sequence


class LengthRotary(nn.Module):
    """Rotary frequencies scaled to the batch's longest sequence, rewritten each forward as
    dynamic-NTK rotary embeddings rewrite ``inv_freq``: a non-persistent buffer, so a resumed run
    holds the constructor's until its first forward. ``smoothed``: the twin moves it half-way
    each forward instead, carrying it from step to step."""

    def __init__(self, smoothed: bool) -> None:
        super().__init__()
        self.smoothed = smoothed
        self.register_buffer("inv_freq", self.freqs(4 * LENGTH), persistent=False)  # the configured context

    @staticmethod
    def freqs(length: int) -> torch.Tensor:  # (2,)
        return 1.0 / (10000.0 * length / LENGTH) ** (torch.arange(0, 4, 2).float() / 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, L) -> (B, L)
        length = int((x.abs() > 0.3).sum(-1).max())  # the longest "sequence" in the batch
        if self.smoothed:
            self.inv_freq.lerp_(self.freqs(length), 0.5)
        else:
            self.inv_freq.copy_(self.freqs(length))
        angle = torch.arange(LENGTH).float()[:, None] * self.inv_freq  # (L, 2)
        return x * torch.cos(angle).mean(-1)


def _rotary(ctx: ModelContext, smoothed: bool) -> TrainSetup:
    torch.manual_seed(ctx.seed)
    model = nn.Sequential(LengthRotary(smoothed), nn.Linear(LENGTH, 16), nn.ReLU(), nn.Linear(16, 1))
    return _setup(ctx, model=model)


def rotary_recomputed(ctx: ModelContext) -> TrainSetup:
    return _rotary(ctx, smoothed=False)


def rotary_smoothed(ctx: ModelContext) -> TrainSetup:
    return _rotary(ctx, smoothed=True)


# -- a second loader, cycled by hand in the loss ----------------------------------------------

def _aux_stream(ctx: ModelContext, declared: bool) -> TrainSetup:
    """A second loader of extra samples (a replay set), shuffled by a generator of its own and
    cycled in the loss; the declared twin saves the generator at the start of its epoch and its
    position, and replays to it."""
    aux = torch.utils.data.DataLoader(_data(ctx.seed + 1), batch_size=BATCH, shuffle=True,
                                      generator=torch.Generator().manual_seed(ctx.seed + 1))
    held: dict[str, Any] = {"start": aux.generator.get_state(), "pos": 0}
    held["it"] = iter(aux)

    def loss_fn(m: nn.Module, b: Any) -> torch.Tensor:
        try:
            x, y = next(held["it"])
        except StopIteration:
            held["start"], held["pos"] = aux.generator.get_state(), 0
            held["it"] = iter(aux)
            x, y = next(held["it"])
        held["pos"] += 1
        return _mse(m, b) + 0.5 * nn.functional.mse_loss(m(x), y)

    def restore(state: dict[str, Any]) -> None:
        aux.generator.set_state(state["start"])
        held["start"], held["it"], held["pos"] = state["start"].clone(), iter(aux), state["pos"]
        for _ in range(state["pos"]):
            next(held["it"])

    extra: dict[str, Any] = {}
    if declared:
        extra = {"get_extra_state": lambda: {"start": held["start"].clone(), "pos": held["pos"]},
                 "set_extra_state": restore}
    return _setup(ctx, loss_fn=loss_fn, **extra)


def aux_loader_hidden(ctx: ModelContext) -> TrainSetup:
    return _aux_stream(ctx, declared=False)


def aux_loader_declared(ctx: ModelContext) -> TrainSetup:
    return _aux_stream(ctx, declared=True)


# -- a submodule's private generator and plain step counter -----------------------------------

class NoisyWarmup(nn.Module):
    """Input noise from a generator kept in a private attribute, and a warm-up counted in a plain
    int: neither is in the state dict."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        self._noise = torch.Generator().manual_seed(seed)
        self.steps = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.steps += 1
        return (x + 0.05 * torch.randn(x.shape, generator=self._noise)) * min(1.0, self.steps / 10)


def _noisy_warmup(ctx: ModelContext, declared: bool) -> TrainSetup:
    torch.manual_seed(ctx.seed)
    noisy = NoisyWarmup(ctx.seed)
    model = nn.Sequential(noisy, nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    extra: dict[str, Any] = {}
    if declared:
        def restore(state: dict[str, Any]) -> None:
            noisy._noise.set_state(state["noise"])
            noisy.steps = state["steps"]

        extra = {"get_extra_state": lambda: {"noise": noisy._noise.get_state(), "steps": noisy.steps},
                 "set_extra_state": restore}
    return _setup(ctx, model=model, **extra)


def submodule_state_hidden(ctx: ModelContext) -> TrainSetup:
    return _noisy_warmup(ctx, declared=False)


def submodule_state_declared(ctx: ModelContext) -> TrainSetup:
    return _noisy_warmup(ctx, declared=True)
