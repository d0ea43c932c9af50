"""Lightning: LightningModules with LightningDataModules, as written for a Lightning Trainer,
through ``reproci.adapters.lightning.lightning_setup``; torchmetrics inside the training step
(a stateful ``Accuracy`` that the step updates and logs, and ``pearson_corrcoef`` as part of
the loss itself).

The DataModules' ``train_dataloader`` shuffles with no generator (a Lightning script relies
on ``seed_everything``); the adapter rebuilds it seeded from the run seed. 8 samples in
batches of 4: 2 batches an epoch.
"""

from __future__ import annotations

import random
from typing import Any, Callable

import torch
from torch import nn
from zoo_common import BATCH, LABELS, SAMPLES, SEQ, VOCAB

from reproci.worker.contract import ModelContext, TrainSetup

try:
    import lightning.pytorch as pl
except ImportError:  # the older package name
    import pytorch_lightning as pl  # type: ignore[no-redef]


class RandomDataModule(pl.LightningDataModule):
    """Train and validation sets drawn from a generator with a fixed seed; ``collate_fn`` is
    the DataLoader's (default_collate unless given)."""

    def __init__(self, make: Callable[[torch.Generator, int], torch.utils.data.Dataset], seed: int,
                 collate_fn: Callable[[list], Any] | None = None) -> None:
        super().__init__()
        self.make, self.seed, self.collate_fn = make, seed, collate_fn

    def setup(self, stage: str | None = None) -> None:
        g = torch.Generator().manual_seed(self.seed)
        self.train, self.val = self.make(g, SAMPLES), self.make(g, BATCH)

    def train_dataloader(self) -> torch.utils.data.DataLoader:
        return torch.utils.data.DataLoader(self.train, batch_size=BATCH, shuffle=True, drop_last=True,
                                           collate_fn=self.collate_fn)

    def val_dataloader(self) -> torch.utils.data.DataLoader:
        return torch.utils.data.DataLoader(self.val, batch_size=BATCH, collate_fn=self.collate_fn)


def images(g: torch.Generator, n: int) -> torch.utils.data.Dataset:
    return torch.utils.data.TensorDataset(torch.randn(n, 3, 16, 16, generator=g), torch.randint(0, LABELS, (n,), generator=g))


def sentences(g: torch.Generator, n: int) -> torch.utils.data.Dataset:
    x = torch.randint(5, VOCAB, (n, SEQ), generator=g)
    return torch.utils.data.TensorDataset(x, x[:, 0] % LABELS)


def series(g: torch.Generator, n: int) -> torch.utils.data.Dataset:
    x = torch.randn(n, 8, generator=g)
    return torch.utils.data.TensorDataset(x, x[:, :1] * 2 - x[:, 1:2] + 0.1 * torch.randn(n, 1, generator=g))


class ConvClassifier(pl.LightningModule):
    """A small CNN with BatchNorm and dropout; SGD with momentum and a per-epoch StepLR
    (Lightning's default interval); a stateful torchmetrics Accuracy updated and logged.

    The metric's running counts (``tp``, ``fp``, ``tn``, ``fn``) are training state too: a run
    resumed mid-epoch must continue them. torchmetrics keeps them out of ``state_dict()`` unless
    told ``persistent(True)``; ``persistent_metric=False`` leaves them out of the checkpoint."""

    def __init__(self, lr: float = 0.05, persistent_metric: bool = True) -> None:
        super().__init__()
        import torchmetrics

        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                                 nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                                 nn.Dropout(0.2), nn.Linear(16, LABELS))
        self.accuracy = torchmetrics.classification.MulticlassAccuracy(num_classes=LABELS)
        self.accuracy.persistent(persistent_metric)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        logits = self(x)
        loss = nn.functional.cross_entropy(logits, y)
        self.accuracy(logits, y)
        self.log("train_acc", self.accuracy, prog_bar=True)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self(x), y)

    def configure_optimizers(self) -> Any:
        opt = torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9, nesterov=True)
        return [opt], [torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.7)]


