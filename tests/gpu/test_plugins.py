"""The GPU tests' plugin models themselves, on the CPU: what a GPU run of them relies on."""

from __future__ import annotations

import math

import torch
from torch.overrides import TorchFunctionMode

from reproci.worker.contract import ModelContext

from . import plugins
from .conftest import CUDA_SIZE


class _IndexAdds(TorchFunctionMode):
    """Each ``index_add_`` call's (rows added, buckets they land in)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[int, int]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if func is torch.Tensor.index_add_:
            index = args[2]
            self.calls.append((index.numel(), index.unique().numel()))
        return func(*args, **(kwargs or {}))


def test_the_float_atomics_plugin_stays_finite_for_a_gpu_run_and_its_rows_still_collide():
    """``cuda_atomics`` trained for the steps of its GPU test: every loss finite (on an H200 it
    was inf from step 3 and the run ended non-finite, exit 4 instead of 1; the same arithmetic
    on the CPU diverged as fast), and every forward adds many rows into few buckets with
    ``index_add_``, the float atomics whose order changes between CUDA runs."""
    steps = int(CUDA_SIZE[1])
    strict = torch.are_deterministic_algorithms_enabled()
    try:
        setup = plugins.cuda_atomics(ModelContext(profile="quick", device=torch.device("cpu"), seed=0, steps=steps))
    finally:
        torch.use_deterministic_algorithms(strict)  # the plugin switches it off, as its GPU run needs
    losses, it = [], iter(setup.loader)
    with _IndexAdds() as adds:
        for _ in range(steps):
            batch = next(it, None)
            if batch is None:
                it = iter(setup.loader)
                batch = next(it)
            setup.optimizer.zero_grad()
            loss = setup.loss_fn(setup.model, batch)
            loss.backward()
            setup.optimizer.step()
            losses.append(loss.item())
    assert all(math.isfinite(x) and x < 10 for x in losses), losses
    assert len(adds.calls) == steps
    assert all(rows >= 1000 and buckets == 4 for rows, buckets in adds.calls), adds.calls
