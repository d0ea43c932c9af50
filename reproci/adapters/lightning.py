"""A LightningModule, as it is, as a TrainSetup: no rewrite of its training code.

    from reproci.adapters.lightning import lightning_setup

    def build(ctx):
        return lightning_setup(ctx, MyModule(), grad_clip=1.0, accumulate=2)

It needs pytorch-lightning (``pip install 'reproci[lightning]'``), or the ``lightning`` package.

What it takes from the module, as ``Trainer`` (automatic optimization) uses it:

- the hooks ``Trainer.fit`` calls before the first step, in its order (``Trainer._run``, then
  the fit loop): ``prepare_data`` (the datamodule's, then the module's; on rank 0 only, the
  other ranks waiting, as for ``prepare_data_per_node``), ``setup("fit")`` (the datamodule's,
  then the module's; ``self.device`` is the run's device there), ``configure_sharded_model``
  and ``configure_model`` (tensors created on the run's device, as the Trainer's
  ``tensor_init_context`` does), ``configure_optimizers``, ``on_fit_start``,
  ``train_dataloader``, ``on_train_start``. They run in every run, the resumed one included,
  after reproci has seeded the process: a ``setup`` that draws random numbers draws the same
  ones each time.
- the hooks of each training batch and step, in the Trainer's order (``lightning_fit``):
  ``on_train_epoch_start``, ``on_after_batch_transfer``, ``on_train_batch_start``,
  ``on_before_zero_grad``, ``optimizer_zero_grad``, ``on_before_backward``,
  ``on_after_backward``, ``optimizer_step`` (Lightning's documented warm-up),
  ``on_before_optimizer_step``, ``configure_gradient_clipping``, ``on_train_batch_end``,
  ``on_train_epoch_end``. ``self.trainer`` is what a Trainer fitting with
  ``max_steps=ctx.steps`` gives (``global_step``, ``current_epoch``,
  ``estimated_stepping_batches``, ...); anything else of it is one line that names it.
- every other hook of the installed Lightning is in one of ``lightning_fit``'s tables: not part
  of training (validation's, testing's, prediction's, teardown), or refused where the module or
  the datamodule overrides it (``backward``, ``lr_scheduler_step``, ``configure_callbacks``,
  the batch transfer hooks before the device, ``on_train_end``, ``on_fit_end``), as is a hook a
  newer release adds. An epoch whose batches do not divide into ``accumulate`` is refused (the
  Trainer steps at the epoch's end with what is left).

- ``training_step(batch, batch_idx)``: the loss (a tensor, or a dict with ``"loss"``);
  ``batch_idx`` is the batch's index in its epoch, checkpointed with the run, so a resumed run
  passes the same indices. ``self.log``/``self.log_dict`` are quiet outside a Trainer.
- ``configure_optimizers()`` in every form Lightning takes: an optimizer; a list of one; a
  tuple ``([optimizer], [scheduler, ...])``; a dict ``{"optimizer", "lr_scheduler"}`` whose
  scheduler is a scheduler or a config ``{"scheduler", "interval", "frequency", "monitor"}``; a
  list of such dicts. ``"interval": "step"`` steps after every optimizer step, ``"epoch"`` (the
  default, as in Lightning) as each epoch ends; ``ReduceLROnPlateau`` is fed the training loss
  (the ``monitor`` metric is the Trainer's to compute, which reproci does not run).
  ``frequency`` above 1 and several optimizers (manual optimization) are refused.
- ``train_dataloader()`` (or ``datamodule.train_dataloader()``): rebuilt with a sampler seeded
  from the run seed where it shuffles without a generator (as ``Trainer`` relies on
  ``seed_everything`` for), its workers seeded; everything else as the module made it.
- ``val_dataloader()`` and ``validation_step``: with both, the mean of what validation_step
  returns (a tensor, or a dict's ``"loss"``/``"val_loss"``) is the run's ``val_loss`` metric.
- What the Trainer's checkpoint holds besides the ``state_dict``, saved and restored with the
  run's checkpoint as ``Trainer.save_checkpoint`` and a resume (``fit(ckpt_path=...)``) do it:
  the datamodule's ``state_dict()`` (put back with its ``load_state_dict``) and what the
  module's ``on_save_checkpoint(checkpoint)`` adds to the checkpoint dict (given back to its
  ``on_load_checkpoint``; the dict also holds ``state_dict``, ``epoch``, ``global_step``, the
  datamodule's state under its class name and the Lightning version, as Lightning's does, but
  only the keys the hook adds are kept). A resume calls ``on_load_checkpoint`` first, then the
  datamodule's ``load_state_dict``, as Lightning 2 does.
  Other state of your own: ``get_extra_state``/``set_extra_state``, as in any ``TrainSetup``,
  checkpointed beside it. A resume puts each tensor of the Trainer's state back on the device it
  was saved from (as Lightning loads it), and each torchmetrics metric's states on its device.

What a ``Trainer`` would be told is given here: ``grad_clip`` (``gradient_clip_val``),
``accumulate`` (``accumulate_grad_batches``), ``precision`` ("32", "bf16-mixed" or
"16-mixed"), ``deterministic`` (Lightning's own ``_set_torch_flags``, as the Trainer applies
it; ``True`` coexists with reproci's own controls, as does ``seed_everything`` in the factory).
"""

