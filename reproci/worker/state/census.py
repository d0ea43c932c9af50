"""The state census: training state that the checkpoint does not hold, hashed where a resumed
run picks up.

What the harness checkpoints is what a trainer checkpoints: the model's parameters and
persistent buffers, the optimizers, the schedulers, the GradScaler, the global RNGs, the
loader's order generator (``DataLoader(generator=)``, a torch sampler's ``generator=``) and
position, the declared extra state (``get_extra_state``) and state modules. Everything else
the harness can reach from the set-up is the plugin's private state, and the census hashes it:

- the data pipeline: the loader's sampler, batch sampler (and a sampler inside it), dataset
  and collate function, and what they hold;
- the functions the loop calls: ``loss_fn``, ``eval_fn``, ``after_step``, ``after_backward`` (their closures,
  bound objects, ``functools.partial`` arguments, and the module globals they name, where
  the function is the user's own code), and the schedulers (a ``LambdaLR``'s lambdas among
  them), through the harness's stepper wrappers;
- a second loader found on the way (in a closure, a dataset) and drawn from by hand: its
  generator, dataset and samplers, and an iterator's position (``_num_yielded``);
- the model's own modules, for what their ``state_dict`` leaves out: tensors kept as plain
  attributes or non-persistent buffers (a torchmetrics metric's state, its items marked with
  the metric's class and path: ``is_metric``), RNG objects; on a module of the user's own
  class, its plain numbers too (a step counter the forward reads), and, where every class
  between it and ``nn.Module`` is the user's, its private (``_``) attributes (a library's
  private attributes are that library's bookkeeping; torch's own are never looked at).

Each item found is one of four kinds: an RNG object (its state), a module (its state dict),
a tensor (exact bit checksum, dtype and shape), or a plain value (an int, float, bool, short
string or None: a counter, a flag). Runs A and C take a census at the resume point (the
state after step k, with step k+1's batch in hand) and after step k+1; the determinism stage
compares them (``reproci.stages.determinism.census``). The walk never enters the harness's own objects
(the classes of ``reproci.worker``), iterators other than a loader's, locks, caches, modules or classes, and
stops at a depth and an item count, so it costs milliseconds, not a pass over the data.
"""

from __future__ import annotations

import functools
import hashlib
import sys
import types
from typing import Any, Iterator, TypedDict

import numpy as np
import torch

from ..contract import TrainSetup
from ..data.loader import own_state
from . import census_walk, rng
from .census_walk import MAX_CONTAINER
from .tensor_bits import no_fill

MAX_DEPTH = 6  # attribute hops from a root
MAX_ITEMS = 4000  # objects visited per census
MAX_STR = 200  # longer strings are not plain values worth comparing

_PLAIN = (bool, int, float, complex, str, bytes, type(None))
_SKIP_TYPES: tuple[type, ...] = tuple(t for t in (
    types.ModuleType, type, types.BuiltinFunctionType, types.CodeType, types.FrameType, types.GeneratorType,
    types.CoroutineType, types.AsyncGeneratorType, functools._lru_cache_wrapper, torch.device, torch.dtype,
    torch.optim.Optimizer,
    getattr(torch.amp, "GradScaler", None), getattr(torch.cuda.amp, "GradScaler", None),  # torch.amp's from 2.3 on
) if isinstance(t, type))
_LOADER_ITERATOR: type | None = getattr(torch.utils.data.dataloader, "_BaseDataLoaderIter", None)


