"""What ``Trainer.fit`` does around each training step of a LightningModule, for
``lightning_setup``: every hook of the installed Lightning in one table (called as the Trainer
calls it, not part of fitting, or refused where the module overrides it), ``self.trainer`` as
a fitting Trainer gives it, and the optimizer as the module's ``optimizer_step`` sees it.

The hooks of one training batch, in the Trainer's order (automatic optimization):
``on_train_epoch_start`` (as an epoch begins, and as a resumed run begins, as Lightning calls
it again on a resume), ``on_after_batch_transfer`` (the datamodule's where it has one, else the module's),
``on_train_batch_start``, ``training_step``, ``on_before_zero_grad`` and
``optimizer_zero_grad`` (on the first batch of an accumulation), ``on_before_backward``,
the backward, ``on_after_backward``; on the last batch of an accumulation ``optimizer_step``
(``optimizer.step(closure=...)`` then runs ``on_before_optimizer_step``,
``configure_gradient_clipping`` and the optimizer's step); ``on_train_batch_end``; and
``on_train_epoch_end`` as the epoch's last batch ends. Every hook reads ``self.global_step``
and ``self.current_epoch`` (and ``self.trainer``'s) as in a Trainer. One difference of order:
a Trainer calls ``optimizer_step`` before the last batch's ``training_step`` (its closure runs
that batch's step and backward inside ``optimizer.step``); here ``optimizer_step`` runs once
they have run, so an override's code before ``optimizer.step(closure=...)`` runs after them.
"""

from __future__ import annotations

from typing import Any

import torch

from reproci.worker.contract import ContractError, ModelContext

try:
    import lightning.pytorch as pl
    from lightning.pytorch.core import hooks as _hooks
except ImportError:  # the older package name
    import pytorch_lightning as pl
    from pytorch_lightning.core import hooks as _hooks

# The hooks Trainer.fit calls that lightning_setup calls as the Trainer does (the module's
# docstring and lightning.py's say where).
CALLED = frozenset({
    "prepare_data", "setup", "configure_sharded_model", "configure_model", "configure_optimizers", "on_fit_start",
    "train_dataloader", "on_train_start", "on_train_epoch_start", "on_after_batch_transfer", "on_train_batch_start",
    "training_step", "on_before_zero_grad", "optimizer_zero_grad", "on_before_backward", "on_after_backward",
    "optimizer_step", "on_before_optimizer_step", "configure_gradient_clipping", "on_train_batch_end",
    "on_train_epoch_end", "val_dataloader", "validation_step", "on_save_checkpoint", "on_load_checkpoint", "forward",
    "state_dict", "load_state_dict",
})
# Hooks of validation, testing and prediction: fit's validation changes no training tensor (the
# model is in eval mode under no_grad); reproci's held-out metric calls validation_step alone,
# once, after the last step. Teardown cleans up after fit.
NOT_IN_TRAINING = frozenset({
    "on_validation_start", "on_validation_end", "on_validation_epoch_start", "on_validation_epoch_end",
    "on_validation_batch_start", "on_validation_batch_end", "on_validation_model_eval", "on_validation_model_train",
    "on_validation_model_zero_grad", "test_step", "test_dataloader", "on_test_start", "on_test_end",
    "on_test_epoch_start", "on_test_epoch_end", "on_test_batch_start", "on_test_batch_end", "on_test_model_eval",
    "on_test_model_train", "predict_step", "predict_dataloader", "on_predict_start", "on_predict_end",
    "on_predict_epoch_start", "on_predict_epoch_end", "on_predict_batch_start", "on_predict_batch_end",
    "on_predict_model_eval", "teardown", "on_exception",
})
# Methods the module calls itself, not hooks: what they do is theirs.
OWN_METHODS = frozenset({
    "log", "log_dict", "print", "freeze", "unfreeze", "to_onnx", "to_torchscript", "to_tensorrt", "all_gather",
    "optimizers", "lr_schedulers", "clip_gradients", "manual_backward", "toggle_optimizer", "untoggle_optimizer",
    "toggled_optimizer",
})
# Hooks lightning_setup does not call as the Trainer does: refused where the module (or the
# datamodule) overrides them (name: why).
REFUSED = {
    "backward": "a backward of its own is not run: the loop calls loss.backward()",
    "lr_scheduler_step": "the schedulers are stepped as torch and timm step them, not through this hook",
    "configure_callbacks": "callbacks are not run",
    "on_before_batch_transfer": "the loop moves each batch to the device before the hooks see it",
    "transfer_batch_to_device": "the loop moves each batch to the device itself",
    "on_train_end": "the comparison ends with the last step: a hook after it is not run",
    "on_fit_end": "the comparison ends with the last step: a hook after it is not run",
}