from __future__ import annotations

from typing import Any, Callable, TypedDict

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from reproci.worker.contract import ContractError, ModelContext, TrainSetup, loss_of
from reproci.worker.state.census import is_metric
from reproci.worker.steppers import EveryEpoch

try:  # here first, so that a missing Lightning is named as this module's import
    import lightning.pytorch as pl
except ImportError:  # the older package name
    import pytorch_lightning as pl

from . import lightning_fit as fit  # noqa: E402
from .lightning_fit import overridden as _overridden  # noqa: E402

# The hooks around an optimizer step: where the module overrides one, the optimizer is stepped
# through them (lightning_fit.Stepped), the clipping with them, as the Trainer's precision plugin does.
_STEP_HOOKS = ("on_before_zero_grad", "optimizer_zero_grad", "optimizer_step", "on_before_optimizer_step",
               "configure_gradient_clipping")

_FN = getattr(getattr(getattr(pl, "trainer", None), "states", None), "TrainerFn", None)
FITTING = _FN.FITTING if _FN is not None else "fit"  # what Trainer.fit passes to setup(stage=...)
# The modules whose ``self.device`` the Trainer sets before ``setup`` (LightningModule is one).
_TRAINER_STATE = ("datamodule", "on_save_checkpoint")  # what a Trainer's checkpoint holds beside the state_dict
_DEVICE_MIXIN = next((c for c in pl.LightningModule.__mro__ if c.__name__ == "_DeviceDtypeModuleMixin"), pl.LightningModule)


