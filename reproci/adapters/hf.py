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

- ``activation_checkpointing`` (``gradient_checkpointing``, its older name, with
  ``activation_checkpointing_kwargs``): enabled on the model as ``Trainer`` enables it;
  ``torch.utils.checkpoint`` puts the RNG back for the recomputed forward, so dropout draws as without it;
- ``neftune_noise_alpha``: ``Trainer``'s forward hook on the input embeddings; its noise comes
  from torch's global generator, which every checkpoint holds, so a resumed run draws what the
  uninterrupted one drew;
- ``train_sampling_strategy`` (``group_by_length=True`` where it is the older flag):
  ``"group_by_length"`` orders the samples with ``Trainer``'s ``LengthGroupedSampler``
  (megabatches of ``per_device_train_batch_size * gradient_accumulation_steps``, lengths from the
  dataset's ``length_column_name`` where it has one) drawn from the run's seeded loader
  generator, whose epoch-start state a checkpoint holds: a resumed run redraws the epoch's
  order and skips what it had consumed; one process only. ``"sequential"`` does not shuffle.

``seed`` is not read (reproci seeds every run from ``--seed``); ``label_smoothing_factor``,
``train_sampling_strategy="batch_rebalance"`` and ``group_by_length`` above one rank are
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
    generator = ctx.generator()
    loader = torch.utils.data.DataLoader(
        train_dataset, batch_size=args.per_device_train_batch_size, **_order(ctx, args, train_dataset, generator),
        generator=generator, collate_fn=collate, drop_last=args.dataloader_drop_last,
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
    _checkpoint_activations(model, args)
    if args.neftune_noise_alpha is not None:  # as Trainer does, before it compiles
        _neftune(model, args.neftune_noise_alpha)
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
    if _sampling(args) == "batch_rebalance":
        raise ContractError("hf_setup: train_sampling_strategy='batch_rebalance' is not supported: use 'group_by_length' "
                            "or 'random', or build the TrainSetup by hand")


def _sampling(args: Any) -> str:
    """Trainer's sampling strategy: ``train_sampling_strategy``, or the older ``group_by_length`` flag."""
    strategy = getattr(args, "train_sampling_strategy", None)
    if strategy is None:
        return "group_by_length" if getattr(args, "group_by_length", False) else "random"
    return str(strategy)


def _order(ctx: ModelContext, args: Any, dataset: Any, generator: torch.Generator) -> dict[str, Any]:
    """The DataLoader's shuffle or sampler, as Trainer's ``_get_train_sampler`` chooses it; a
    sampler draws from ``generator``, the loader's own, so the harness snapshots and restores it."""
    strategy = _sampling(args)
    if strategy == "sequential":
        if ctx.world_size <= 1:
            return {"shuffle": False}
        return {"sampler": torch.utils.data.DistributedSampler(dataset, num_replicas=ctx.world_size, rank=ctx.rank,
                                                               shuffle=False)}
    if strategy != "group_by_length":
        return ctx.shuffling(dataset)
    if ctx.world_size > 1:
        raise ContractError(f"hf_setup: group_by_length runs in one process only, not on {ctx.world_size} ranks: "
                            "run with one rank, or use train_sampling_strategy='random'")
    from transformers.trainer_pt_utils import LengthGroupedSampler

    column = args.length_column_name
    lengths = dataset[column] if column in (getattr(dataset, "column_names", None) or ()) else None
    return {"sampler": LengthGroupedSampler(args.per_device_train_batch_size * args.gradient_accumulation_steps,
                                            dataset=dataset, lengths=lengths, generator=generator)}


def _checkpoint_activations(model: torch.nn.Module, args: Any) -> None:
    """Activation (gradient) checkpointing, enabled as Trainer enables it."""
    if not hasattr(args, "activation_checkpointing"):  # transformers before the rename
        if args.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=args.gradient_checkpointing_kwargs)
        return
    if not args.activation_checkpointing:
        return
    kwargs = dict(args.activation_checkpointing_kwargs or {})
    every_n_layers, offload = kwargs.pop("every_n_layers", 1), kwargs.pop("offload", False)
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs or None,
                                              every_n_layers=every_n_layers, offload=offload)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs or None,
                                            every_n_layers=every_n_layers, offload=offload)


def _neftune(model: torch.nn.Module, alpha: float) -> None:
    """NEFTune as Trainer activates it: noise from torch's global generator after the input embeddings."""
    try:
        from transformers.integrations.neftune import activate_neftune
    except ImportError:  # transformers before the integration module: the hook in trainer_utils
        from transformers.trainer_utils import neftune_post_forward_hook

        embeddings = model.get_input_embeddings()
        embeddings.neftune_noise_alpha = alpha
        embeddings.register_forward_hook(neftune_post_forward_hook)
        return
    activate_neftune(model, alpha)


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
    from reproci.worker.contract import loss_of
    from reproci.worker.data.batchtree import to_device

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


# Arguments that are part of the identity only when set (name: its default), so that a model
# that does not use them keeps the identity, and the goldens, it had before reproci honoured them.
KNOBS_WHEN_SET = {"activation_checkpointing": False, "activation_checkpointing_kwargs": None, "neftune_noise_alpha": None}


def _knobs(args: Any) -> dict[str, Any]:
    """The arguments that change results: part of the model's identity (config_sha256)."""
    knobs = {k: getattr(args, k) for k in KNOBS if hasattr(args, k)}
    knobs.update({k: getattr(args, k) for k, default in KNOBS_WHEN_SET.items() if getattr(args, k, default) not in (default, None)})
    if _sampling(args) != "random":
        knobs["train_sampling_strategy"] = _sampling(args)
        if _sampling(args) == "group_by_length":
            knobs["length_column_name"] = args.length_column_name
    return {k: v if isinstance(v, (int, float, bool, type(None))) else str(v) for k, v in knobs.items()}