class TextTransformer(pl.LightningModule):
    """nn.TransformerEncoder text classifier; AdamW and OneCycleLR stepped every step (the dict form)."""

    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.embed = nn.Embedding(VOCAB, width)
        self.pos = nn.Parameter(torch.randn(SEQ, width) * 0.02)
        layer = nn.TransformerEncoderLayer(width, 2, 64, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(width, LABELS)

    def training_step(self, batch: Any, batch_idx: int) -> dict[str, torch.Tensor]:
        x, y = batch
        h = self.encoder(self.embed(x) + self.pos)
        return {"loss": nn.functional.cross_entropy(self.head(h.mean(1)), y)}

    def validation_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.training_step(batch, batch_idx)["loss"]

    def configure_optimizers(self) -> Any:
        opt = torch.optim.AdamW(self.parameters(), lr=2e-3)
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=2e-3, total_steps=1000)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


class CorrelatedRegressor(pl.LightningModule):
    """An MLP regressor whose loss is MSE plus (1 - Pearson's r) from torchmetrics' functional API."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.LayerNorm(32), nn.GELU(), nn.Dropout(0.1), nn.Linear(32, 1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        from torchmetrics.functional import pearson_corrcoef

        x, y = batch
        pred = self.net(x)
        return nn.functional.mse_loss(pred, y) + (1 - pearson_corrcoef(pred.squeeze(1), y.squeeze(1)))

    def validation_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.training_step(batch, batch_idx)

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.parameters(), lr=1e-2)


def _fit(ctx: ModelContext, module: pl.LightningModule, data: Any, collate_fn: Any = None, **kw: Any) -> TrainSetup:
    """``Trainer(...).fit(module, datamodule)`` as reproci trains it; the factory seeds
    (``seed_everything``) before it builds the module, as a Lightning script does."""
    from reproci.adapters.lightning import lightning_setup

    dm = RandomDataModule(data, seed=ctx.seed + 17, collate_fn=collate_fn)
    dm.setup("fit")
    return lightning_setup(ctx, module, datamodule=dm, **kw)


def cnn_datamodule(ctx: ModelContext) -> TrainSetup:
    pl.seed_everything(ctx.seed, verbose=False)
    return _fit(ctx, ConvClassifier(), images, grad_clip=1.0)


def transformer_datamodule(ctx: ModelContext) -> TrainSetup:
    pl.seed_everything(ctx.seed, verbose=False)
    return _fit(ctx, TextTransformer(), sentences, accumulate=2)


def torchmetrics_loss(ctx: ModelContext) -> TrainSetup:
    pl.seed_everything(ctx.seed, verbose=False)
    return _fit(ctx, CorrelatedRegressor(), series)


def cnn_metric_unsaved(ctx: ModelContext) -> TrainSetup:
    """The same CNN with torchmetrics' default, non-persistent metric state: the accuracy counts
    are in no checkpoint (Lightning's neither), and training does not read them: A = B = C, with
    the census's warning that a resumed run logs another epoch accuracy."""
    pl.seed_everything(ctx.seed, verbose=False)
    return _fit(ctx, ConvClassifier(persistent_metric=False), images, grad_clip=1.0)


class JitterCollate:
    """A collate_fn that adds random-strength noise to each image, from a private ``random.Random``."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def __call__(self, samples: list) -> Any:
        x, y = torch.utils.data.default_collate(samples)
        return x + self.rng.uniform(0.0, 0.5) * torch.ones_like(x), y


def cnn_collate_rng_seeded(ctx: ModelContext) -> TrainSetup:
    """Planted: the DataModule's collate_fn draws from its own ``random.Random(seed)``, which the
    checkpoint does not hold: a resumed run draws from a fresh one."""
    pl.seed_everything(ctx.seed, verbose=False)
    return _fit(ctx, ConvClassifier(), images, collate_fn=JitterCollate(random.Random(ctx.seed)))


def cnn_collate_rng_unseeded(ctx: ModelContext) -> TrainSetup:
    """Planted: the same collate_fn with an unseeded ``random.Random()`` (seeded from the OS)."""
    pl.seed_everything(ctx.seed, verbose=False)
    return _fit(ctx, ConvClassifier(), images, collate_fn=JitterCollate(random.Random()))