def lightning_setup(ctx: ModelContext, module: "pl.LightningModule", *, datamodule: Any = None,
                    grad_clip: float | None = None, accumulate: int = 1, precision: str = "32",
                    deterministic: bool | None = None, **setup: Any) -> TrainSetup:
    """The TrainSetup of ``module`` as ``Trainer(...).fit(module)`` would train it;
    ``deterministic=True`` applies the Trainer's own switch (``_set_torch_flags``)."""
    if deterministic is not None:
        _trainer_flags(deterministic)
    if not isinstance(module, pl.LightningModule):
        raise ContractError(f"lightning_setup: {type(module).__name__} is not a LightningModule")
    if not module.automatic_optimization:
        raise ContractError("lightning_setup: manual optimization (automatic_optimization = False) is not supported: "
                            "build the TrainSetup by hand, with the optimizers as a list")
    source = datamodule if datamodule is not None else module
    if not callable(getattr(source, "train_dataloader", None)):
        raise ContractError(f"lightning_setup: the datamodule, a {type(source).__name__}, has no train_dataloader()")
    fit.refuse_unsupported(module, datamodule)
    module.log = lambda *a, **k: None  # a Trainer's logger is not there
    module.log_dict = lambda *a, **k: None
    trainer = fit.Trainer(ctx, module, datamodule, per_epoch=None, accumulate=accumulate, grad_clip=grad_clip,
                          precision=precision)
    module.trainer = trainer  # self.trainer in every hook, as in a fitting Trainer
    if datamodule is not None:
        datamodule.trainer = trainer
    _before_fit(ctx, module, datamodule)
    module = module.to(ctx.device)
    optimizer, schedulers = _optimizers(_hook(module, "configure_optimizers"))
    trainer.optimizers = [optimizer]
    _hook(module, "on_fit_start")
    loader = seeded(_hook(source, "train_dataloader"), ctx)
    _hook(module, "on_train_start")
    per_epoch = len(loader) if hasattr(loader, "__len__") else None
    if per_epoch and accumulate > 1 and per_epoch % accumulate:
        raise ContractError(f"lightning_setup: {per_epoch} batches an epoch do not divide into accumulate={accumulate}: "
                            "the Trainer steps at each epoch's end with the batches left, reproci across the epoch's end; "
                            "make the batches an epoch a multiple of accumulate")
    trainer.num_training_batches = per_epoch or float("inf")
    calls = {"n": 0}  # training_step calls so far: the batch index, checkpointed as extra state
    autocast = _autocast(precision, ctx.device)
    last = fit.Batch()  # the training batch being stepped, as its later hooks are given it
    if any(_overridden(module, pl.LightningModule, h) for h in _STEP_HOOKS):
        module.clip_gradients = fit.clip_gradients  # the precision plugin's, which the Trainer would give
        optimizer = fit.Stepped(optimizer, module, trainer, last)
        grad_clip = None  # clipped in the optimizer's step, after on_before_optimizer_step
    loss_fn, batch_hooks = _batch_hooks(module, datamodule, trainer, calls, per_epoch, accumulate, autocast,
                                        setup.pop("after_step", None), last,
                                        optimizer if isinstance(optimizer, fit.Stepped) else None)
    return TrainSetup(model=module, optimizer=optimizer, loader=loader, loss_fn=loss_fn, scheduler=schedulers or None,
                      grad_clip=grad_clip, accumulate=accumulate, batch_size=getattr(loader, "batch_size", None),
                      scaler=torch.amp.GradScaler("cuda") if precision.startswith("16") else None, **batch_hooks,
                      **_checkpointed(module, datamodule, calls, per_epoch, accumulate, setup, trainer),
                      eval_fn=_validation(module, source, ctx.device, autocast),
                      config={"lightning_module": type(module).__name__, "hparams": dict(module.hparams),
                              **({"lightning_datamodule": type(datamodule).__name__,
                                  "datamodule_hparams": dict(getattr(datamodule, "hparams", {}))}
                                 if datamodule is not None else {}),
                              "precision": precision, **setup.pop("config", {})}, **setup)


class _BatchHooks(TypedDict):
    """The TrainSetup's hooks around each batch and step, where the module has any to run."""

    after_backward: Callable[[], None] | None
    after_step: Callable[[int], None] | None


def _batch_hooks(module: Any, datamodule: Any, trainer: fit.Trainer, calls: dict[str, int], per_epoch: int | None,
                 accumulate: int, autocast: Any, user_after_step: Any, last: fit.Batch,
                 stepped: fit.Stepped | None) -> tuple[Callable[[Any, Any], torch.Tensor], _BatchHooks]:
    """``loss_fn`` and the TrainSetup's ``after_backward``/``after_step``: the hooks of each
    training batch in the Trainer's order (``lightning_fit``'s docstring), each called where
    the module (or the datamodule) overrides it."""
    def own(name: str) -> bool:
        return _overridden(module, pl.LightningModule, name)

    # One of them, as Lightning's DataHookSelector picks it: the datamodule's where it has its own.
    transfers = [o for o, base in ((datamodule, pl.LightningDataModule), (module, pl.LightningModule))
                 if o is not None and _overridden(o, base, "on_after_batch_transfer")][:1]

    def loss_fn(m: Any, batch: Any) -> torch.Tensor:
        idx = calls["n"] % per_epoch if per_epoch else calls["n"]
        trainer.at(calls["n"])
        if own("on_train_epoch_start") and (idx == 0 or not last.began):
            _hook(module, "on_train_epoch_start")
        last.began = True
        for o in transfers:
            batch = _hook(o, "on_after_batch_transfer", batch, 0)
        if own("on_train_batch_start") and _hook(module, "on_train_batch_start", batch, idx) == -1:
            raise ContractError(f"lightning_setup: {type(module).__name__}.on_train_batch_start returned -1, which ends "
                                "the epoch early in a Trainer: reproci trains every batch of an epoch")
        calls["n"] += 1
        last.batch, last.idx = batch, idx
        with autocast():
            last.out = _hook(module, "training_step", batch, idx)
        loss = loss_of(last.out)
        if stepped is not None:
            stepped.zeroed()
        if own("on_before_backward"):
            _hook(module, "on_before_backward", loss / accumulate if accumulate > 1 else loss)
        return loss

    def after_backward() -> None:
        if own("on_after_backward"):
            _hook(module, "on_after_backward")
        if own("on_train_batch_end") and calls["n"] % accumulate:  # a batch that does not end its step
            _hook(module, "on_train_batch_end", *last.ended())

    def after_step(step: int) -> None:
        trainer.global_step = calls["n"] // accumulate  # the step just taken counts, as in a Trainer
        if own("on_train_batch_end"):
            _hook(module, "on_train_batch_end", *last.ended())
        if own("on_train_epoch_end") and per_epoch and calls["n"] % per_epoch == 0:
            _hook(module, "on_train_epoch_end")
        if user_after_step is not None:
            user_after_step(step)

    hooked = any(own(h) for h in ("on_after_backward", "on_train_batch_end"))
    return loss_fn, {"after_backward": after_backward if hooked else None,
                     "after_step": after_step if hooked or own("on_train_epoch_end") or own("optimizer_step")
                     or user_after_step is not None else None}


