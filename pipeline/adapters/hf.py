"""A Hugging Face model, dataset and collator, trained as ``Trainer`` would, as a TrainSetup.

    from reproci.adapters.hf import hf_setup

    def build(ctx):
        torch.manual_seed(ctx.seed)
        model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64))
        args = TrainingArguments(learning_rate=5e-4, warmup_steps=2, lr_scheduler_type="cosine",
                                 weight_decay=0.01, gradient_accumulation_steps=2, report_to=[])
        return hf_setup(ctx, model, args, train_dataset=data, data_collator=collator)

It needs transformers and accelerate (``TrainingArguments`` refuses to work without it):
``pip install 'reproci[hf]'``.

What it takes from ``args`` (a ``TrainingArguments``), as ``Trainer`` uses it:

- the optimizer: ``Trainer.get_optimizer_cls_and_kwargs`` (``optim``, ``learning_rate``,
  ``adam_beta1/2``, ``adam_epsilon``, ``optim_args``), over ``Trainer``'s two parameter groups
  (``weight_decay`` on all but biases and norms: ``Trainer.get_decay_parameter_names``);
- the schedule: ``transformers.get_scheduler(lr_scheduler_type, warmup_steps or warmup_ratio,
  lr_scheduler_kwargs)`` over ``ctx.steps`` optimizer steps (reproci's ``--steps`` is the run's
  length: ``max_steps`` and ``num_train_epochs`` are not read);
- ``gradient_accumulation_steps`` (``TrainSetup.accumulate``), ``max_grad_norm`` (clipping),
  ``bf16`` (autocast to bfloat16 on the run's device), ``fp16`` (autocast and a GradScaler,
  CUDA only);
- the loader: ``per_device_train_batch_size``, ``dataloader_drop_last``,
  ``dataloader_num_workers`` (each worker seeded), shuffled by a sampler seeded from the run seed
  (``ctx.generator()``), ``remove_unused_columns`` as ``Trainer`` does it; ``data_collator``, or
  ``default_data_collator``;
- ``full_determinism``: ``enable_full_determinism(ctx.seed)``, as ``Trainer`` calls it (it
  coexists with reproci's own controls).

- ``torch_compile`` (with ``torch_compile_backend`` and ``torch_compile_mode``): the model is
  compiled as ``Trainer`` compiles it; reproci recognises the compiled model, hashes the plain
  module under it and records the run as compiled by the plugin.

``seed`` is not read (reproci seeds every run from ``--seed``); ``label_smoothing_factor`` is
refused with a line that says so. The loss is the model's own
(``model(**batch).loss``: the batch must hold labels). With ``eval_dataset``, the held-out
loss is the run's ``eval_loss`` metric.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
import transformers
from transformers import Trainer
from transformers.trainer_utils import RemoveColumnsCollator

from reproci.worker.contract import ContractError, ModelContext, TrainSetup


def hf_setup(ctx: ModelContext, model: torch.nn.Module, args: Any = None, *, train_dataset: Any,
             data_collator: Any = None, eval_dataset: Any = None, config: dict[str, Any] | None = None,
             **setup: Any) -> TrainSetup:
    """The TrainSetup of ``model`` trained on ``train_dataset`` as ``Trainer(model, args, ...)``
    would train it; ``setup`` adds TrainSetup fields (``state_modules``, ``after_step``, ...)."""
    args = args if args is not None else transformers.TrainingArguments(report_to=[])
    _refuse_unsupported(args)
    if args.full_determinism:
        transformers.enable_full_determinism(ctx.seed)
    model = model.to(ctx.device)
    optimizer = _optimizer(model, args)
    scheduler = transformers.get_scheduler(args.lr_scheduler_type, optimizer,
                                           num_warmup_steps=args.get_warmup_steps(ctx.steps),
                                           num_training_steps=ctx.steps,
                                           scheduler_specific_kwargs=args.lr_scheduler_kwargs or {})
    collate = _collator(model, args, data_collator)
    loader = torch.utils.data.DataLoader(
        train_dataset, batch_size=args.per_device_train_batch_size, **ctx.shuffling(train_dataset),
        generator=ctx.generator(), collate_fn=collate, drop_last=args.dataloader_drop_last,
        num_workers=args.dataloader_num_workers, worker_init_fn=ctx.seed_worker if args.dataloader_num_workers else None)
    autocast = _autocast(args, ctx.device)
    scaler = torch.amp.GradScaler("cuda") if args.fp16 else None

    def loss_fn(m: torch.nn.Module, batch: Any) -> Any:
        with autocast():
            return m(**batch)

    eval_fn = None
    if eval_dataset is not None:
        held = torch.utils.data.DataLoader(eval_dataset, batch_size=args.per_device_eval_batch_size, collate_fn=collate)
        eval_fn = _eval_loss(held, ctx.device, autocast)
    identity = {"hf_model": type(model).__name__, "hf_config": model.config.to_dict() if hasattr(model, "config") else {},
                "training_args": _knobs(args), **(config or {})}
    if getattr(args, "torch_compile", False):  # as Trainer does: the compiled module shares the parameters
        model = torch.compile(model, backend=args.torch_compile_backend or "inductor", mode=args.torch_compile_mode)
    return TrainSetup(model=model, optimizer=optimizer, loader=loader, loss_fn=loss_fn, scheduler=scheduler, scaler=scaler,
                      grad_clip=args.max_grad_norm if args.max_grad_norm and args.max_grad_norm > 0 else None,
                      batch_size=args.per_device_train_batch_size * args.gradient_accumulation_steps * ctx.world_size,
                      accumulate=args.gradient_accumulation_steps, config=identity, eval_fn=eval_fn, **setup)


def _refuse_unsupported(args: Any) -> None:
    if args.label_smoothing_factor:
        raise ContractError("hf_setup: label_smoothing_factor is not supported: smooth the labels in the model's "
                            "loss, or build the TrainSetup by hand")
    if args.fp16 and not torch.cuda.is_available():
        raise ContractError("hf_setup: fp16 needs CUDA: use bf16=True on the CPU, or neither")


def _optimizer(model: torch.nn.Module, args: Any) -> torch.optim.Optimizer:
    """Trainer.create_optimizer's optimizer: its two groups and its optimizer class and arguments."""
    decay = set(Trainer.get_decay_parameter_names(None, model))
    groups = [{"params": [p for n, p in model.named_parameters() if n in decay and p.requires_grad],
               "weight_decay": args.weight_decay},
              {"params": [p for n, p in model.named_parameters() if n not in decay and p.requires_grad],
               "weight_decay": 0.0}]
    cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(args, model)
    return cls([g for g in groups if g["params"]], **kwargs)


