"""torchdata's ``StatefulDataLoader``, the resumable loader torchtitan and accelerate use, over a
dataset that adds noise from a generator of its own and saves that generator through the
loader (torchdata's ``Stateful`` protocol: the dataset's ``state_dict``/``load_state_dict``).
A plain loop that checkpoints ``loader.state_dict()`` resumes it exactly. ``forgetful`` has a
dataset without the protocol: its generator is in no checkpoint, the loader's included.

32 samples in batches of 4: 8 batches an epoch.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torchdata.stateful_dataloader import StatefulDataLoader

from reproci.worker.contract import ModelContext, TrainSetup


class Noisy(torch.utils.data.Dataset):
    def __init__(self, seed: int) -> None:
        g = torch.Generator().manual_seed(1)
        self.x = torch.randn(32, 8, generator=g)
        self.y = self.x.sum(dim=1, keepdim=True)
        self.rng = torch.Generator().manual_seed(seed)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i] + 0.1 * torch.randn(8, generator=self.rng), self.y[i]


class Kept(Noisy):
    def state_dict(self) -> dict[str, Any]:
        return {"rng": self.rng.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rng.set_state(state["rng"])


def parts(ctx: ModelContext, dataset: type[Noisy] = Kept) -> tuple[nn.Module, torch.optim.Optimizer, StatefulDataLoader]:
    torch.manual_seed(ctx.seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    loader = StatefulDataLoader(dataset(ctx.seed), batch_size=4, shuffle=True, generator=ctx.generator())
    return model, optimizer, loader


def _setup(model: nn.Module, optimizer: torch.optim.Optimizer, loader: Any) -> TrainSetup:
    return TrainSetup(model=model, optimizer=optimizer, loader=loader,
                      loss_fn=lambda m, b: nn.functional.mse_loss(m(b[0]), b[1]))


def kept(ctx: ModelContext) -> TrainSetup:
    return _setup(*parts(ctx))


def forgetful(ctx: ModelContext) -> TrainSetup:
    return _setup(*parts(ctx, Noisy))