def _checkpointed(module: "pl.LightningModule", datamodule: Any, calls: dict[str, int], per_epoch: int | None,
                  accumulate: int, setup: dict[str, Any], trainer: fit.Trainer) -> dict[str, Any]:
    """``get_extra_state``/``set_extra_state`` holding what a Trainer checkpoints outside the
    module's ``state_dict``: the batch index (``training_step`` calls so far), the datamodule's
    ``state_dict()`` and what ``on_save_checkpoint`` adds (``dump_checkpoint``'s order: the
    datamodule, then the module's hook), and the plugin's own extra state (``setup``'s
    ``get_extra_state``/``set_extra_state``, taken out of it), each put back as a resume does
    (``restore_model``'s ``on_load_checkpoint``, then ``restore_datamodule``)."""
    user_get, user_set = setup.pop("get_extra_state", None), setup.pop("set_extra_state", None)
    if (user_get is None) != (user_set is None):
        raise ContractError("lightning_setup: give both get_extra_state and set_extra_state, or neither")
    stateful = datamodule is not None and _overridden(datamodule, pl.LightningDataModule, "state_dict")
    saves, loads = (_overridden(module, pl.LightningModule, f"on_{verb}_checkpoint") for verb in ("save", "load"))
    key = type(datamodule).__qualname__ if datamodule is not None else None  # Lightning's key for the datamodule's state

    def base() -> dict[str, Any]:
        """The checkpoint dict ``on_save_checkpoint`` sees, as far as reproci knows it."""
        steps = calls["n"] // accumulate
        return {"epoch": calls["n"] // per_epoch if per_epoch else 0, "global_step": steps,
                "pytorch-lightning_version": pl.__version__, "state_dict": module.state_dict()}

    def get_extra_state() -> dict[str, Any]:
        state: dict[str, Any] = dict(calls)
        if stateful:
            state["datamodule"] = _hook(datamodule, "state_dict")
        if saves:
            checkpoint = base()
            given = dict(checkpoint)
            _hook(module, "on_save_checkpoint", checkpoint)
            state["on_save_checkpoint"] = {k: v for k, v in checkpoint.items() if k not in given or v is not given[k]}
        leaves = tree_flatten([state.get(k) for k in _TRAINER_STATE])[0]  # the checkpoint loads on the CPU:
        if any(isinstance(t, torch.Tensor) and t.device.type != "cpu" for t in leaves):  # where each goes back
            state["devices"] = [str(t.device) if isinstance(t, torch.Tensor) else None for t in leaves]
        if user_get is not None:
            state["plugin"] = user_get()
        return state

    def set_extra_state(state: dict[str, Any]) -> None:
        for m in filter(is_metric, module.modules()):  # a list state empty before the load holds CPU tensors
            m.to(m.device)
        if state.get("devices"):
            leaves, spec = tree_flatten([state.get(k) for k in _TRAINER_STATE])
            moved = tree_unflatten([t.to(d) if d else t for t, d in zip(leaves, state["devices"])], spec)
            state = {**state, **{k: v for k, v in zip(_TRAINER_STATE, moved) if k in state}}
        calls["n"] = state["n"]
        trainer.at(calls["n"])
        trainer.global_step = calls["n"] // accumulate
        if loads:
            checkpoint = base()
            if key is not None and state.get("datamodule"):
                checkpoint[key] = state["datamodule"]
            _hook(module, "on_load_checkpoint", {**checkpoint, **state.get("on_save_checkpoint", {})})
        if stateful and state.get("datamodule"):
            _hook(datamodule, "load_state_dict", state["datamodule"])
        if user_set is not None:
            user_set(state.get("plugin"))

    return {"get_extra_state": get_extra_state, "set_extra_state": set_extra_state}


