"""A Lightning script as people write them: a LightningModule with a dropout MLP, a DataLoader that
shuffles, ModelCheckpoint(every_n_train_steps=...) into --out, and ``fit(ckpt_path=...)`` to resume."""

import argparse

import pytorch_lightning as pl
import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--max_steps", type=int, default=12)
parser.add_argument("--every", type=int, default=6)
parser.add_argument("--ckpt_path", default=None)
args = parser.parse_args()
pl.seed_everything(0)


class Regressor(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        opt = torch.optim.Adam(self.parameters(), lr=1e-2)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)}


g = torch.Generator().manual_seed(0)
x = torch.randn(40, 8, generator=g)
data = torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True))
loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True)
checkpoint = pl.callbacks.ModelCheckpoint(dirpath=args.out, every_n_train_steps=args.every, save_top_k=-1)
trainer = pl.Trainer(max_steps=args.max_steps, callbacks=[checkpoint], accelerator="cpu", logger=False,
                     enable_progress_bar=False, enable_model_summary=False, default_root_dir=args.out)
module = Regressor()
trainer.fit(module, loader, ckpt_path=args.ckpt_path)
torch.save({"model": module.state_dict(), "optimizer": trainer.optimizers[0].state_dict()}, f"{args.out}/final.pt")
