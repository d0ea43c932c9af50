"""Several optimizers as one, and every kind of scheduler stepped the way its library steps it.

``Optimizers``: a list given as ``TrainSetup.optimizer`` (SparseAdam for an embedding, AdamW
for the rest) is one optimizer to the harness: its ``param_groups`` and ``state`` are the
members' (live views: an entry an optimizer adds or replaces is seen at once), ``step`` and
``zero_grad`` go to each, and its state dict holds each member's. So every member is stepped,
checkpointed, fingerprinted (``optim:PARAM.KEY``: the parameters are disjoint) and compared.

``Schedules``: ``TrainSetup.scheduler`` may be one scheduler or a list of them, of any kind:

- a torch scheduler (``LambdaLR``, ``OneCycleLR``, HF's ``get_*_schedule_*``): ``step()`` after
  every optimizer step;
- ``ReduceLROnPlateau``: ``step(loss)`` after every step, fed the step's loss;
- a scheduler with ``step_update`` (timm's): ``step_update(num_updates=step)`` after every
  step, and ``step(epoch)`` as each epoch begins, as timm's training loop does;
- ``EveryEpoch(s)``: ``s`` stepped once as each epoch ends instead of every step (Lightning's
  ``"interval": "epoch"``); a plateau scheduler inside is stepped after the new epoch's first
  step, fed that step's loss (known alike to a run from scratch and a resumed one).

Their state dicts are checkpointed together, and a resumed run steps them from where the
checkpoint left them.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Iterable, TypedDict

import torch


class EveryEpoch:
    """A scheduler stepped once per epoch, as the epoch ends (not after every step)."""

    def __init__(self, scheduler: Any) -> None:
        self.scheduler = scheduler

    def state_dict(self) -> dict[str, Any]:
        return self.scheduler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state)


class _Handles:
    def __init__(self, handles: list[Any]) -> None:
        self.handles = handles

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


class Optimizers(torch.optim.Optimizer):
    """Several optimizers stepped, checkpointed and fingerprinted as one."""

    def __init__(self, optimizers: Iterable[torch.optim.Optimizer]) -> None:  # noqa: D107 - no super().__init__: no groups of its own
        self.optimizers = list(optimizers)
        self.defaults: dict[str, Any] = {}
        self._optimizer_step_pre_hooks: OrderedDict = OrderedDict()
        self._optimizer_step_post_hooks: OrderedDict = OrderedDict()

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return [g for o in self.optimizers for g in o.param_groups]

    @property
    def state(self) -> dict[Any, Any]:
        merged: dict[Any, Any] = {}
        for o in self.optimizers:
            merged.update(o.state)
        return merged

    def zero_grad(self, set_to_none: bool = True) -> None:
        for o in self.optimizers:
            o.zero_grad(set_to_none=set_to_none)

    def step(self, closure: Any = None) -> None:
        for o in self.optimizers:
            o.step()

    def state_dict(self) -> dict[str, Any]:
        return {"optimizers": [o.state_dict() for o in self.optimizers]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        for o, s in zip(self.optimizers, state_dict["optimizers"], strict=True):
            o.load_state_dict(s)

    def register_step_pre_hook(self, hook: Any) -> _Handles:
        return _Handles([o.register_step_pre_hook(lambda _opt, args, kwargs: hook(self, args, kwargs))
                         for o in self.optimizers])

    def __repr__(self) -> str:
        return f"Optimizers({', '.join(type(o).__name__ for o in self.optimizers)})"


OPTIMIZER_INTERFACE = ("step", "zero_grad", "state_dict", "load_state_dict")


def optimizer_like(o: Any) -> bool:
    """An optimizer that is not a ``torch.optim.Optimizer`` but has its interface (schedule-free's
    ``ScheduleFreeWrapper``, a wrapper of a library's): step, zero_grad, state_dict,
    load_state_dict, and the parameter groups and per-parameter state a torch optimizer has."""
    if isinstance(o, torch.optim.Optimizer) or not all(callable(getattr(o, m, None)) for m in OPTIMIZER_INTERFACE):
        return False
    try:
        groups, state = o.param_groups, o.state
    except Exception:  # noqa: BLE001 - a property that raises: not the interface
        return False
    return isinstance(groups, list) and all(isinstance(g, dict) and "params" in g for g in groups) \
        and hasattr(state, "items")


class OptimizerLike(torch.optim.Optimizer):
    """An ``optimizer_like`` object as the loop steps, checkpoints (through its own state_dict
    and load_state_dict) and fingerprints (its groups and per-parameter state) a torch optimizer."""

    def __init__(self, inner: Any) -> None:  # noqa: D107 - no super().__init__: the groups are the inner's
        self.inner = inner
        self.defaults: dict[str, Any] = dict(getattr(inner, "defaults", None) or {})
        self._optimizer_step_pre_hooks: OrderedDict = OrderedDict()
        self._optimizer_step_post_hooks: OrderedDict = OrderedDict()

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return list(self.inner.param_groups)

    @property
    def state(self) -> Any:
        return self.inner.state

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.inner.zero_grad(set_to_none=set_to_none)

    def step(self, closure: Any = None) -> Any:
        return self.inner.step() if closure is None else self.inner.step(closure)

    def state_dict(self) -> dict[str, Any]:
        return dict(self.inner.state_dict())

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.inner.load_state_dict(state_dict)

    def __repr__(self) -> str:
        return f"OptimizerLike({type(self.inner).__name__})"


def _kind(s: Any) -> str:
    if isinstance(s, EveryEpoch):
        return "epoch"
    if isinstance(s, torch.optim.lr_scheduler.ReduceLROnPlateau):
        return "plateau"
    if callable(getattr(s, "step_update", None)):
        return "timm"
    return "step"


class SchedulesState(TypedDict):
    """What ``Schedules`` checkpoints: each scheduler's own state dict, in order."""

    schedulers: list[dict[str, Any]]


class Schedules:
    """The plugin's schedulers, stepped as their kinds ask (see the module's docstring)."""

    def __init__(self, schedulers: list[Any]) -> None:
        self.schedulers = schedulers
        self._plateaus: list[Any] = []  # epoch-stepped plateau schedulers waiting for a loss

    @classmethod
    def of(cls, scheduler: Any) -> "Schedules | None":
        if scheduler is None or isinstance(scheduler, Schedules):
            return scheduler
        return cls(list(scheduler) if isinstance(scheduler, (list, tuple)) else [scheduler])

    def problem(self) -> str | None:
        """What makes a scheduler unusable, or None."""
        for s in self.schedulers:
            inner = s.scheduler if isinstance(s, EveryEpoch) else s
            if not callable(getattr(inner, "step", None)):
                return f"{type(inner).__name__} has no step(): give a torch, timm or HF scheduler"
            if not (callable(getattr(s, "state_dict", None)) and callable(getattr(s, "load_state_dict", None))):
                return f"{type(inner).__name__} has no state_dict()/load_state_dict(): it cannot be checkpointed"
        return None

    def stepped(self, step: int, loss: torch.Tensor) -> None:
        """After optimizer step ``step`` (1-based), whose loss was ``loss``."""
        for s in self.schedulers:
            kind = _kind(s)
            if kind == "step":
                s.step()
            elif kind == "plateau":
                s.step(float(loss))
            elif kind == "timm":
                s.step_update(num_updates=step)
        for inner in self._plateaus:
            inner.step(float(loss))
        self._plateaus = []

    def epoch_ended(self, epoch: int) -> None:
        """Epoch ``epoch`` (0-based) is over: the next step takes the first batch of the next."""
        for s in self.schedulers:
            kind = _kind(s)
            if kind == "timm":
                s.step(epoch + 1)
            elif kind == "epoch":
                inner = s.scheduler
                if isinstance(inner, torch.optim.lr_scheduler.ReduceLROnPlateau):
                    self._plateaus.append(inner)
                else:
                    inner.step()

    def state_dict(self) -> SchedulesState:
        return {"schedulers": [s.state_dict() for s in self.schedulers]}

    def load_state_dict(self, state: SchedulesState) -> None:
        for s, d in zip(self.schedulers, state["schedulers"], strict=True):
            s.load_state_dict(d)
