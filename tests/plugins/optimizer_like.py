"""An optimizer that is not a ``torch.optim.Optimizer`` but has its interface: schedule-free's
``ScheduleFreeWrapper`` around SGD (its averaged iterate ``z`` and its step count live in the
wrapped optimizer's state, which its own ``state_dict`` saves). A plain loop resumes it exactly.

32 samples in batches of 4: 8 batches an epoch.
"""

from __future__ import annotations

import schedulefree
import torch
from torch import nn

from reproci.worker.contract import ModelContext, TrainSetup


def _parts(ctx: ModelContext) -> tuple[nn.Module, schedulefree.ScheduleFreeWrapper, torch.utils.data.DataLoader]:
    torch.manual_seed(ctx.seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    optimizer = schedulefree.ScheduleFreeWrapper(torch.optim.SGD(model.parameters(), lr=0.05), momentum=0.9)
    optimizer.train()  # schedule-free optimizers train in their train mode
    g = torch.Generator().manual_seed(1)
    x = torch.randn(32, 8, generator=g)
    data = torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True))
    loader = torch.utils.data.DataLoader(data, batch_size=4, shuffle=True, generator=ctx.generator())
    return model, optimizer, loader


def build(ctx: ModelContext) -> TrainSetup:
    model, optimizer, loader = _parts(ctx)
    return TrainSetup(model=model, optimizer=optimizer, loader=loader,
                      loss_fn=lambda m, b: nn.functional.mse_loss(m(b[0]), b[1]))
