"""Plugins for the training idioms the contract takes as they are written (test-only):
gradient accumulation, a schedule as long as the run (``ctx.steps``), an EMA updated after the
optimizer step, ``ReduceLROnPlateau``, a scheduler with ``step_update`` (timm's protocol),
an epoch-stepped scheduler, two optimizers, a loss that is a ``ModelOutput``; and loss
functions that break the contract.

Each correct one records its final learning rate(s) through ``eval_fn`` (``lr``), so a test
can tell the schedule really ran. 16 samples in batches of 4: 4 batches an epoch.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from reproci import EveryEpoch, ModelContext, TrainSetup

FEATURES, BATCH, SAMPLES, VOCAB, SEQ = 8, 4, 16, 48, 10


def _data(ctx: ModelContext) -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(ctx.seed)
    x = torch.randn(SAMPLES, FEATURES, generator=g)
    return torch.utils.data.TensorDataset(x, x[:, :1] * 3 - 1)


def _loader(data: Any, ctx: ModelContext) -> torch.utils.data.DataLoader:
    return torch.utils.data.DataLoader(data, batch_size=BATCH, shuffle=True, generator=ctx.generator(), drop_last=True)


def _mlp(ctx: ModelContext) -> nn.Module:
    torch.manual_seed(ctx.seed)
    return nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Dropout(0.1), nn.Linear(16, 1)).to(ctx.device)


def _mse(m: nn.Module, b: Any) -> torch.Tensor:
    return nn.functional.mse_loss(m(b[0]), b[1])


def _gpt2(ctx: ModelContext) -> nn.Module:
    """A one-layer HF GPT-2. transformers is imported here, by the models that use it: the
    others need not pay for its import in every run."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(ctx.seed)
    return GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=16, n_layer=1, n_head=2)).to(ctx.device)


def _lr(*optimizers: torch.optim.Optimizer) -> Any:
    return lambda model: {f"lr{i}": o.param_groups[0]["lr"] for i, o in enumerate(optimizers)}


def gpt2_accumulated(ctx: ModelContext) -> TrainSetup:
    """HF GPT-2 as HF users train it: the loss is the model's own output (a ModelOutput with
    .loss), 2 micro-batches per step, linear warmup and decay over ctx.steps, and a weight
    EMA updated after each optimizer step."""
    from transformers import get_linear_schedule_with_warmup

    model = _gpt2(ctx)
    g = torch.Generator().manual_seed(ctx.seed)
    ids = torch.randint(0, VOCAB, (SAMPLES, SEQ), generator=g)
    data = [{"input_ids": row, "labels": row} for row in ids]
    loader = torch.utils.data.DataLoader(data, batch_size=BATCH, shuffle=True, generator=ctx.generator())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = get_linear_schedule_with_warmup(optimizer, num_warmup_steps=2, num_training_steps=ctx.steps)
    ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.9))
    return TrainSetup(model=model, optimizer=optimizer, loader=loader, loss_fn=lambda m, b: m(**b),
                      scheduler=scheduler, batch_size=2 * BATCH, accumulate=2, state_modules={"ema": ema},
                      after_step=lambda step: ema.update_parameters(model), eval_fn=_lr(optimizer))


def plateau(ctx: ModelContext) -> TrainSetup:
    """ReduceLROnPlateau, fed each step's loss by the harness (patience 0: it cuts often)."""
    model = _mlp(ctx)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, factor=0.5, patience=0)
    return TrainSetup(model=model, optimizer=optimizer, loader=_loader(_data(ctx), ctx), loss_fn=_mse,
                      scheduler=scheduler, batch_size=BATCH, eval_fn=_lr(optimizer))


class StepUpdateCosine:
    """A scheduler of timm's protocol (``timm.scheduler.Scheduler``): ``step_update(num_updates)``
    after every optimizer step (a linear warmup by updates), ``step(epoch)`` as each epoch
    begins (cosine decay by epoch), its state in ``state_dict``."""

    def __init__(self, optimizer: torch.optim.Optimizer, *, warmup_updates: int, epochs: int) -> None:
        self.optimizer, self.warmup, self.epochs = optimizer, warmup_updates, epochs
        self.base = [g["lr"] for g in optimizer.param_groups]
        self.epoch, self.updates = 0, 0
        self._apply()

    def _apply(self) -> None:
        warm = min(1.0, (self.updates + 1) / self.warmup)
        decay = 0.5 * (1 + math.cos(math.pi * min(self.epoch, self.epochs) / self.epochs))
        for g, base in zip(self.optimizer.param_groups, self.base):
            g["lr"] = base * warm * decay

    def step(self, epoch: int, metric: float | None = None) -> None:
        self.epoch = epoch
        self._apply()

    def step_update(self, num_updates: int, metric: float | None = None) -> None:
        self.updates = num_updates
        self._apply()

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "updates": self.updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._apply()


