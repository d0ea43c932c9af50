"""The model plugin contract.

A model is a factory ``factory(ctx: ModelContext) -> TrainSetup``. The harness owns
seeding, determinism flags, the training loop, checkpointing and hashing; the factory
provides the model, optimizer, optional scheduler, the data pipeline and the loss of
one step, and may expose extra state (a private generator, say) for checkpoints.

Refer to a factory as ``conv`` (a reference model), ``path/to/file.py:factory`` or
``package.module:factory``.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import re
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

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
    loss_fn: Callable[..., Any]  # (model, batch), or (model, batch, items) with step_items
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
    after_backward: Callable[[], None] | None = None  # after each batch's backward (each micro-batch's)
    # The items a step's loss is normalised by, from the step's batches (HF Trainer's
    # num_items_in_batch: the label tokens of all its micro-batches): passed to loss_fn as a third
    # argument, and each batch's loss is then not divided by ``accumulate`` (the sum over the
    # step's items already is the step's mean).
    step_items: Callable[[list[Any]], Any] | None = None

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


# The optional libraries a plugin, an example or an adapter (reproci.adapters) imports, by
# import name: (the distribution to install, the extra of pyproject.toml that installs it).
OPTIONAL_PACKAGES: dict[str, tuple[str, str | None]] = {
    "transformers": ("transformers", "hf"), "accelerate": ("accelerate", "hf"), "tokenizers": ("tokenizers", "hf"),
    "pytorch_lightning": ("pytorch-lightning", "lightning"), "torchmetrics": ("torchmetrics", "lightning"),
    "lightning": ("lightning", None)}  # the unified package: reproci[lightning] installs pytorch-lightning
EXTRAS = {"hf": "transformers, accelerate", "lightning": "pytorch-lightning"}  # what each extra installs
_REQUIRES = re.compile(r"\brequires\W+([A-Za-z_][\w-]*)")  # transformers' "requires `accelerate>=1.1.0`"


def model_name(ref: str) -> str:
    """The name results give the model of ``ref`` (as ``reproci.settings.models.resolve`` names it)."""
    from reproci.reference_models import REGISTRY

    if ref in REGISTRY:
        return ref
    target, _, attr = ref.rpartition(":")
    stem = Path(target).stem if target.endswith(".py") else target.rpartition(".")[2]
    return stem if attr == "build" else f"{stem}.{attr}"


def missing_package(e: BaseException) -> tuple[str, str, str] | None:
    """(the missing import name, what needs it, "imports" or "requires") when ``e``, or an
    error it was raised from, says an optional library is not installed; else None. A name that
    cannot be imported from an installed library (``cannot import name``) is not a missing one."""
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        name = (cur.name or "") if isinstance(cur, ModuleNotFoundError) else ""
        top = name.split(".")[0]
        if top in OPTIONAL_PACKAGES and (name == top or _absent(top)):  # accelerate.utils: accelerate itself
            return top, _importer(cur, top), "imports"
        if isinstance(cur, ImportError) and not isinstance(cur, ModuleNotFoundError):
            for asked in _REQUIRES.findall(str(cur)):
                name = asked.replace("-", "_")
                if name in OPTIONAL_PACKAGES and _absent(name):
                    return name, _importer(cur, name, innermost=True), "requires"
        cur = cur.__cause__ or (None if cur.__suppress_context__ else cur.__context__)
    return None


def _absent(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is None
    except (ImportError, ValueError):
        return True


def _importer(e: BaseException, package: str, *, innermost: bool = False) -> str:
    """Who imported (or asked for) ``package``: the innermost frame of ``e`` outside the import
    machinery and the package itself, named by its class (a method's ``self``), its module, or
    a plugin file's name."""
    for frame, _ in reversed(list(traceback.walk_tb(e.__traceback__))):
        module = str(frame.f_globals.get("__name__") or "")
        if frame.f_code.co_filename.startswith("<frozen") or module.split(".")[0] in ("importlib", package):
            continue
        owner = frame.f_locals.get("self")
        if innermost and owner is not None and not isinstance(owner, type(sys)):
            return type(owner).__name__
        if not module or module == "__main__" or module.startswith("reproci_plugin_"):  # a plugin file
            return Path(frame.f_code.co_filename).name
        return module
    return "the model"


def install_hint(package: str) -> str:
    """What to run for a missing optional package: the extra that brings it; inside a
    container (the worker's code mounted under /reproci/code), the image must have it."""
    dist, extra = OPTIONAL_PACKAGES[package]
    if Path(__file__).resolve().as_posix().startswith("/reproci/code/"):
        return f"install {EXTRAS[extra] if extra else dist} in the image"
    return f"pip install 'reproci[{extra}]'" if extra else f"pip install {dist}"


@contextlib.contextmanager
def _needs_packages(name: str) -> Iterator[None]:
    """A missing optional library, while the plugin is imported or its factory runs, as one
    ContractError that says what to install."""
    try:
        yield
    except ImportError as e:
        found = missing_package(e)
        if found is None:
            raise
        package, who, verb = found
        raise ContractError(f"model {name!r} needs the package {OPTIONAL_PACKAGES[package][0]!r} ({who} {verb} it): "
                            f"{install_hint(package)}") from e


def load_factory(ref: str, plugin_paths: Iterable[str] = ()) -> Callable[[ModelContext], TrainSetup]:
    """Resolve a reference model name or a plugin reference to its factory; an optional library
    missing as the plugin is imported or its factory runs is a ContractError naming its install."""
    from reproci.reference_models import REGISTRY

    name = model_name(ref)
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
        with _needs_packages(name):
            spec.loader.exec_module(module)
    else:
        try:
            with _needs_packages(name):
                module = importlib.import_module(target)
        except ModuleNotFoundError as e:
            raise ContractError(f"cannot import model module {target!r}: {e}") from e
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ContractError(f"{target} has no callable {attr!r}")

    @functools.wraps(factory)
    def checked(ctx: ModelContext) -> TrainSetup:
        with _needs_packages(name):
            return factory(ctx)
    return checked


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
    # a scalar as it is: a view of it would be one more op in the step's recorded ops (goldens' per-op hashes)
    return loss if loss.dim() == 0 else loss.reshape(())


def validate(setup: object, ref: str) -> TrainSetup:
    """Check a factory's return value against the contract, with a message that says what to
    fix; a list of optimizers or schedulers becomes one (``steppers``)."""
    from .steppers import OptimizerLike, Optimizers, Schedules, optimizer_like

    if not isinstance(setup, TrainSetup):
        raise ContractError(f"{ref} returned {type(setup).__name__}, not reproci.worker.contract.TrainSetup")
    if not isinstance(setup.model, torch.nn.Module):
        raise ContractError(f"{ref}: TrainSetup.model is not a torch.nn.Module")
    if isinstance(setup.optimizer, (list, tuple)) and setup.optimizer:  # an optimizer-like one is wrapped as one
        setup.optimizer = [OptimizerLike(o) if optimizer_like(o) else o for o in setup.optimizer]
        if all(isinstance(o, torch.optim.Optimizer) for o in setup.optimizer):
            setup.optimizer = Optimizers(setup.optimizer) if len(setup.optimizer) > 1 else setup.optimizer[0]
    elif optimizer_like(setup.optimizer):
        setup.optimizer = OptimizerLike(setup.optimizer)
    if not isinstance(setup.optimizer, torch.optim.Optimizer):
        raise ContractError(f"{ref}: TrainSetup.optimizer is not a torch.optim.Optimizer, nor has its interface "
                            f"(step, zero_grad, state_dict, load_state_dict, param_groups, state), nor a list of them")
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
    if setup.step_items is not None and not callable(setup.step_items):
        raise ContractError(f"{ref}: TrainSetup.step_items is not callable (give a function batches -> items)")
    if setup.after_backward is not None and not callable(setup.after_backward):
        raise ContractError(f"{ref}: TrainSetup.after_backward is not callable (give a function () -> None)")
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
