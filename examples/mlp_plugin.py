"""An example of a user's own model for reproci: a small MLP regression.

Run it through the strict-determinism stage with

    reproci run --model examples/mlp_plugin.py:build

It needs nothing beyond reproci itself (torch and numpy); the Hugging Face and Lightning
examples name the extra they need.

The factory receives a ModelContext (profile, device, seed) and returns a TrainSetup.
The harness does the rest: seeding, determinism flags, the loop, checkpoints, hashes.
"""

from __future__ import annotations

import torch
from torch import nn

from reproci import ModelContext, TrainSetup


def build(ctx: ModelContext) -> TrainSetup:
    width = 64 if ctx.profile == "quick" else 1024
    model = nn.Sequential(nn.Linear(16, width), nn.ReLU(), nn.Dropout(0.1), nn.Linear(width, 1)).to(ctx.device)
    g = torch.Generator().manual_seed(ctx.seed)
    x = torch.randn(512, 16, generator=g)
    y = x.sum(dim=1, keepdim=True).sin()
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x, y), batch_size=32, shuffle=True, generator=ctx.generator()
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        inputs, targets = batch
        return nn.functional.mse_loss(model(inputs), targets)

    return TrainSetup(model=model, optimizer=optimizer, loader=loader, loss_fn=loss_fn, batch_size=32,
                      config={"width": width})
