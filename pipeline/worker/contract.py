"""The model plugin contract.

A model is a factory ``factory(ctx: ModelContext) -> TrainSetup``. The harness owns
seeding, determinism flags, the training loop, checkpointing and hashing; the factory
provides the model, optimizer, optional scheduler, the data pipeline and the loss of
one step, and may expose extra state (a private generator, say) for checkpoints.

Refer to a factory as ``conv`` (a reference model), ``path/to/file.py:factory`` or
``package.module:factory``.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np
import torch


class ContractError(Exception):
    """A model factory or its TrainSetup breaks the plugin contract."""


@dataclass(frozen=True)
class ModelContext:
    """What the harness gives a factory."""

    profile: str  # "quick" (CPU-sized) or "full" (GPU-sized)
    device: torch.device
    seed: int
    rank: int = 0  # this process's rank under DistributedDataParallel (--world-size)
    world_size: int = 1  # ranks in the job; the harness wraps the model in DDP when above 1
    # Optimizer steps N of a run from scratch (--steps), the same in every run of a check: the
    # length of a schedule (HF's num_training_steps). A resumed run is told N, not N - k.
    steps: int = 30

    def generator(self, offset: int = 0) -> torch.Generator:
        """A CPU generator seeded from the run seed; give one to every DataLoader."""
        g = torch.Generator()
        g.manual_seed(self.seed * 1_000_003 + offset)
        return g

    def shuffling(self, dataset: Any) -> dict[str, Any]:
        """DataLoader arguments that shuffle ``dataset``: ``shuffle=True`` in one process, and
        above one rank this rank's shard from a seeded ``DistributedSampler`` (the harness calls
        its ``set_epoch`` each epoch, so each epoch has its own order)."""
        if self.world_size <= 1:
            return {"shuffle": True}
        return {"sampler": torch.utils.data.DistributedSampler(
            dataset, num_replicas=self.world_size, rank=self.rank, shuffle=True, seed=self.seed)}

    @staticmethod
    def seed_worker(worker_id: int) -> None:
        """``worker_init_fn``: seed python and numpy in a loader worker from torch's seed."""
        import random

        s = torch.initial_seed() % 2**32
        np.random.seed(s)
        random.seed(s)


@dataclass
class TrainSetup:
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer  # or a list of them, each stepped (steppers.Optimizers)
    loader: Iterable[Any]  # re-iterable once per epoch, e.g. a DataLoader with a generator
    # (model, batch on device) -> the loss: a scalar tensor, or an output with .loss (HF's
    # ModelOutput) or a "loss" key (Lightning's dict); under accumulation, one micro-batch's
    loss_fn: Callable[[torch.nn.Module, Any], Any]
    scheduler: Any | None = None  # one or a list: torch, ReduceLROnPlateau, timm, EveryEpoch (steppers.py)
    scaler: Any | None = None  # torch.amp.GradScaler
    grad_clip: float | None = None
    batch_size: int | None = None  # samples per step, for samples/s
    config: dict[str, Any] = field(default_factory=dict)  # part of the model's identity
    loader_generator: torch.Generator | None = None  # defaults to loader.generator
    get_extra_state: Callable[[], dict[str, Any]] | None = None
    set_extra_state: Callable[[dict[str, Any]], None] | None = None
    # Held-out evaluation, called once after the last step under torch.no_grad() with the
    # model in eval mode (train mode is put back after): metric name -> value. A name ending
    # in "loss" or "error" is lower-is-better; any other metric (accuracy) is higher-is-better.
    eval_fn: Callable[[torch.nn.Module], dict[str, float]] | None = None
    ddp_options: dict[str, Any] = field(default_factory=dict)  # DistributedDataParallel keyword arguments
    # Modules that are training state besides the model: a weight EMA (``swa_utils.AveragedModel``,
    # timm's ``ModelEmaV3``), a teacher, a target network. Their tensors are fingerprinted every
    # step (``state:NAME.TENSOR``), part of the final hash, checkpointed and restored like the model.
    state_modules: dict[str, torch.nn.Module] = field(default_factory=dict)
    accumulate: int = 1  # micro-batches (loader batches) per optimizer step; each loss is divided by it
    after_step: Callable[[int], None] | None = None  # after each optimizer step (1-based): update an EMA here

    def generator(self) -> torch.Generator | None:
        """The generator that decides the loader's order and worker seeds, if any."""
        batch_sampler = getattr(self.loader, "batch_sampler", None)
        for g in (self.loader_generator, getattr(self.loader, "generator", None),
                  getattr(getattr(self.loader, "sampler", None), "generator", None),
                  getattr(batch_sampler, "generator", None), getattr(getattr(batch_sampler, "sampler", None), "generator", None)):
            if isinstance(g, torch.Generator):
                return g
        return None


def _split(ref: str) -> tuple[str, str]:
    target, sep, attr = ref.rpartition(":")
    if not sep or not target or not attr:
        raise ContractError(f"model reference {ref!r} needs the form FILE.py:FACTORY or MODULE:FACTORY")
    return target, attr


