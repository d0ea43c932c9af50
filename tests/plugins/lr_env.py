"""A small regression model whose learning rate comes from $REPROCI_TEST_LR (test-only):
the same file trains a real difference (another learning rate) or the same model again.
Its eval_fn reports a held-out loss (lower is better) and R² (higher is better)."""

from __future__ import annotations

import os

import torch
from torch import nn

from reproci import ModelContext, TrainSetup

FEATURES, SAMPLES, BATCH = 8, 256, 32


def _data(seed: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, FEATURES, generator=g)
    return x, x.sum(dim=1, keepdim=True) + 0.1 * torch.randn(n, 1, generator=g)


def build(ctx: ModelContext) -> TrainSetup:
    lr = float(os.environ.get("REPROCI_TEST_LR", "0.05"))
    model = nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Linear(16, 1)).to(ctx.device)
    x, y = _data(ctx.seed, SAMPLES)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=BATCH, shuffle=True,
                                         generator=ctx.generator())
    hx, hy = _data(ctx.seed + 10_007, SAMPLES)  # held out: same function, other samples

    def eval_fn(m: nn.Module) -> dict[str, float]:
        mse = nn.functional.mse_loss(m(hx), hy).item()
        return {"eval_loss": mse, "r2": 1.0 - mse / hy.var().item()}

    return TrainSetup(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=lr), loader=loader,
                      loss_fn=lambda m, b: nn.functional.mse_loss(m(b[0]), b[1]), batch_size=BATCH,
                      config={"lr": lr}, eval_fn=eval_fn)
