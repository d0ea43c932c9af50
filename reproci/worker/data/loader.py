"""Where the data pipeline stands, and how a resumed run gets back there exactly.

The harness iterates ``TrainSetup.loader`` once per epoch. Before each epoch it takes an
**epoch-start snapshot** (the loader generator's state, a torch sampler's ``generator=``,
every process RNG state and the plugin's extra state: what a trainer's checkpoint holds),
then calls ``set_epoch(epoch)`` on the
loader, its sampler, batch sampler and dataset where they have one, then ``iter(loader)``.
A checkpoint at step k stores that snapshot and the number of batches consumed in the epoch.

Any other RNG object of the pipeline (a batch sampler's private ``random.Random``, the
dataset's or the collate function's augmentation or masking generator) is the plugin's to
checkpoint, through ``get_extra_state``/``set_extra_state``, as it would be with its own
trainer; the state census (``census``) names it when a resumed run's differs. ``describe`` names every RNG object the pipeline
holds and whether the harness snapshots it, so a failed resume can say which one it was.

A resumed run rebuilds the world of the interrupted epoch's start from the snapshot,
replays the epoch up to the checkpoint's batch by the cheapest exact route, and only
then puts back the RNG and extra state saved at step k:

- a ``DataLoader`` over a map-style dataset with no worker processes skips the consumed
  batches at the index level: the batch sampler is drawn (so its order and RNG advance as
  before) but no sample is fetched, so the dataset's own RNG or cursor never runs twice;
- with worker processes, an ``IterableDataset`` or any other iterable, the consumed batches
  are fetched and dropped: worker-side RNG and state are not in the checkpoint (they live
  in other processes), and replaying the epoch from its start reproduces them.

When k falls exactly on an epoch's end, the replay yields nothing more and the next epoch
starts as it did in the original run.
"""

from __future__ import annotations

import copy
import inspect
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, TypedDict

import torch

from ..contract import ContractError, TrainSetup
from ..state import rng
from ..state.rng import RngStates


class SavedEpochStart(TypedDict):
    """An ``EpochStart`` as a checkpoint holds it (``EpochStart.to_dict``)."""

    generator: torch.Tensor | None
    rng: RngStates
    extra: Any
    samplers: dict[str, Any] | None


@dataclass
class EpochStart:
    """Everything that decides an epoch's batches, taken just before its ``iter()``."""

    generator: torch.Tensor | None  # the loader generator's state
    rng: RngStates  # python, numpy, torch (and CUDA) RNG states
    extra: Any  # the plugin's extra state (deep copy), or None
    samplers: dict[str, Any] | None = None  # path -> state of each RNG object the samplers hold

    def to_dict(self) -> SavedEpochStart:
        return {"generator": self.generator, "rng": self.rng, "extra": self.extra, "samplers": self.samplers}

    @classmethod
    def from_dict(cls, d: SavedEpochStart) -> "EpochStart":
        gen = d["generator"]
        return cls(gen.cpu() if isinstance(gen, torch.Tensor) else None, rng.to_cpu(d["rng"]), d["extra"],
                   d["samplers"])


def epoch_hooks(loader: Any) -> list[Callable[[int], None]]:
    """``set_epoch`` of the loader, its sampler, batch sampler and dataset (each once)."""
    seen: set[int] = set()
    hooks = []
    for part in (loader, getattr(loader, "batch_sampler", None), getattr(loader, "sampler", None),
                 getattr(loader, "dataset", None)):
        fn = getattr(part, "set_epoch", None) if part is not None else None
        if callable(fn) and id(part) not in seen:
            seen.add(id(part))
            hooks.append(fn)
    return hooks


def extra_state(setup: TrainSetup) -> Any:
    return copy.deepcopy(setup.get_extra_state()) if setup.get_extra_state is not None else None


def _parts(loader: Any, *, order_only: bool) -> dict[str, Any]:
    """The parts of a data pipeline that may hold RNG objects, by path: those that decide the
    order (sampler, batch sampler, a sampler inside it), then the dataset and collate function."""
    batch_sampler = getattr(loader, "batch_sampler", None)
    parts = {"sampler": getattr(loader, "sampler", None), "batch_sampler": batch_sampler,
             "batch_sampler.sampler": getattr(batch_sampler, "sampler", None)}
    if not order_only:
        parts.update(dataset=getattr(loader, "dataset", None), collate_fn=getattr(loader, "collate_fn", None))
    return {prefix: part for prefix, part in parts.items() if part is not None}


