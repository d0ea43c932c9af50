"""A LightningDataModule that builds its datasets in ``setup()`` and a LightningModule that
builds its layers in ``configure_model()``, as Lightning's docs write them (test-only).

``prepare_data`` stands for a download (``setup`` refuses to run before it), ``setup`` draws
the data from torch's global generator (the same draws in every run only if it runs after
seeding, each time the same way), the module's ``setup`` picks its loss, and
``configure_optimizers`` sees the layers only if ``configure_model`` ran first. Each records
the hooks it saw, in order, in ``CALLS``: the order ``Trainer.fit`` calls them in, which the
factory puts in the run's config for the test to read back.
"""

from __future__ import annotations

from typing import Any

import pytorch_lightning as pl
import torch
from torch import nn

from reproci import ModelContext, TrainSetup

FEATURES, BATCH, SAMPLES = 6, 4, 12  # 3 batches an epoch
CALLS: list[str] = []


class Data(pl.LightningDataModule):
    def __init__(self, batch_size: int = BATCH) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.prepared = False

    def prepare_data(self) -> None:
        CALLS.append("datamodule.prepare_data")
        self.prepared = True

    def setup(self, stage: str) -> None:
        CALLS.append("datamodule.setup")
        if stage != "fit":
            raise RuntimeError(f"setup({stage!r}): Trainer.fit passes 'fit'")
        if not self.prepared:
            raise RuntimeError("setup before prepare_data: the data is not there yet")
        x = torch.randn(SAMPLES + 4, FEATURES)  # the global generator, as a script after seed_everything
        y = x[:, :1] * 2 - x[:, 1:2] + 0.1 * torch.randn(SAMPLES + 4, 1)
        self.train_set = torch.utils.data.TensorDataset(x[:SAMPLES], y[:SAMPLES])
        self.val_set = torch.utils.data.TensorDataset(x[SAMPLES:], y[SAMPLES:])

    def train_dataloader(self) -> torch.utils.data.DataLoader:
        CALLS.append("datamodule.train_dataloader")
        return torch.utils.data.DataLoader(self.train_set, batch_size=self.hparams.batch_size, shuffle=True)

    def val_dataloader(self) -> torch.utils.data.DataLoader:
        return torch.utils.data.DataLoader(self.val_set, batch_size=4)


class LazyRegressor(pl.LightningModule):
    def __init__(self, hidden: int = 8) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net: nn.Module | None = None
        self.loss: Any = None

    def prepare_data(self) -> None:
        CALLS.append("module.prepare_data")

    def setup(self, stage: str) -> None:
        CALLS.append("module.setup")
        if stage != "fit":
            raise RuntimeError(f"setup({stage!r}): Trainer.fit passes 'fit'")
        self.loss = nn.functional.mse_loss

    def configure_model(self) -> None:
        CALLS.append("module.configure_model")
        if self.net is None:
            self.net = nn.Sequential(nn.Linear(FEATURES, self.hparams.hidden), nn.Tanh(), nn.Dropout(0.1),
                                     nn.Linear(self.hparams.hidden, 1))

    def configure_optimizers(self) -> Any:
        CALLS.append("module.configure_optimizers")
        if not list(self.parameters()):
            raise RuntimeError("configure_optimizers before configure_model: no parameters yet")
        opt = torch.optim.AdamW(self.parameters(), lr=1e-2)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.StepLR(opt, 2), "interval": "step"}}

    def on_fit_start(self) -> None:
        CALLS.append("module.on_fit_start")

    def on_train_start(self) -> None:
        CALLS.append("module.on_train_start")

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if not CALLS or CALLS[-1] != "module.training_step":
            CALLS.append("module.training_step")
        x, y = batch
        return self.loss(self.net(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return self.loss(self.net(x), y)


def build(ctx: ModelContext) -> TrainSetup:
    """The module and its datamodule through the adapter, no glue."""
    from reproci import lightning_setup

    CALLS.clear()  # no seed_everything: the data and the layers draw from the generator the harness seeded
    setup = lightning_setup(ctx, LazyRegressor(), datamodule=Data())
    setup.config["hooks"] = list(CALLS)  # what ran in this process, read back by the test
    return setup