def _collator(model: torch.nn.Module, args: Any, data_collator: Any) -> Any:
    collate = data_collator if data_collator is not None else transformers.default_data_collator
    if not args.remove_unused_columns:
        return collate
    columns = list(inspect.signature(model.forward).parameters) + ["label", "label_ids"] + list(args.label_names or [])
    return RemoveColumnsCollator(collate, columns, model_name=type(model).__name__)


def _autocast(args: Any, device: torch.device) -> Any:
    if args.bf16:
        return lambda: torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    if args.fp16:
        return lambda: torch.autocast(device_type=device.type, dtype=torch.float16)
    return lambda: torch.autocast(device_type=device.type, enabled=False)


def _eval_loss(held: Any, device: torch.device, autocast: Any) -> Any:
    from reproci.worker.data.batchtree import to_device
    from reproci.worker.contract import loss_of

    def eval_fn(model: torch.nn.Module) -> dict[str, float]:
        losses = []
        for batch in held:
            with autocast():
                losses.append(loss_of(model(**to_device(batch, device))).float())
        return {"eval_loss": float(torch.stack(losses).mean())}
    return eval_fn


KNOBS = ("learning_rate", "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon", "optim", "optim_args",
         "lr_scheduler_type", "lr_scheduler_kwargs", "warmup_steps", "warmup_ratio", "gradient_accumulation_steps",
         "max_grad_norm", "bf16", "fp16", "per_device_train_batch_size", "dataloader_drop_last",
         "remove_unused_columns", "full_determinism")


def _knobs(args: Any) -> dict[str, Any]:
    """The arguments that change results: part of the model's identity (config_sha256)."""
    return {k: str(getattr(args, k)) if not isinstance(getattr(args, k), (int, float, bool, type(None))) else getattr(args, k)
            for k in KNOBS if hasattr(args, k)}