def sampler_rngs(setup: TrainSetup) -> dict[str, torch.Generator]:
    """The generators a trainer's checkpoint holds for the order besides the loader generator
    (saved as such): a torch sampler's ``generator=`` (a ``RandomSampler`` inside a batch
    sampler). An RNG object a sampler of the plugin's own keeps, under any name, is the
    plugin's private state: not snapshotted, so a resume behaves as the user's trainer's
    would, and the state census names it when it differs."""
    gen = setup.generator()
    found: dict[str, torch.Generator] = {}
    seen = {id(gen)} if gen is not None else set()
    for prefix, part in _parts(setup.loader, order_only=True).items():
        g = getattr(part, "generator", None)
        if isinstance(g, torch.Generator) and type(part).__module__.startswith("torch.") and id(g) not in seen:
            seen.add(id(g))
            found[f"{prefix}.generator"] = g
    return found


def snapshot(setup: TrainSetup) -> EpochStart:
    gen = setup.generator()
    samplers = {path: rng.get_state(obj) for path, obj in sampler_rngs(setup).items()}
    return EpochStart(gen.get_state() if gen is not None else None, rng.states(), extra_state(setup), samplers or None)


def restore(setup: TrainSetup, start: EpochStart) -> None:
    gen = setup.generator()
    if gen is not None and start.generator is not None:
        gen.set_state(start.generator)
    for path, obj in sampler_rngs(setup).items():
        if start.samplers and path in start.samplers:
            rng.set_state(obj, start.samplers[path])
    rng.set_states(start.rng)
    if setup.set_extra_state is not None and start.extra is not None:
        setup.set_extra_state(copy.deepcopy(start.extra))


def begin_epoch(setup: TrainSetup, epoch: int) -> Iterator[Any]:
    for hook in epoch_hooks(setup.loader):
        hook(epoch)
    return iter(setup.loader)


class _SkipFirst:
    """A one-epoch sampler (or batch sampler) that draws and drops the first ``n`` items of
    another. ``skip_now`` does the drawing at a chosen moment: a DataLoader creates its
    sampler iterator before it draws its base seed, but a generator-based sampler only
    draws its order at the first ``next``; skipping right after ``iter(loader)`` keeps that
    order of draws."""

    def __init__(self, inner: Iterable[Any], n: int) -> None:
        self.inner, self.n = inner, n
        self._it: Iterator[Any] | None = None

    def skip_now(self) -> None:
        if self._it is None:
            self._it = iter(self.inner)
            for _ in range(self.n):
                if next(self._it, _END) is _END:
                    break

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        self.skip_now()
        return next(self._it)  # type: ignore[arg-type]

    def __len__(self) -> int:
        return max(len(self.inner) - self.n, 0)  # type: ignore[arg-type]


_END = object()


def own_state(loader: Any) -> bool:
    """A loader that checkpoints its own position (torchdata's ``StatefulDataLoader``, a loader of
    the plugin's with ``state_dict``/``load_state_dict``): its state is saved with the run's, and
    a resumed run puts it back rather than replaying the epoch."""
    return not isinstance(loader, type) and all(callable(getattr(loader, m, None)) for m in ("state_dict", "load_state_dict"))


def resume_own(setup: TrainSetup, epoch: int, state: Any) -> Iterator[Any]:
    """The interrupted epoch's iterator of an ``own_state`` loader, from its saved state."""
    for hook in epoch_hooks(setup.loader):
        hook(epoch)
    own: Any = setup.loader
    own.load_state_dict(state)
    return iter(own)


def index_skippable(loader: Any) -> bool:
    """A plain DataLoader over a map-style dataset in this process: skip without fetching."""
    return (type(loader) is torch.utils.data.DataLoader and loader.num_workers == 0
            and not isinstance(loader.dataset, torch.utils.data.IterableDataset))


# The DataLoader arguments a rebuilt loader takes over from the original (the very same
# generator object among them), here and in ``perturb.with_workers``.
CARRIED = ("collate_fn", "pin_memory", "timeout", "worker_init_fn", "generator", "pin_memory_device", "in_order")


def _without_first(loader: torch.utils.data.DataLoader, n: int) -> tuple[torch.utils.data.DataLoader, _SkipFirst]:
    """The same loader for one epoch, its first ``n`` index batches drawn and dropped.

    Everything else is the original's: the dataset, collate function and the very same
    generator object, so ``iter()`` draws from it exactly as the original did.
    """
    params = inspect.signature(torch.utils.data.DataLoader.__init__).parameters
    kwargs = {k: getattr(loader, k) for k in CARRIED if k in params and hasattr(loader, k)}
    if loader.batch_sampler is not None:
        skip = kwargs["batch_sampler"] = _SkipFirst(loader.batch_sampler, n)
    else:  # automatic batching off: the sampler yields whole batches' indices
        skip = _SkipFirst(loader.sampler, n)
        kwargs.update(sampler=skip, batch_size=None)
    return torch.utils.data.DataLoader(loader.dataset, **kwargs), skip