class Census:
    """One census: path -> (kind, type name, digest)."""

    def __init__(self, setup: TrainSetup) -> None:
        self.setup = setup
        self.items: dict[str, dict[str, str]] = {}
        self._seen: set[int] = set()
        self._visited = 0
        self._held = _checkpointed(setup)
        self._metric: dict[str, str] = {}  # while the walk is inside a torchmetrics Metric: its class and path

    def take(self) -> dict[str, dict[str, str]]:
        with torch.no_grad(), no_fill():
            for path, root in _roots(self.setup):
                self._walk(root, path, 0)
            self._model_extras()
        return dict(sorted(self.items.items()))

    def _item(self, path: str, kind: str, type_name: str, sha: str, value: str | None = None) -> None:
        self.items[path] = {"kind": kind, "type": type_name, "sha": sha, **({"value": value} if value else {}),
                            **self._metric}

    # -- the walk ---------------------------------------------------------------------------

    def _walk(self, obj: Any, path: str, depth: int) -> None:
        if self._visited >= MAX_ITEMS:
            return
        if isinstance(obj, _PLAIN):
            if not isinstance(obj, (str, bytes)) or len(obj) <= MAX_STR:
                text = repr(obj)
                self._item(path, "value", type(obj).__name__, census_walk.digest(text), text if len(text) <= 40 else None)
            return
        if id(obj) in self._held or id(obj) in self._seen:
            return
        self._seen.add(id(obj))
        self._visited += 1
        if rng.is_rng(obj):
            self._item(path, "rng", rng.kind(obj), census_walk.digest(repr(census_walk.rng_state(obj))))
            return
        if isinstance(obj, torch.Tensor):
            self._item(path, "tensor", census_walk.tensor_type(obj), census_walk.tensor_digest(obj))
            return
        if isinstance(obj, np.ndarray):
            self._item(path, "tensor", f"numpy.ndarray[{obj.dtype}, {obj.shape}]", census_walk.digest(obj.tobytes()))
            return
        if isinstance(obj, torch.nn.Module):
            self._module(obj, path)
            return
        if isinstance(obj, (list, tuple)) and obj and all(isinstance(v, _PLAIN) for v in obj[:MAX_CONTAINER]) \
                and isinstance(obj[-1], _PLAIN):  # a list of numbers is one value: data, or a history
            text = repr(obj[:MAX_CONTAINER * 16])
            self._item(path, "value", f"{type(obj).__name__}[{type(obj[0]).__name__}] of {len(obj)}", census_walk.digest(text),
                       text if len(text) <= 40 else None)
            return
        if depth >= MAX_DEPTH or isinstance(obj, _SKIP_TYPES) or census_walk.harness_object(obj):
            return
        if isinstance(obj, torch.utils.data.DataLoader):
            self._loader(obj, path, depth)
            return
        if _LOADER_ITERATOR is not None and isinstance(obj, _LOADER_ITERATOR):
            # an iterator of a loader the plugin draws from by hand: its position, and the order's generator
            self._walk(getattr(obj, "_num_yielded", None), f"{path}._num_yielded", depth + 1)
            self._walk(getattr(obj, "_index_sampler", None), f"{path}._index_sampler", depth + 1)
            return
        if census_walk.is_iterator(obj):
            return
        for name, child in census_walk.children(obj):
            self._walk(child, f"{path}{name}", depth + 1)

    def _loader(self, loader: torch.utils.data.DataLoader, path: str, depth: int) -> None:
        """A second loader the plugin keeps (in a closure, a dataset) and draws from by hand: what
        decides its order (its generator, samplers) and its dataset. Reached from a closure, the
        training loader adds nothing: its order generator is checkpointed, its parts were walked
        first (``_roots``)."""
        for name in ("generator", "dataset", "sampler", "batch_sampler"):
            part = getattr(loader, name, None)
            if part is not None:
                self._walk(part, f"{path}.{name}", depth + 1)

    def _module(self, module: torch.nn.Module, path: str) -> None:
        """A module the checkpoint does not hold (an EMA in a closure): its state dict, as one item."""
        tensors = [(n, t) for n, t in module.state_dict(keep_vars=True).items() if isinstance(t, torch.Tensor)]
        if not tensors or all(id(t) in self._held for _, t in tensors):
            return
        h = hashlib.sha256()
        for n, t in tensors:
            h.update(f"{n}:{census_walk.tensor_type(t)}:{census_walk.tensor_digest(t)};".encode())
        self._item(path, "module", type(module).__qualname__, h.hexdigest()[:16])

    def _model_extras(self) -> None:
        """What the model's and the state modules' ``state_dict`` leave out: tensors kept as plain
        attributes or non-persistent buffers, and RNG objects, of every submodule."""
        roots = [("model", self.setup.model)] + [(f"state_modules.{n}", m) for n, m in self.setup.state_modules.items()]
        for prefix, root in roots:
            for mname, module in root.named_modules():
                where = f"{prefix}.{mname}" if mname else prefix
                self._metric = {"metric": type(module).__qualname__, "owner": where} if is_metric(module) else {}
                for name in getattr(module, "_non_persistent_buffers_set", ()):
                    t = module._buffers.get(name)
                    if isinstance(t, torch.Tensor):
                        self._item(f"{where}.{name}", "tensor", census_walk.tensor_type(t), census_walk.tensor_digest(t))
                own, wholly_own = _own_class(type(module))
                for name, value in vars(module).items():
                    if name in _MODULE_BOOKKEEPING or name.startswith("_") and not wholly_own:
                        continue  # torch's own (_parameters, _buffers, hooks), a library's private attributes
                    if isinstance(value, (torch.Tensor, np.ndarray)) and not isinstance(value, torch.nn.Parameter) \
                            or rng.is_rng(value):
                        self._walk(value, f"{where}.{name}", MAX_DEPTH)
                    elif own and isinstance(value, (int, float)) and not isinstance(value, bool):
                        self._walk(value, f"{where}.{name}", MAX_DEPTH)  # a step counter the forward reads
                    elif isinstance(value, (list, tuple)) and value and all(isinstance(v, torch.Tensor) for v in value):
                        for i, v in enumerate(value[:MAX_CONTAINER]):  # a metric's list state
                            self._walk(v, f"{where}.{name}[{i}]", MAX_DEPTH)
        self._metric = {}


