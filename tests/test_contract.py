"""The plugin contract's checks (``reproci/worker/contract.py``): what a factory's TrainSetup
must hold, judged on the parts that decide the order."""

from __future__ import annotations

import pytest
import torch

from reproci.worker.contract import ContractError, TrainSetup, validate

from .plugins.idioms import SeededBatches


def _setup(loader, **kw) -> TrainSetup:
    model = torch.nn.Linear(1, 1)
    return TrainSetup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), loader=loader,
                      loss_fn=lambda m, b: m(b).sum(), **kw)


DATA = torch.zeros(8, 1)


def test_a_batch_sampler_of_the_users_own_is_judged_as_the_sampler_it_is():
    """Given batch_sampler=, the DataLoader's own .sampler is an unused SequentialSampler."""
    loader = torch.utils.data.DataLoader(DATA, batch_sampler=SeededBatches(8, 2, 0), num_workers=2)
    assert validate(_setup(loader), "m").loader is loader


def test_a_torch_batch_sampler_over_an_unseeded_random_sampler_is_refused():
    inner = torch.utils.data.RandomSampler(DATA)
    loader = torch.utils.data.DataLoader(DATA, batch_sampler=torch.utils.data.BatchSampler(inner, 2, False))
    with pytest.raises(ContractError, match="the DataLoader shuffles but nothing seeds its order: pass "
                                             r"generator=ctx.generator\(\) to the RandomSampler inside its batch_sampler"):
        validate(_setup(loader), "m")
    plain = torch.utils.data.DataLoader(DATA, batch_size=2, shuffle=True)
    with pytest.raises(ContractError, match=r"pass generator=ctx.generator\(\) to the DataLoader, or"):
        validate(_setup(plain), "m")
    seeded = torch.utils.data.RandomSampler(DATA, generator=torch.Generator().manual_seed(0))
    loader = torch.utils.data.DataLoader(DATA, batch_sampler=torch.utils.data.BatchSampler(seeded, 2, False))
    assert validate(_setup(loader), "m").generator() is seeded.generator


def test_state_modules_must_be_named_modules():
    loader = torch.utils.data.DataLoader(DATA, batch_size=2)
    with pytest.raises(ContractError, match="state_modules must be a dict of name -> torch.nn.Module"):
        validate(_setup(loader, state_modules={"ema": torch.zeros(1)}), "m")