def replay_epoch(setup: TrainSetup, epoch: int, consumed: int) -> tuple[Iterator[Any], str]:
    """The interrupted epoch's iterator, positioned after its first ``consumed`` batches.

    Returns the iterator and how it got there ("index" or "fetch"). The caller has put
    back the epoch-start snapshot first.
    """
    for hook in epoch_hooks(setup.loader):
        hook(epoch)
    if index_skippable(setup.loader):
        replica, skip = _without_first(setup.loader, consumed)
        it = iter(replica)
        skip.skip_now()
        return it, "index"
    it = iter(setup.loader)
    for i in range(consumed):
        if next(it, _END) is _END:
            raise ContractError(
                f"on resume the loader ended after {i} batches of epoch {epoch}, but the checkpoint was taken "
                f"after {consumed}: the loader must yield the same batches in every run of an epoch")
    return it, "fetch"


class LoaderDescription(TypedDict):
    """What a record says of the loader (``describe``)."""

    type: str  # the loader's class name
    num_workers: int
    persistent_workers: bool
    iterable_dataset: bool
    set_epoch: int  # the set_epoch hooks called each epoch
    shuffles: bool
    batches_per_epoch: int | None  # None: no length


class PipelineRng(TypedDict):
    """An RNG object the data pipeline holds (``pipeline_rngs``)."""

    type: str  # torch.Generator, numpy.random.Generator, ...
    snapshotted: bool  # whether the epoch-start snapshot covers it


class LoaderSetup(LoaderDescription):
    """``describe`` of a setup's loader, with the RNG objects its pipeline holds, by path."""

    rngs: dict[str, PipelineRng]


def describe_setup(setup: TrainSetup) -> LoaderSetup:
    """``describe`` of the setup's loader, with the RNG objects its pipeline holds."""
    return {**describe(setup.loader), "rngs": pipeline_rngs(setup)}


def describe(loader: Any) -> LoaderDescription:
    """What a record says of the loader: enough to name a known cause of a failed resume."""
    return {
        "type": type(loader).__name__,
        "num_workers": getattr(loader, "num_workers", 0),
        "persistent_workers": bool(getattr(loader, "persistent_workers", False)),
        "iterable_dataset": isinstance(getattr(loader, "dataset", None), torch.utils.data.IterableDataset),
        "set_epoch": len(epoch_hooks(loader)),
        "shuffles": shuffles(loader),
        "batches_per_epoch": _length(loader),
    }


def _length(loader: Any) -> int | None:
    try:
        return int(len(loader))
    except Exception:  # an iterable without a length, or one whose length raises
        return None


def pipeline_rngs(setup: TrainSetup) -> dict[str, PipelineRng]:
    """Every RNG object the data pipeline holds (sampler, batch sampler, dataset, collate
    function), by path, with its type and whether the epoch-start snapshot covers it."""
    snapshotted = set(sampler_rngs(setup))
    gen = setup.generator()
    out: dict[str, PipelineRng] = {}
    for prefix, part in _parts(setup.loader, order_only=False).items():
        for path, obj in rng.held(part, prefix).items():
            out[path] = {"type": rng.kind(obj),
                         "snapshotted": path in snapshotted or obj is gen}
    return out


def shuffles(loader: Any) -> bool:
    """Whether the loader's sampler (or one inside its batch sampler) draws a random order."""
    batch_sampler = getattr(loader, "batch_sampler", None)
    for part in (getattr(loader, "sampler", None), batch_sampler, getattr(batch_sampler, "sampler", None)):
        if isinstance(part, torch.utils.data.RandomSampler) or getattr(part, "shuffle", None) is True:
            return True
    return False


def resume_point(spec: Any, setup: TrainSetup) -> int | None:
    """The step of the resume check's checkpoint: ``checkpoint_at``, or, with
    ``checkpoint_after_epoch``, past the first epoch boundary when it falls in the first epoch
    and the run holds a later one (midway between the boundary and the last step)."""
    k = spec.checkpoint_at
    if k is None or not spec.checkpoint_after_epoch:
        return k
    try:
        per_epoch = -(-len(setup.loader) // setup.accumulate)  # type: ignore[arg-type]  # steps that cross the first boundary
    except Exception:  # an iterable without a length: k stays
        return k
    if per_epoch < 1 or k > per_epoch or per_epoch + 1 >= spec.steps:
        return k
    return per_epoch + max(1, (spec.steps - per_epoch) // 2)
