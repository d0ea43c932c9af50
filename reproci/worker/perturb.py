"""Perturbations of a run for the portability probes (``reproci/stages/probes/``):
one factor of the environment changed, everything else as in the baseline run. The
hash seed and the thread count are set by the launcher; the directory listing order and
the DataLoader's worker count are changed here, before the plugin's factory runs or
right after it. (Worker side: stdlib and torch only.)"""

from __future__ import annotations

import inspect
import os
from typing import Any, TypedDict

import torch

from .contract import TrainSetup
from .data import loader as loader_mod
from .process.spec import other_worker_count


class _ReversedScandir:
    """``os.scandir``'s entries in reverse order, still usable as a context manager."""

    def __init__(self, entries: list[Any]) -> None:
        self._it = iter(entries)

    def __iter__(self) -> "_ReversedScandir":
        return self

    def __next__(self) -> Any:
        return next(self._it)

    def __enter__(self) -> "_ReversedScandir":
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def close(self) -> None:
        return None


class WorkersChange(TypedDict, total=False):
    """What ``with_workers`` changed: the worker counts before and after, or why nothing."""

    applicable: bool
    why: str  # not applicable: why
    num_workers: list[int]  # [before, after]


class Perturbed(TypedDict, total=False):
    """What a portability probe changed in a run (``perturbed``): the factor it moved."""

    listings: dict[str, int]  # reversed listings: the count made ({"listings": N})
    workers: WorkersChange


def reverse_listings() -> dict[str, int]:
    """From now on in this process (and the DataLoader workers it forks), directory
    listings come in reverse order: ``os.listdir`` and ``os.scandir``, and so ``glob``,
    ``os.walk`` and ``pathlib``'s ``iterdir``/``glob``, which list through them. Returns
    the live count of listings made."""
    calls = {"listings": 0}
    listdir, scandir = os.listdir, os.scandir

    def reversed_listdir(*args: Any, **kwargs: Any) -> list[Any]:
        calls["listings"] += 1
        return list(reversed(listdir(*args, **kwargs)))

    def reversed_scandir(*args: Any, **kwargs: Any) -> _ReversedScandir:
        calls["listings"] += 1
        with scandir(*args, **kwargs) as it:
            return _ReversedScandir(list(reversed(list(it))))

    os.listdir, os.scandir = reversed_listdir, reversed_scandir  # type: ignore[assignment]
    return calls


def with_workers(setup: TrainSetup, requested: int) -> WorkersChange:
    """Rebuild the setup's DataLoader with another number of worker processes (``requested``
    < 0: the other count, ``other_worker_count``). The same dataset, sampler, generator,
    collate and worker_init_fn; returns what changed (or why nothing could)."""
    loader: Any = setup.loader  # a DataLoader exactly, or nothing is changed
    if type(loader) is not torch.utils.data.DataLoader:
        return {"applicable": False, "why": f"the loader is a {type(loader).__name__}, not a torch DataLoader"}
    before = loader.num_workers
    after = other_worker_count(before) if requested < 0 else requested
    params = inspect.signature(torch.utils.data.DataLoader.__init__).parameters
    keep = (*loader_mod.CARRIED, "multiprocessing_context")
    kwargs = {k: getattr(loader, k) for k in keep if k in params and hasattr(loader, k)}
    if after > 0:
        kwargs["persistent_workers"] = bool(loader.persistent_workers)
        if loader.prefetch_factor is not None:
            kwargs["prefetch_factor"] = loader.prefetch_factor
    else:
        kwargs.pop("multiprocessing_context", None)
    if type(loader.batch_sampler) is torch.utils.data.BatchSampler:  # the same sampler object: set_epoch reaches it
        kwargs.update(sampler=loader.sampler, batch_size=loader.batch_size, drop_last=loader.drop_last)
    elif loader.batch_sampler is not None:
        kwargs["batch_sampler"] = loader.batch_sampler
    else:  # automatic batching off: the sampler yields whole batches
        kwargs.update(sampler=loader.sampler, batch_size=None)
    setup.loader = torch.utils.data.DataLoader(loader.dataset, num_workers=after, **kwargs)
    if setup.loader_generator is None and loader.generator is not None:
        setup.loader_generator = loader.generator
    return {"applicable": True, "num_workers": [before, after]}
