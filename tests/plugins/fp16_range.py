"""A model finite in float32 whose activations pass float16's range (65504) (test-only).

``overflowing`` scales its hidden features by 1e5 before a LayerNorm, as a model does whose
features grow large before a normalisation: the LayerNorm makes float32 (and bfloat16, which
has float32's range) indifferent to the scale, but under fp16 autocast the scaled features
are infinite, from step 1.
"""

from __future__ import annotations

import torch
from torch import nn

from reproci import ModelContext, TrainSetup


class Scale(nn.Module):
    """Multiplies by a fixed factor."""

    def __init__(self, factor: float) -> None:
        super().__init__()
        self.factor = factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.factor


def overflowing(ctx: ModelContext) -> TrainSetup:
    torch.manual_seed(ctx.seed)
    model = nn.Sequential(nn.Linear(8, 32), Scale(1e5), nn.LayerNorm(32), nn.Linear(32, 1))
    g = torch.Generator().manual_seed(ctx.seed)
    x = torch.randn(64, 8, generator=g)
    y = x[:, :1] * 2
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8, shuffle=True,
                                         generator=ctx.generator())
    return TrainSetup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05), loader=loader,
                      batch_size=8, loss_fn=lambda m, b: nn.functional.mse_loss(m(b[0]), b[1]))
