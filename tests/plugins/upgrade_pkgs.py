"""A model that uses three small packages, as a model uses its libraries: ``knob`` (a constant
it trains with), ``noop`` (imported, no number from it) and ``abi`` (a compiled-style package
whose new version only imports beside the new ``knob``). Built into images by
``tests/test_blame.py``; the local backend has none of them."""

from __future__ import annotations

import torch
from torch import nn

from reproci.worker.contract import ModelContext, TrainSetup


def build(ctx: ModelContext) -> TrainSetup:
    import abi  # noqa: F401 - imported for what its import does
    import knob
    import noop

    torch.manual_seed(ctx.seed)
    model = nn.Linear(4, 1)
    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(32, 4, generator=g), torch.randn(32, 1, generator=g))
    loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True, generator=ctx.generator())
    return TrainSetup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), loader=loader, batch_size=8,
                      loss_fn=lambda m, b: nn.functional.mse_loss(m(b[0]) * knob.SCALE, b[1]),
                      config={"noop": noop.NAME})