def load_factory(ref: str, plugin_paths: Iterable[str] = ()) -> Callable[[ModelContext], TrainSetup]:
    """Resolve a reference model name or a plugin reference to its factory."""
    from reference_models import REGISTRY

    if ref in REGISTRY:
        ref = REGISTRY[ref]
    for p in plugin_paths:
        if p not in sys.path:
            sys.path.insert(0, p)
    target, attr = _split(ref)
    if target.endswith(".py"):
        path = Path(target)
        if not path.is_file():
            raise ContractError(f"model file {target} does not exist")
        mod_name = f"reproci_plugin_{path.stem}"
        spec = importlib.util.spec_from_file_location(mod_name, path)
        if spec is None or spec.loader is None:
            raise ContractError(f"cannot import model file {target}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[mod_name] = module
        sys.path.insert(0, str(path.parent.resolve()))
        spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(target)
        except ModuleNotFoundError as e:
            raise ContractError(f"cannot import model module {target!r}: {e}") from e
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ContractError(f"{target} has no callable {attr!r}")
    return factory


def loss_of(out: Any) -> torch.Tensor:
    """The scalar loss in what ``loss_fn`` returned, or a ContractError naming ``loss_fn``."""
    loss = out.get("loss") if isinstance(out, dict) else getattr(out, "loss", out)
    if not isinstance(loss, torch.Tensor):
        what = type(out).__name__ if loss is out else f"{type(out).__name__} whose loss is {type(loss).__name__}"
        raise ContractError(f"loss_fn returned {what}; return the step's loss as a scalar tensor "
                            "(or an output with .loss, such as a ModelOutput given labels)")
    if loss.numel() != 1:
        raise ContractError(f"loss_fn returned a loss of shape {tuple(loss.shape)}; reduce it to a scalar "
                            "(.mean() or .sum())")
    return loss.reshape(())


def validate(setup: object, ref: str) -> TrainSetup:
    """Check a factory's return value against the contract, with a message that says what to
    fix; a list of optimizers or schedulers becomes one (``steppers``)."""
    from .steppers import Optimizers, Schedules

    if not isinstance(setup, TrainSetup):
        raise ContractError(f"{ref} returned {type(setup).__name__}, not pipeline.worker.contract.TrainSetup")
    if not isinstance(setup.model, torch.nn.Module):
        raise ContractError(f"{ref}: TrainSetup.model is not a torch.nn.Module")
    if isinstance(setup.optimizer, (list, tuple)) and setup.optimizer \
            and all(isinstance(o, torch.optim.Optimizer) for o in setup.optimizer):
        setup.optimizer = Optimizers(setup.optimizer) if len(setup.optimizer) > 1 else setup.optimizer[0]
    if not isinstance(setup.optimizer, torch.optim.Optimizer):
        raise ContractError(f"{ref}: TrainSetup.optimizer is not a torch.optim.Optimizer (or a list of them)")
    if not callable(setup.loss_fn):
        raise ContractError(f"{ref}: TrainSetup.loss_fn is not callable")
    setup.scheduler = Schedules.of(setup.scheduler)
    problem = setup.scheduler.problem() if setup.scheduler is not None else None
    if problem:
        raise ContractError(f"{ref}: TrainSetup.scheduler: {problem}")
    if not isinstance(setup.accumulate, int) or isinstance(setup.accumulate, bool) or setup.accumulate < 1:
        raise ContractError(f"{ref}: TrainSetup.accumulate must be a whole number of micro-batches, at least 1")
    if setup.after_step is not None and not callable(setup.after_step):
        raise ContractError(f"{ref}: TrainSetup.after_step is not callable (give a function step -> None)")
    if setup.eval_fn is not None and not callable(setup.eval_fn):
        raise ContractError(f"{ref}: TrainSetup.eval_fn is not callable (give a function model -> dict of metrics, or None)")
    modules = setup.state_modules
    if not isinstance(modules, dict) or not all(isinstance(k, str) and isinstance(m, torch.nn.Module)
                                                for k, m in modules.items()):
        raise ContractError(f"{ref}: TrainSetup.state_modules must be a dict of name -> torch.nn.Module "
                            "(e.g. {'ema': ema_model})")
    if (setup.get_extra_state is None) != (setup.set_extra_state is None):
        raise ContractError(f"{ref}: give both get_extra_state and set_extra_state, or neither")
    loader = setup.loader
    if isinstance(loader, torch.utils.data.DataLoader) and setup.generator() is None:
        # torch's own samplers draw their order from the loader generator; a sampler (or a
        # batch sampler) of the plugin's own seeds itself (from ctx.seed, say) and is accepted
        # as it is. Given a batch_sampler, the DataLoader's own sampler is an unused
        # SequentialSampler: the batch sampler, and a sampler inside it, decide the order.
        if loader.batch_sampler is None:  # automatic batching off: the sampler yields whole batches
            samplers = [loader.sampler]
        else:
            samplers = [s for s in (loader.batch_sampler, getattr(loader.batch_sampler, "sampler", None)) if s is not None]
        own_sampler = any(not type(s).__module__.startswith("torch.") for s in samplers)
        shuffles = any(isinstance(s, torch.utils.data.RandomSampler) for s in samplers)
        if shuffles or (loader.num_workers > 0 and not own_sampler):
            what = "shuffles" if shuffles else f"uses {loader.num_workers} worker processes"
            inside = shuffles and loader.sampler not in samplers  # a RandomSampler inside the batch_sampler
            fix = ("pass generator=ctx.generator() to the RandomSampler inside its batch_sampler" if inside
                   else "pass generator=ctx.generator() to the DataLoader")
            raise ContractError(f"{ref}: the DataLoader {what} but nothing seeds its order: {fix}, "
                                "or give it a sampler of your own that seeds itself")
    elif not hasattr(loader, "__iter__"):
        raise ContractError(f"{ref}: TrainSetup.loader is not iterable")
    return setup
