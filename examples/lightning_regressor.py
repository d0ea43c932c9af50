"""A LightningModule, as written for a Lightning Trainer, checked by reproci in one call.

    pip install 'reproci[lightning]'     # pytorch-lightning
    reproci run -m examples/lightning_regressor.py:build

Its ``train_dataloader`` shuffles with no generator (a Lightning script relies on
``seed_everything``: the adapter seeds it from the run seed), ``configure_optimizers`` uses
Lightning's dict form with a per-step scheduler, ``training_step`` and ``validation_step`` call
``self.log``. Nothing in the module knows about reproci.
"""

from __future__ import annotations

from typing import Any

import pytorch_lightning as pl
import torch
from torch import nn

from reproci import ModelContext, TrainSetup, lightning_setup


class Regressor(pl.LightningModule):
    def __init__(self, hidden: int = 16, lr: float = 1e-2) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(8, hidden), nn.BatchNorm1d(hidden), nn.ReLU(), nn.Dropout(0.1),
                                 nn.Linear(hidden, 1))
        g = torch.Generator().manual_seed(1234)
        x = torch.randn(40, 8, generator=g)
        self.data = torch.utils.data.TensorDataset(x, x[:, :1] * 2 - x[:, 1:2] + 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        self.log("val_loss", loss)
        return loss

    def configure_optimizers(self) -> dict[str, Any]:
        opt = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=self.hparams.lr, total_steps=1000)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def train_dataloader(self) -> torch.utils.data.DataLoader:
        return torch.utils.data.DataLoader(torch.utils.data.Subset(self.data, range(32)), batch_size=4, shuffle=True)

    def val_dataloader(self) -> torch.utils.data.DataLoader:
        return torch.utils.data.DataLoader(torch.utils.data.Subset(self.data, range(32, 40)), batch_size=8)


def build(ctx: ModelContext) -> TrainSetup:
    pl.seed_everything(ctx.seed, workers=True)
    return lightning_setup(ctx, Regressor(), grad_clip=1.0)
