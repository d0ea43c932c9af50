"""A LightningModule adapted to the plugin contract by hand, as users do it today (test-only):
its ``training_step`` is the loss, ``configure_optimizers`` in Lightning's dict form gives the
optimizer and a per-step scheduler, ``self.log`` is called outside a Trainer (Lightning warns
and does nothing), and ``seed_everything`` seeds the factory as a Lightning script would.
"""

from __future__ import annotations

from typing import Any

import pytorch_lightning as pl
import torch
from torch import nn

from reproci import ModelContext, TrainSetup

FEATURES, BATCH, SAMPLES = 8, 4, 16  # 4 batches an epoch


class Regressor(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(FEATURES, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.1),
                                 nn.Linear(16, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> dict[str, Any]:
        opt = torch.optim.AdamW(self.parameters(), lr=1e-2)
        return {"optimizer": opt,
                "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.StepLR(opt, step_size=3), "interval": "step"}}


def build(ctx: ModelContext) -> TrainSetup:
    pl.seed_everything(ctx.seed, workers=True)
    module = Regressor()
    g = torch.Generator().manual_seed(ctx.seed)
    x = torch.randn(SAMPLES, FEATURES, generator=g)
    data = torch.utils.data.TensorDataset(x, x[:, :1] * 2 + 0.1)
    loader = torch.utils.data.DataLoader(data, batch_size=BATCH, shuffle=True, generator=ctx.generator())
    opt = module.configure_optimizers()
    return TrainSetup(model=module, optimizer=opt["optimizer"], scheduler=opt["lr_scheduler"]["scheduler"],
                      loader=loader, loss_fn=lambda m, batch: m.training_step(batch, 0), batch_size=BATCH)


class IndexedRegressor(Regressor):
    """A training step that uses its batch_idx (every other batch weighs double), and Lightning's
    default scheduler interval (a bare scheduler in the tuple form: stepped per epoch)."""

    def training_step(self, batch: Any, batch_idx: int) -> dict[str, torch.Tensor]:
        x, y = batch
        return {"loss": nn.functional.mse_loss(self(x), y) * (1 + batch_idx % 2)}

    def configure_optimizers(self) -> Any:
        opt = torch.optim.SGD(self.parameters(), lr=1e-2, momentum=0.9)
        return [opt], [torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)]

    def train_dataloader(self) -> torch.utils.data.DataLoader:
        g = torch.Generator().manual_seed(7)
        x = torch.randn(SAMPLES, FEATURES, generator=g)
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x[:, :1] - 1), batch_size=BATCH,
                                           shuffle=True)


def adapted(ctx: ModelContext) -> TrainSetup:
    """The same kind of module through the adapter, no glue, with the Trainer's deterministic=True."""
    from reproci import lightning_setup

    pl.seed_everything(ctx.seed)
    return lightning_setup(ctx, IndexedRegressor(), accumulate=2, deterministic=True)