def is_metric(module: Any) -> bool:
    """Whether ``module`` is a torchmetrics ``Metric`` (known by its classes: the worker does not
    import torchmetrics). Its state is non-persistent unless ``persistent(True)``: out of every
    checkpoint, Lightning's too; its items carry the metric's class and path."""
    return any(c.__name__ == "Metric" and c.__module__.startswith("torchmetrics") for c in type(module).__mro__)


# what torch itself keeps on every module: hooks, parameters, buffers, submodules, the mode
_MODULE_BOOKKEEPING = frozenset(vars(torch.nn.Module())) | {"_compiled_call_impl"}
_OWN: dict[type, tuple[bool, bool]] = {}  # a module's class -> _own_class's answer


def _own_class(cls: type) -> tuple[bool, bool]:
    """(whether a module's class is the plugin's own code, whether every class between it and
    ``nn.Module`` is): the private attributes of a module whose class or base a library wrote
    (a torchmetrics metric, a LightningModule) are that library's bookkeeping."""
    if cls not in _OWN:
        bases = [c for c in cls.__mro__ if c is not object and not issubclass(torch.nn.Module, c)]
        _OWN[cls] = (_user_class(cls), all(_user_class(c) for c in bases))
    return _OWN[cls]


def _user_class(c: type) -> bool:
    filename = getattr(sys.modules.get(c.__module__), "__file__", None)
    if filename is None:  # a class made where no module file is known: one of its functions'
        filename = next((f.__code__.co_filename for f in vars(c).values() if hasattr(f, "__code__")), "<unknown>")
    return census_walk.user_code(filename)


def take(setup: TrainSetup) -> dict[str, dict[str, str]]:
    """The census of ``setup``'s private state now: path -> {kind, type, sha}."""
    return Census(setup).take()


# -- what the census starts from, and what it leaves to the checkpoint ------------------------

def _roots(setup: TrainSetup) -> Iterator[tuple[str, Any]]:
    loader = setup.loader
    batch_sampler = getattr(loader, "batch_sampler", None)
    # the dataset first: a sampler holds it too (``data_source``), and the shorter path names it
    for name, part in (("loader.dataset", getattr(loader, "dataset", None)), ("loader.sampler", getattr(loader, "sampler", None)),
                       ("loader.batch_sampler", batch_sampler), ("loader.collate_fn", getattr(loader, "collate_fn", None))):
        if part is not None:
            yield name, part
    if not isinstance(loader, torch.utils.data.DataLoader):
        yield "loader", loader  # a plain iterable of the plugin's: its own state is private
    for name in ("loss_fn", "eval_fn", "after_step", "after_backward"):
        fn = getattr(setup, name)
        if fn is not None:
            yield name, fn
    schedules = setup.scheduler
    for i, s in enumerate(getattr(schedules, "schedulers", None) or ()):
        inner = getattr(s, "scheduler", s) if census_walk.harness_object(s) else s  # through EveryEpoch
        yield f"scheduler[{i}]", inner