def hooks() -> set[str]:
    """Every hook of the installed Lightning a LightningModule or LightningDataModule can
    override: the hook classes' methods and the module's own that the Trainer calls."""
    names = {n for c in (_hooks.ModelHooks, _hooks.DataHooks, _hooks.CheckpointHooks) for n, v in vars(c).items()
             if callable(v) and not n.startswith("_")}
    names |= {n for n, v in vars(pl.LightningModule).items() if callable(v) and not n.startswith("_")}
    return names | {n for n, v in vars(pl.LightningDataModule).items() if callable(v) and not n.startswith("_")
                    and n not in ("from_datasets",)}


def overridden(obj: Any, base: type, name: str) -> bool:
    """Whether ``obj`` has a ``name`` of its own, not ``base``'s (Lightning's ``is_overridden``)."""
    own = getattr(type(obj), name, None)
    return callable(own) and own is not getattr(base, name, None)


def refuse_unsupported(module: Any, datamodule: Any) -> None:
    """A hook in REFUSED, or one this version does not know (a newer release's), that the
    module or the datamodule overrides: one ContractError naming it."""
    known = CALLED | NOT_IN_TRAINING | OWN_METHODS
    for obj, base in ((module, pl.LightningModule), (datamodule, pl.LightningDataModule)):
        if obj is None:
            continue
        for name in sorted(hooks()):
            if name in known or not hasattr(base, name) or not overridden(obj, base, name):
                continue
            why = REFUSED.get(name, "this version of lightning_setup does not know when the Trainer calls it")
            raise ContractError(f"lightning_setup: {type(obj).__name__}.{name} is not supported ({why}): "
                                "check your own training script with `reproci run --script`, which runs the real Trainer")


class Batch:
    """The training batch being stepped, as its later hooks are given it: ``training_step``'s
    output, the batch and its index; and whether this process has begun its epoch (not
    checkpointed: a resumed run begins its epoch again, as Lightning's does)."""

    def __init__(self) -> None:
        self.out: Any = None
        self.batch: Any = None
        self.idx, self.began = 0, False

    def ended(self) -> tuple[Any, Any, int]:
        """``on_train_batch_end``'s arguments."""
        return self.out, self.batch, self.idx


class NotGiven(ContractError, AttributeError):
    """An attribute of ``self.trainer`` that reproci does not give (an AttributeError too, so that
    ``hasattr`` and ``getattr(..., default)`` answer as for any missing attribute)."""