def _before_fit(ctx: ModelContext, module: "pl.LightningModule", datamodule: Any) -> None:
    """What ``Trainer._run`` does to the module and the datamodule before it moves the model
    to the device: ``_data_connector.prepare_data``, ``call._call_setup_hook`` and
    ``call._call_configure_model``, in that order."""
    owners = [(o, base) for o, base in ((datamodule, pl.LightningDataModule), (module, pl.LightningModule))
              if o is not None]
    if any(_overridden(o, base, "prepare_data") for o, base in owners):
        if ctx.rank == 0:  # one node: local rank 0 and global rank 0 are the same process
            for o, base in owners:
                if _overridden(o, base, "prepare_data"):
                    _hook(o, "prepare_data")
        if ctx.world_size > 1 and torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.barrier()  # the other ranks wait for the data, as behind Lightning's barrier
    for m in module.modules():  # self.device in setup(), as the Trainer fakes it there
        if isinstance(m, _DEVICE_MIXIN):
            m._device = ctx.device
    for o, _ in owners:
        if callable(getattr(o, "setup", None)):
            _hook(o, "setup", stage=FITTING)
    for name in ("configure_sharded_model", "configure_model"):
        if _overridden(module, pl.LightningModule, name):
            with ctx.device:  # the strategy's tensor_init_context: new tensors on the run's device
                _hook(module, name)


def _hook(obj: Any, name: str, *args: Any, **kwargs: Any) -> Any:
    """``obj.name(...)``, as the Trainer calls it; a hook that reads ``self.trainer`` (which
    raises outside a Trainer) is one ContractError that names it."""
    try:
        return getattr(obj, name)(*args, **kwargs)
    except RuntimeError as e:
        if "is not attached to a `Trainer`" not in str(e):
            raise
        raise ContractError(f"lightning_setup: {type(obj).__name__}.{name} reads self.trainer, and reproci trains the "
                            "module without a Trainer: give it what it reads another way (ctx.steps is the run's "
                            "optimizer steps, for estimated_stepping_batches)") from e


def _trainer_flags(deterministic: bool) -> None:
    """What ``Trainer(deterministic=...)`` sets: Lightning's own function where it has one."""
    try:
        from pytorch_lightning.trainer.connectors.accelerator_connector import _set_torch_flags
    except ImportError:
        from lightning.pytorch.trainer.connectors.accelerator_connector import _set_torch_flags
    _set_torch_flags(deterministic=deterministic)


def _optimizers(conf: Any) -> tuple[torch.optim.Optimizer, list[Any]]:
    """(the optimizer, its schedulers as steppers take them) from any return form of configure_optimizers."""
    if isinstance(conf, torch.optim.Optimizer):
        return conf, []
    if isinstance(conf, dict):
        conf = [conf]
    if isinstance(conf, tuple) and len(conf) == 2 and isinstance(conf[0], (list, tuple)):
        optimizers, schedulers = list(conf[0]), [_scheduler(s) for s in conf[1]]
    elif isinstance(conf, (list, tuple)) and conf and all(isinstance(c, dict) for c in conf):
        optimizers = [c["optimizer"] for c in conf]
        schedulers = [_scheduler(c["lr_scheduler"]) for c in conf if c.get("lr_scheduler") is not None]
    elif isinstance(conf, (list, tuple)):
        optimizers, schedulers = list(conf), []
    else:
        raise ContractError(f"lightning_setup: configure_optimizers returned {type(conf).__name__}, "
                            "which is none of the forms Lightning takes")
    if len(optimizers) != 1:
        raise ContractError(f"lightning_setup: configure_optimizers gave {len(optimizers)} optimizers, which Lightning "
                            "steps only under manual optimization: build the TrainSetup by hand, with the optimizers as a list")
    return optimizers[0], schedulers


