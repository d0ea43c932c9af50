"""LightningModules and a LightningDataModule whose state lives outside the module's
``state_dict``, as Lightning's docs write them (test-only), through ``lightning_setup``:

- a torchmetrics accuracy only logged (``self.log("train_acc", self.train_acc)``): its
  counts are in no checkpoint, Lightning's included, and training does not read them;
- a torchmetrics running mean whose value scales the loss: the same gap, now a resume bug;
- a private generator of the module (input jitter) kept by ``on_save_checkpoint`` /
  ``on_load_checkpoint``, or not;
- a private generator of the datamodule (noise in its collate function) kept by
  ``state_dict`` / ``load_state_dict``, or not.

``kept`` holds all the state a Trainer checkpoints; each other factory loses one piece of it.
``fit`` trains the same objects with a real ``Trainer`` and resumes it from a checkpoint at an
epoch's end, the way Lightning itself does: the test compares that with an uninterrupted fit.

16 samples in batches of 4 (4 batches an epoch), not shuffled: a Trainer, which does not
checkpoint torch's global generator, resumes a sequential order exactly.
"""

from __future__ import annotations

from typing import Any

import pytorch_lightning as pl
import torch
import torchmetrics
from torch import nn

from reproci import ModelContext, TrainSetup

FEATURES, CLASSES, BATCH, SAMPLES = 6, 3, 4, 16


class Data(pl.LightningDataModule):
    """Its collate function adds noise from the datamodule's own generator."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        self.noise = torch.Generator().manual_seed(seed)
        g = torch.Generator().manual_seed(seed + 1)
        x = torch.randn(SAMPLES, FEATURES, generator=g)
        self.train_set = torch.utils.data.TensorDataset(x, (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long())

    def collate(self, samples: list[Any]) -> Any:
        x, y = torch.utils.data.default_collate(samples)
        return x + 0.1 * torch.randn(x.shape, generator=self.noise), y

    def train_dataloader(self) -> torch.utils.data.DataLoader:
        return torch.utils.data.DataLoader(self.train_set, batch_size=BATCH, collate_fn=self.collate)


class StatefulData(Data):
    """The same, with its generator in the checkpoint: Lightning's ``state_dict`` hooks."""

    def state_dict(self) -> dict[str, Any]:
        return {"noise": self.noise.get_state()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.noise.set_state(state_dict["noise"])


class Classifier(pl.LightningModule):
    """Logs a torchmetrics accuracy as Lightning's docs show; jitters its inputs from a generator
    of its own; with ``metric_in_loss``, a running mean of the loss (a metric too) scales the loss."""

    def __init__(self, seed: int, metric_in_loss: bool = False) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.net = nn.Sequential(nn.Linear(FEATURES, 16), nn.Tanh(), nn.Linear(16, CLASSES))
        self.train_acc = torchmetrics.classification.MulticlassAccuracy(num_classes=CLASSES)
        self.running = torchmetrics.MeanMetric() if metric_in_loss else None
        self.jitter = torch.Generator().manual_seed(seed + 2)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        logits = self.net(x + 0.05 * torch.randn(x.shape, generator=self.jitter))
        loss = nn.functional.cross_entropy(logits, y)
        self.train_acc(logits, y)
        self.log("train_acc", self.train_acc, on_step=False, on_epoch=True)
        if self.running is not None:
            self.running.update(loss.detach())
            loss = loss / (1.0 + self.running.compute())  # the loss reads the metric
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


class KeptClassifier(Classifier):
    """The same, with its generator in the checkpoint: Lightning's ``on_save_checkpoint`` hooks."""

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["jitter"] = self.jitter.get_state()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.jitter.set_state(checkpoint["jitter"])


def _setup(ctx: ModelContext, module: pl.LightningModule, data: pl.LightningDataModule) -> TrainSetup:
    from reproci import lightning_setup

    return lightning_setup(ctx, module, datamodule=data)


def kept(ctx: ModelContext) -> TrainSetup:
    """Every piece of state a Trainer checkpoints is kept; the logged accuracy is in no checkpoint."""
    return _setup(ctx, KeptClassifier(ctx.seed), StatefulData(ctx.seed))


def metric_in_loss(ctx: ModelContext) -> TrainSetup:
    return _setup(ctx, KeptClassifier(ctx.seed, metric_in_loss=True), StatefulData(ctx.seed))


def module_state_lost(ctx: ModelContext) -> TrainSetup:
    return _setup(ctx, Classifier(ctx.seed), StatefulData(ctx.seed))


def datamodule_state_lost(ctx: ModelContext) -> TrainSetup:
    return _setup(ctx, KeptClassifier(ctx.seed), Data(ctx.seed))


PARTS = {"kept": (KeptClassifier, StatefulData, {}), "metric_in_loss": (KeptClassifier, StatefulData, {"metric_in_loss": True}),
         "module_state_lost": (Classifier, StatefulData, {}), "datamodule_state_lost": (KeptClassifier, Data, {})}


def fit(name: str, root: str, seed: int = 0, epochs: int = 2) -> dict[str, torch.Tensor]:
    """The final weights of ``name``'s objects trained by a real ``Trainer`` for ``epochs`` epochs,
    resumed (``fit(ckpt_path=...)``, in fresh objects) from a checkpoint at the first epoch's end."""
    module_cls, data_cls, kw = PARTS[name]

    def trainer(max_epochs: int) -> pl.Trainer:
        return pl.Trainer(max_epochs=max_epochs, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                          enable_model_summary=False, enable_checkpointing=False, default_root_dir=root,
                          num_sanity_val_steps=0)

    first = trainer(1)
    first.fit(module_cls(seed, **kw), datamodule=data_cls(seed))
    first.save_checkpoint(f"{root}/epoch1.ckpt")
    resumed = module_cls(seed, **kw)
    trainer(epochs).fit(resumed, datamodule=data_cls(seed), ckpt_path=f"{root}/epoch1.ckpt")
    return {k: v.detach().clone() for k, v in resumed.state_dict().items()}


def fit_through(name: str, root: str, seed: int = 0, epochs: int = 2) -> dict[str, torch.Tensor]:
    """The same objects trained by a real ``Trainer`` for ``epochs`` epochs without a stop."""
    module_cls, data_cls, kw = PARTS[name]
    module = module_cls(seed, **kw)
    pl.Trainer(max_epochs=epochs, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
               enable_model_summary=False, enable_checkpointing=False, default_root_dir=root).fit(
        module, datamodule=data_cls(seed))
    return {k: v.detach().clone() for k, v in module.state_dict().items()}