def step_update_scheduler(ctx: ModelContext) -> TrainSetup:
    model = _mlp(ctx)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scheduler = StepUpdateCosine(optimizer, warmup_updates=3, epochs=4)
    return TrainSetup(model=model, optimizer=optimizer, loader=_loader(_data(ctx), ctx), loss_fn=_mse,
                      scheduler=scheduler, batch_size=BATCH, eval_fn=_lr(optimizer))


def epoch_interval(ctx: ModelContext) -> TrainSetup:
    """StepLR stepped once an epoch (Lightning's "interval": "epoch"), beside a per-step decay."""
    model = _mlp(ctx)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    per_step = torch.optim.lr_scheduler.MultiplicativeLR(optimizer, lambda s: 0.99)
    per_epoch = EveryEpoch(torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5))
    return TrainSetup(model=model, optimizer=optimizer, loader=_loader(_data(ctx), ctx), loss_fn=_mse,
                      scheduler=[per_step, per_epoch], batch_size=BATCH, eval_fn=_lr(optimizer))


def accumulated_mlp(ctx: ModelContext) -> TrainSetup:
    """3 micro-batches a step over 4 batches an epoch: steps straddle the epoch boundaries."""
    model = _mlp(ctx)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    return TrainSetup(model=model, optimizer=optimizer, loader=_loader(_data(ctx), ctx), loss_fn=_mse,
                      scheduler=torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.02, total_steps=ctx.steps),
                      batch_size=3 * BATCH, accumulate=3)


class Recommender(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.items = nn.Embedding(VOCAB, 8, sparse=True)
        self.head = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.items(ids).mean(1))


def two_optimizers(ctx: ModelContext) -> TrainSetup:
    """The usual pair: SparseAdam for the sparse embedding, AdamW for the dense rest, each
    with its own schedule."""
    torch.manual_seed(ctx.seed)
    model = Recommender().to(ctx.device)
    g = torch.Generator().manual_seed(ctx.seed)
    ids = torch.randint(0, VOCAB, (SAMPLES, 3), generator=g)
    data = torch.utils.data.TensorDataset(ids, (ids.sum(1, keepdim=True) % 7).float())
    sparse = torch.optim.SparseAdam(list(model.items.parameters()), lr=0.01)
    dense = torch.optim.AdamW(model.head.parameters(), lr=0.01)
    schedules = [torch.optim.lr_scheduler.LambdaLR(o, lambda s: 0.9 ** s) for o in (sparse, dense)]
    return TrainSetup(model=model, optimizer=[sparse, dense], loader=_loader(data, ctx), batch_size=BATCH,
                      loss_fn=lambda m, b: nn.functional.mse_loss(m(b[0]), b[1]), scheduler=schedules,
                      eval_fn=_lr(sparse, dense))


def _bad(ctx: ModelContext, loss_fn: Any) -> TrainSetup:
    model = _mlp(ctx)
    return TrainSetup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05),
                      loader=_loader(_data(ctx), ctx), loss_fn=loss_fn, batch_size=BATCH)


def loss_none(ctx: ModelContext) -> TrainSetup:
    """A loss_fn that computes the loss and forgets to return it."""
    return _bad(ctx, lambda m, b: None)


def loss_per_sample(ctx: ModelContext) -> TrainSetup:
    """A loss_fn that returns the unreduced loss (reduction="none")."""
    return _bad(ctx, lambda m, b: nn.functional.mse_loss(m(b[0]), b[1], reduction="none"))


def gpt2_without_labels(ctx: ModelContext) -> TrainSetup:
    """HF GPT-2 called without labels: its ModelOutput's loss is None."""
    model = _gpt2(ctx)
    ids = torch.randint(0, VOCAB, (SAMPLES, SEQ), generator=torch.Generator().manual_seed(ctx.seed))
    loader = torch.utils.data.DataLoader([{"input_ids": r} for r in ids], batch_size=BATCH, shuffle=True,
                                         generator=ctx.generator())
    return TrainSetup(model=model, optimizer=torch.optim.AdamW(model.parameters()), loader=loader,
                      loss_fn=lambda m, b: m(**b), batch_size=BATCH)