def _scheduler(s: Any) -> Any:
    if not isinstance(s, dict):
        return EveryEpoch(s)  # Lightning's default interval
    if s.get("frequency", 1) != 1:
        raise ContractError(f"lightning_setup: a scheduler frequency of {s['frequency']} is not supported: use 1")
    interval = s.get("interval", "epoch")
    if interval not in ("step", "epoch"):
        raise ContractError(f"lightning_setup: scheduler interval {interval!r} is neither 'step' nor 'epoch'")
    return s["scheduler"] if interval == "step" else EveryEpoch(s["scheduler"])


def seeded(loader: Any, ctx: ModelContext) -> Any:
    """``loader`` with its shuffle seeded from the run seed (and its workers seeded), where a
    Trainer would rely on ``seed_everything``; a loader that already seeds itself, as it is."""
    if not isinstance(loader, torch.utils.data.DataLoader) or loader.batch_sampler is None:
        return loader
    sampler = loader.sampler
    shuffles = isinstance(sampler, torch.utils.data.RandomSampler) and sampler.generator is None
    if not shuffles and loader.generator is not None:
        return loader
    kw: dict[str, Any] = {}
    g = ctx.generator()  # the sampler's order and the workers' seeds, as DataLoader(shuffle=True, generator=g) has them
    if shuffles:
        kw = ctx.shuffling(loader.dataset) if ctx.world_size > 1 else {
            "sampler": torch.utils.data.RandomSampler(loader.dataset, replacement=sampler.replacement,
                                                      num_samples=sampler._num_samples, generator=g)}
    elif not isinstance(loader.batch_sampler, torch.utils.data.BatchSampler) or loader.batch_sampler.sampler is not sampler:
        kw = {"batch_sampler": loader.batch_sampler}
    else:
        kw = {"sampler": sampler}
    if "batch_sampler" not in kw:
        kw.update(batch_size=loader.batch_size, drop_last=loader.drop_last)
    return torch.utils.data.DataLoader(
        loader.dataset, **kw, generator=g, collate_fn=loader.collate_fn, num_workers=loader.num_workers,
        worker_init_fn=loader.worker_init_fn or (ctx.seed_worker if loader.num_workers else None),
        pin_memory=loader.pin_memory, persistent_workers=loader.persistent_workers,
        **({"prefetch_factor": loader.prefetch_factor} if loader.num_workers else {}))


def _autocast(precision: str, device: torch.device) -> Any:
    dtype = {"bf16-mixed": torch.bfloat16, "bf16": torch.bfloat16, "16-mixed": torch.float16, "16": torch.float16}.get(
        str(precision))
    if dtype is None and str(precision) not in ("32", "32-true"):
        raise ContractError(f"lightning_setup: precision {precision!r} is not supported: use '32', 'bf16-mixed' or '16-mixed'")
    return (lambda: torch.autocast(device_type=device.type, dtype=dtype)) if dtype is not None else \
        (lambda: torch.autocast(device_type=device.type, enabled=False))


def _validation(module: Any, source: Any, device: torch.device, autocast: Any) -> Any:
    base = pl.LightningDataModule if isinstance(source, pl.LightningDataModule) else pl.LightningModule
    if type(module).validation_step is pl.LightningModule.validation_step or \
            getattr(type(source), "val_dataloader", None) in (None, base.val_dataloader):
        return None  # no validation of its own (the base hooks raise)
    val = source.val_dataloader
    from reproci.worker.data.batchtree import to_device

    def eval_fn(model: Any) -> dict[str, float]:
        out = []
        for idx, batch in enumerate(val()):
            with autocast():
                r = module.validation_step(to_device(batch, device), idx)
            r = r.get("val_loss", r.get("loss")) if isinstance(r, dict) else r
            if isinstance(r, torch.Tensor):
                out.append(r.detach().float().reshape(()))
        return {"val_loss": float(torch.stack(out).mean())} if out else {}
    return eval_fn