def _checkpointed(setup: TrainSetup) -> set[int]:
    """The ids of the objects the checkpoint holds (and of the model's own tensors)."""
    held: set[int] = set()
    for root in (setup.model, *setup.state_modules.values()):
        held.add(id(root))
        for m in root.modules():
            held.add(id(m))
        for t in root.state_dict(keep_vars=True).values():
            held.add(id(t))
        for p in root.parameters():
            held.add(id(p))
            if p.grad is not None:
                held.add(id(p.grad))
    opt = setup.optimizer
    held.add(id(opt))
    for member in getattr(opt, "optimizers", None) or [opt]:
        held.add(id(member))
        for state in member.state.values():
            held.update(id(v) for v in state.values() if isinstance(v, torch.Tensor))
    for obj in (setup.scaler, setup.generator(), setup.get_extra_state, setup.set_extra_state, setup.scheduler):
        if obj is not None:
            held.add(id(obj))
    loader = setup.loader
    batch_sampler = getattr(loader, "batch_sampler", None)
    if own_state(loader):  # its state_dict holds its position, and a dataset's with the same protocol
        held.update(id(p) for p in (loader, getattr(loader, "sampler", None), batch_sampler,
                                    getattr(batch_sampler, "sampler", None)) if p is not None)
        dataset = getattr(loader, "dataset", None)
        if dataset is not None and own_state(dataset):
            held.add(id(dataset))
    for part in (getattr(loader, "sampler", None), batch_sampler, getattr(batch_sampler, "sampler", None)):
        g = getattr(part, "generator", None)
        if isinstance(g, torch.Generator) and type(part).__module__.startswith("torch."):
            held.add(id(g))  # a torch sampler's generator=: in the epoch-start snapshot
    return held


class _Items(TypedDict):
    items: dict[str, dict[str, str]]  # path -> kind, type, sha (and value, metric) (``Census.take``)


class Point(_Items, total=False):
    """One census of a run, or why it could not be taken (its items then empty)."""

    error: str


class _At(TypedDict):
    at: int  # the resume point k


class CensusRecord(_At, total=False):
    """A run's census (``census``): at the resume point (the state after step k, with step k+1's
    batch in hand) and after step k+1, as far as the run got."""

    resume: Point
    next: Point


class Points:
    """The census of one run at the resume point k (the state after step k, with step k+1's
    batch in hand) and after step k+1: run A (which checkpoints at k) and run C (which resumes
    from k) take them; other runs take none."""

    def __init__(self, k: int | None) -> None:
        self.k = k
        self.taken: CensusRecord | None = None

    def before_step(self, setup: TrainSetup, step: int) -> None:
        """Called with the number of steps taken so far, before the next one."""
        if self.k is not None and step == self.k:
            self._taken(self.k)["resume"] = _safe(setup)

    def after_step(self, setup: TrainSetup, step: int) -> None:
        if self.k is not None and step == self.k + 1:
            self._taken(self.k)["next"] = _safe(setup)

    def _taken(self, k: int) -> CensusRecord:
        if self.taken is None:
            self.taken = {"at": k}
        return self.taken

    def to_record(self) -> CensusRecord | None:
        return self.taken


def _safe(setup: TrainSetup) -> Point:
    """A census, or why it could not be taken: it never fails a training run."""
    try:
        return {"items": take(setup)}
    except Exception as e:  # noqa: BLE001 - the plugin's objects may raise anywhere when read
        return {"items": {}, "error": f"{type(e).__name__}: {str(e)[:200]}"}


