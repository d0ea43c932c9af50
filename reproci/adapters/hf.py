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

- ``data_seed``: the loader's order is drawn from it, not from ``--seed``, as ``Trainer``
  draws it (accelerate's seedable sampler); part of the model's identity where set;
- ``use_cache``: set on the model's config, as ``Trainer`` sets it.

Every other field is in one of three tables below: ``INERT`` (what does not change the
trained tensors: logging, saving, evaluation's schedule, the Hub), ``REPLACED`` (what reproci
sets itself: ``seed`` from ``--seed``, the length from ``--steps``, the device from
``--device``, the resume from run C) and ``REFUSED``; a field in ``REFUSED``, or in none of the
tables (a newer release's), set to anything but its default is refused in one line that names
it, so no field is dropped without a word. ``label_smoothing_factor``,
``train_sampling_strategy="batch_rebalance"`` and ``group_by_length`` above one rank are
refused with a line that says what to do. The loss is the model's own; where the model takes
loss kwargs (``accepts_loss_kwargs``, or a ``**kwargs`` in its forward, as GPT-2's), it is
given the step's label tokens as ``num_items_in_batch`` (of ``labels[..., 1:]`` for a causal
LM's shifted loss) and not divided by the accumulation, as Trainer computes it
(``TrainSetup.step_items``; the identity then says ``loss: num_items_in_batch``). Either way
it is ``model(**batch).loss``: the batch must hold labels. With ``eval_dataset``, the held-out
loss is the run's ``eval_loss`` metric.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
import transformers
from transformers import Trainer
from transformers.trainer_utils import RemoveColumnsCollator

from reproci.worker.contract import ContractError, ModelContext, TrainSetup, loss_of


def hf_setup(ctx: ModelContext, model: torch.nn.Module, args: Any = None, *, train_dataset: Any,
             data_collator: Any = None, eval_dataset: Any = None, config: dict[str, Any] | None = None,
             **setup: Any) -> TrainSetup:
    """The TrainSetup of ``model`` trained on ``train_dataset`` as ``Trainer(model, args, ...)``
    would train it; ``setup`` adds TrainSetup fields (``state_modules``, ``after_step``, ...)."""
    args = args if args is not None else transformers.TrainingArguments(report_to=[])
    _refuse_unsupported(args)
    _refuse_unread(args)
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
    if args.data_seed is not None:  # Trainer's order comes from data_seed, whatever the seed
        generator.manual_seed(args.data_seed)
    loader = torch.utils.data.DataLoader(
        train_dataset, batch_size=args.per_device_train_batch_size, **_order(ctx, args, train_dataset, generator),
        generator=generator, collate_fn=collate, drop_last=args.dataloader_drop_last,
        num_workers=args.dataloader_num_workers, worker_init_fn=ctx.seed_worker if args.dataloader_num_workers else None)
    autocast = _autocast(args, ctx.device)
    scaler = torch.amp.GradScaler("cuda") if args.fp16 else None

    step_items = _step_items(model) if _accepts_loss_kwargs(model) else None

    def loss_fn(m: torch.nn.Module, batch: Any, items: Any = None) -> Any:
        """The model's own loss; with the step's label tokens (``items``), normalised by them, as
        Trainer passes ``num_items_in_batch`` to a model that takes loss kwargs."""
        with autocast():
            if items is None:
                return m(**batch)
            loss = loss_of(m(**batch, num_items_in_batch=items))
        return loss * ctx.world_size if ctx.world_size > 1 else loss  # average_tokens_across_devices

    eval_fn = None
    if eval_dataset is not None:
        held = torch.utils.data.DataLoader(eval_dataset, batch_size=args.per_device_eval_batch_size, collate_fn=collate)
        eval_fn = _eval_loss(held, ctx.device, autocast)
    _checkpoint_activations(model, args)
    if args.neftune_noise_alpha is not None:  # as Trainer does, before it compiles
        _neftune(model, args.neftune_noise_alpha)
    identity = {"hf_model": type(model).__name__, "hf_config": model.config.to_dict() if hasattr(model, "config") else {},
                "training_args": _knobs(args), **({"loss": "num_items_in_batch"} if step_items else {}), **(config or {})}
    # As Trainer sets it; after the identity, so that a config as the user made it keeps its goldens.
    if hasattr(args, "use_cache") and getattr(model, "config", None) is not None:
        model.config.use_cache = args.use_cache
    if getattr(args, "torch_compile", False):  # as Trainer does: the compiled module shares the parameters
        model = torch.compile(model, backend=args.torch_compile_backend or "inductor", mode=args.torch_compile_mode)
    return TrainSetup(model=model, optimizer=optimizer, loader=loader, loss_fn=loss_fn, scheduler=scheduler, scaler=scaler,
                      grad_clip=args.max_grad_norm if args.max_grad_norm and args.max_grad_norm > 0 else None,
                      batch_size=args.per_device_train_batch_size * args.gradient_accumulation_steps * ctx.world_size,
                      accumulate=args.gradient_accumulation_steps, config=identity, eval_fn=eval_fn,
                      step_items=step_items, **setup)


def _refuse_unsupported(args: Any) -> None:
    if args.fp16 and not torch.cuda.is_available():
        raise ContractError("hf_setup: fp16 needs CUDA: use bf16=True on the CPU, or neither")
    if _sampling(args) == "batch_rebalance":
        raise ContractError("hf_setup: train_sampling_strategy='batch_rebalance' is not supported: use 'group_by_length' "
                            "or 'random', or build the TrainSetup by hand")


# The fields of TrainingArguments that do not change the trained tensors: what is logged,
# saved, evaluated and pushed, and when.
INERT = frozenset({
    "output_dir", "overwrite_output_dir", "logging_dir", "logging_strategy", "logging_steps", "logging_first_step",
    "logging_nan_inf_filter", "log_on_each_node", "log_level", "log_level_replica", "disable_tqdm", "report_to",
    "run_name", "project", "trackio_space_id", "trackio_bucket_id", "trackio_static_space_id",
    "include_num_input_tokens_seen", "include_tokens_per_second", "skip_memory_metrics",
    "eval_strategy", "evaluation_strategy", "eval_steps", "eval_delay", "prediction_loss_only", "eval_on_start",
    "eval_do_concat_batches", "eval_use_gather_object", "eval_accumulation_steps", "include_for_metrics",
    "include_inputs_for_metrics", "batch_eval_metrics", "bf16_full_eval", "fp16_full_eval", "metric_for_best_model",
    "greater_is_better", "do_eval", "do_predict", "per_device_eval_batch_size",
    "save_only_model", "save_strategy", "save_steps", "save_on_each_node", "save_total_limit", "save_safetensors",
    "enable_jit_checkpoint", "restore_callback_states_from_checkpoint",
    "push_to_hub", "hub_token", "hub_private_repo", "hub_model_id", "hub_strategy", "hub_always_push", "hub_revision",
    "torch_empty_cache_steps", "dataloader_pin_memory", "dataloader_prefetch_factor",
    "dataloader_multiprocessing_context", "debug",
    # Seq2SeqTrainingArguments: generation at evaluation
    "predict_with_generate", "generation_max_length", "generation_num_beams", "generation_config",
})
# The fields reproci sets itself: the seed (--seed), the length (--steps), the device
# (--device), the processes (--world-size) and the resume (run C resumes from run A's step k).
REPLACED = frozenset({"seed", "max_steps", "num_train_epochs", "use_cpu", "no_cuda", "use_mps_device", "local_rank",
                      "do_train", "resume_from_checkpoint"})
# The fields hf_setup does as Trainer does (the module's docstring says how).
HONOURED = frozenset({
    "per_device_train_batch_size", "learning_rate", "lr_scheduler_type", "lr_scheduler_kwargs", "warmup_steps",
    "warmup_ratio", "optim", "optim_args", "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon",
    "gradient_accumulation_steps", "max_grad_norm", "bf16", "fp16",
    "activation_checkpointing", "activation_checkpointing_kwargs", "gradient_checkpointing",
    "gradient_checkpointing_kwargs", "torch_compile", "torch_compile_backend", "torch_compile_mode",
    "neftune_noise_alpha", "full_determinism", "data_seed", "use_cache", "dataloader_drop_last",
    "dataloader_num_workers", "remove_unused_columns", "label_names", "train_sampling_strategy", "group_by_length",
    "length_column_name",
})
# The fields that change what is trained, or how it resumes, and that hf_setup does not do:
# refused where set (name: why, or what to do instead).
REFUSED = {
    "label_smoothing_factor": "smooth the labels in the model's loss",
    "optim_target_modules": "the optimizers that take it (GaLore, APOLLO) are not made here",
    "average_tokens_across_devices": "the loss is the model's own, averaged over its own batch",
    "tf32": "TF32 matmuls round differently from one GPU to another: reproci's strict determinism keeps them off",
    "use_liger_kernel": "Liger's kernels replace the model's layers",
    "liger_kernel_config": "Liger's kernels replace the model's layers",
    "auto_find_batch_size": "a batch size found by retrying after running out of memory changes what is trained",
    "dataloader_persistent_workers": "loader workers that live across epochs draw on from where they were",
    "dataloader_in_order": "a loader that yields batches out of order gives a run's batches in another order",
    "load_best_model_at_end": "reproci compares the model the last step left",
    "ignore_data_skip": "a resumed Trainer then trains on the epoch's first batches again",
    "accelerator_config": "accelerate's own samplers and batch splitting are not made here",
    "parallelism_config": "reproci runs data-parallel ranks only (--world-size)",
    "fsdp": "reproci runs data-parallel ranks only (--world-size)",
    "fsdp_config": "reproci runs data-parallel ranks only (--world-size)",
    "deepspeed": "reproci runs data-parallel ranks only (--world-size)",
    "ddp_backend": "reproci chooses the process group's backend from --device",
    "ddp_find_unused_parameters": "give it as TrainSetup's ddp_options",
    "ddp_bucket_cap_mb": "give it as TrainSetup's ddp_options",
    "ddp_broadcast_buffers": "give it as TrainSetup's ddp_options",
    "ddp_static_graph": "give it as TrainSetup's ddp_options",
    "ddp_timeout": "reproci sets the process group's timeout",
    "sortish_sampler": "its order is not the one a resumed run redraws",
}


def _refuse_unread(args: Any) -> None:
    """A field hf_setup does not read (REFUSED, or in no table: a newer release's), set to
    anything but its default: one ContractError that names it."""
    import dataclasses

    default = _defaults(type(args), args)
    known = INERT | REPLACED | HONOURED
    for f in dataclasses.fields(args):
        name = f.name
        if name in known or not f.init:
            continue
        if default is not None:
            usual = getattr(default, name, None)
        else:
            usual = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        value = getattr(args, name, None)
        if _same(value, usual):
            continue
        why = REFUSED.get(name, f"this version of hf_setup does not know what {type(args).__name__}.{name} does")
        raise ContractError(f"hf_setup: TrainingArguments {name}={value!r} is not supported ({why}): leave it at "
                            f"{usual!r}, or check your own script with `reproci run --script`")


def _defaults(kind: type, args: Any) -> Any:
    """A ``kind`` made with nothing but ``args``' output_dir: every field at its default, after
    the same ``__post_init__``; None where it cannot be made so (a subclass that needs more)."""
    try:
        return kind(output_dir=args.output_dir, report_to=[])
    except Exception:  # noqa: BLE001 - a subclass with required fields: each field's own default is compared
        return None


def _same(value: Any, usual: Any) -> bool:
    try:
        return bool(value == usual)
    except Exception:  # noqa: BLE001 - values that do not compare (arrays): not the default
        return False


def _accepts_loss_kwargs(model: torch.nn.Module) -> bool:
    """Whether Trainer passes the model ``num_items_in_batch``: its ``accepts_loss_kwargs``, else
    a ``**kwargs`` in its forward (``Trainer.__init__``'s model introspection)."""
    accepts = getattr(model, "accepts_loss_kwargs", None)
    if accepts is not None:
        return bool(accepts)
    return any(p.kind == inspect.Parameter.VAR_KEYWORD for p in inspect.signature(model.forward).parameters.values())


def _step_items(model: torch.nn.Module) -> Any:
    """``Trainer._get_num_items_in_batch``: the label tokens of all the step's micro-batches (of
    ``labels[..., 1:]`` for a causal LM's shifted loss, or ``shift_labels`` where the collator
    gives them), summed over the ranks; None where the batches hold no labels."""
    try:
        from transformers.loss.loss_utils import LOSS_MAPPING, ForCausalLMLoss

        shifts = LOSS_MAPPING.get(getattr(model, "loss_type", None)) is ForCausalLMLoss and \
            not getattr(getattr(model, "config", None), "is_encoder_decoder", False)
    except ImportError:  # transformers before its loss module
        shifts = False

    def items(parts: list[Any]) -> Any:
        if not parts or "labels" not in parts[0]:
            return None
        counted = [p["shift_labels"] if "shift_labels" in p else p["labels"][..., 1:] if shifts else p["labels"]
                   for p in parts]
        total = sum(labels.ne(-100).sum() for labels in counted)
        if torch.distributed.is_available() and torch.distributed.is_initialized() and \
                torch.distributed.get_world_size() > 1:
            torch.distributed.all_reduce(total)
        return total / 1  # as Trainer divides by the tensor-, context- and sequence-parallel sizes: a float
    return items


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
        if ctx.world_size > 1 and args.data_seed is not None:  # each rank's shard drawn from data_seed
            return {"sampler": torch.utils.data.DistributedSampler(dataset, num_replicas=ctx.world_size, rank=ctx.rank,
                                                                   shuffle=True, seed=args.data_seed)}
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
KNOBS_WHEN_SET = {"activation_checkpointing": False, "activation_checkpointing_kwargs": None, "neftune_noise_alpha": None,
                  "data_seed": None, "use_cache": False}


def _knobs(args: Any) -> dict[str, int | float | str | None]:
    """The arguments that change results: part of the model's identity (config_sha256)."""
    knobs = {k: getattr(args, k) for k in KNOBS if hasattr(args, k)}
    knobs.update({k: getattr(args, k) for k, default in KNOBS_WHEN_SET.items() if getattr(args, k, default) not in (default, None)})
    if _sampling(args) != "random":
        knobs["train_sampling_strategy"] = _sampling(args)
        if _sampling(args) == "group_by_length":
            knobs["length_column_name"] = args.length_column_name
    return {k: v if isinstance(v, (int, float, bool, type(None))) else str(v) for k, v in knobs.items()}