class Trainer:
    """``self.trainer`` as a Trainer fitting the module with ``max_steps=ctx.steps`` gives it:
    the step and epoch counts as each hook sees them, the run's shape; anything else is one
    line that names it."""

    def __init__(self, ctx: ModelContext, module: Any, datamodule: Any, *, per_epoch: int | None, accumulate: int,
                 grad_clip: float | None, precision: str) -> None:
        self.global_step, self.current_epoch = 0, 0
        self.max_steps, self.max_epochs, self.estimated_stepping_batches = ctx.steps, -1, ctx.steps
        self.num_training_batches = per_epoch if per_epoch else float("inf")
        self.accumulate_grad_batches, self.gradient_clip_val, self.gradient_clip_algorithm = accumulate, grad_clip, "norm"
        self.precision = precision
        self.world_size, self.num_devices, self.num_nodes = ctx.world_size, ctx.world_size, 1
        self.global_rank = self.local_rank = ctx.rank
        self.node_rank, self.is_global_zero = 0, ctx.rank == 0
        self.training, self.sanity_checking = True, False
        self.logger, self.progress_bar_callback = None, None
        self.loggers: list[Any] = []
        self.callback_metrics: dict[str, torch.Tensor] = {}  # Lightning's types; empty: self.log is quiet here
        self.logged_metrics: dict[str, torch.Tensor] = {}
        self.progress_bar_metrics: dict[str, float] = {}
        self.lightning_module, self.datamodule = module, datamodule
        self.optimizers: list[Any] = []
        self.callbacks: list[Any] = []
        self.default_root_dir, self.log_every_n_steps, self.fast_dev_run = ".", 50, False
        self.check_val_every_n_epoch, self.val_check_interval = 1, 1.0

    def at(self, calls: int) -> None:
        """The counts as the hooks of the ``calls``-th training batch (0-based) see them."""
        self.global_step = calls // self.accumulate_grad_batches
        per_epoch = self.num_training_batches
        self.current_epoch = int(calls // per_epoch) if per_epoch != float("inf") else 0

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise NotGiven(f"lightning_setup: self.trainer.{name} is not given outside a Trainer (reproci gives "
                       f"{', '.join(list(vars(self))[:6])}, ...; ctx.steps is the run's optimizer steps): "
                       "check your own training script with `reproci run --script`, which runs the real Trainer")


class Stepped(torch.optim.Optimizer):
    """The module's optimizer as the loop steps it, through the hooks the Trainer calls around
    an optimizer step: ``zero_grad`` runs ``on_before_zero_grad`` and ``optimizer_zero_grad``;
    ``step`` runs ``optimizer_step(epoch, batch_idx, optimizer, closure)``, whose
    ``optimizer.step(closure=...)`` runs ``on_before_optimizer_step``, the clipping
    (``configure_gradient_clipping``) and the optimizer's own step. Its state, groups and
    checkpoint are the optimizer's."""

    def __init__(self, inner: torch.optim.Optimizer, module: Any, trainer: Trainer,  # noqa: D107 - no groups of its own
                 batch: Batch) -> None:
        self.inner, self.module, self.trainer, self.batch = inner, module, trainer, batch
        self.pending, self._set_to_none = False, True
        self.defaults = inner.defaults
        self._optimizer_step_pre_hooks: dict[int, Any] = {}
        self._optimizer_step_post_hooks: dict[int, Any] = {}
        self.view = _Lightning(self)

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.inner.param_groups

    @property
    def state(self) -> Any:
        return self.inner.state

    def state_dict(self) -> dict[str, Any]:
        return self.inner.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.inner.load_state_dict(state_dict)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        self.inner.add_param_group(param_group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Asked by the loop as a step begins; the hooks run in ``zeroed`` (the Trainer's order)."""
        self.pending, self._set_to_none = True, set_to_none

    def zeroed(self) -> None:
        """After the step's first training_step, before its backward, where the Trainer's
        closure calls them: ``on_before_zero_grad``, then ``optimizer_zero_grad``."""
        if self.pending:
            self.pending = False
            self.module.on_before_zero_grad(self.view)
            self.module.optimizer_zero_grad(self.trainer.current_epoch, self.batch.idx, self.view)

    def step(self, closure: Any = None) -> Any:
        self.view.stepped = False
        self.module.optimizer_step(self.trainer.current_epoch, self.batch.idx, self.view, _done)
        if not self.view.stepped:
            raise ContractError(f"lightning_setup: {type(self.module).__name__}.optimizer_step did not call "
                                "optimizer.step(closure=optimizer_closure), which Lightning requires too")
        return None


def _done() -> None:
    """The closure ``optimizer_step`` is given: the step's training_step and backward have run."""


class _Lightning:
    """The optimizer as hooks are given it (Lightning's ``LightningOptimizer``): ``step`` runs
    the closure, ``on_before_optimizer_step``, the clipping and the optimizer's step."""

    def __init__(self, stepped: Stepped) -> None:
        self._stepped, self.stepped = stepped, False

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self._stepped.inner

    def step(self, closure: Any = None, **kwargs: Any) -> Any:
        s = self._stepped
        result = closure() if closure is not None else None
        s.module.on_before_optimizer_step(self)
        s.module.configure_gradient_clipping(self, gradient_clip_val=s.trainer.gradient_clip_val,
                                             gradient_clip_algorithm=s.trainer.gradient_clip_algorithm)
        s.inner.step(**kwargs)
        self.stepped = True
        return result

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._stepped.inner.zero_grad(set_to_none=getattr(self._stepped, "_set_to_none", set_to_none))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stepped.inner, name)


def clip_gradients(optimizer: Any, gradient_clip_val: float | None = None,
                   gradient_clip_algorithm: str | None = None) -> None:
    """``LightningModule.clip_gradients`` as the Trainer's precision plugin does it: the
    optimizer's parameters, by norm (the default) or by value."""
    if not gradient_clip_val:
        return
    params = [p for g in optimizer.param_groups for p in g["params"]]
    if str(gradient_clip_algorithm or "norm") == "value":
        torch.nn.utils.clip_grad_value_(params, gradient_clip_val)
    else:
        torch.nn.utils.clip_grad_norm_(params, gradient_clip_val)
