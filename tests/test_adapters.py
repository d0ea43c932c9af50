"""The adapters (``reproci/adapters/``) and their examples (``examples/``): a Hugging Face
model with its collator, dataset and TrainingArguments, and a LightningModule as it is, each
a TrainSetup in one call, judged right by the real CLI; and a golden recorded under one
transformers version alerting as UPGRADE_CHANGED under another, though the model's config
carries ``transformers_version``. Real transformers, accelerate and Lightning throughout."""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from torch import nn

from reproci import errors, verdicts
from reproci.stages.determinism import config_sha256
from reproci.worker.contract import ContractError, ModelContext
from reproci.worker.steppers import EveryEpoch

from .helpers import PLUGINS, ROOT, Cli, installed, model_entry

# TrainingArguments needs accelerate: the hf extra installs both. Skipped only where one is not
# installed at all; an ImportError in an adapter, or in a library it imports, fails.
pl, transformers, _ = installed("pytorch_lightning", "transformers", "accelerate")

from reproci.adapters import hf, lightning  # noqa: E402  (with their libraries there, they must import)

from .plugins import lightning_datamodule  # noqa: E402

HF_EXAMPLE = f"{ROOT / 'examples' / 'hf_gpt2.py'}:build"
DATAMODULE = f"{PLUGINS / 'lightning_datamodule.py'}:build"
LIGHTNING_EXAMPLE = f"{ROOT / 'examples' / 'lightning_regressor.py'}:build"
CTX = ModelContext(profile="quick", device=torch.device("cpu"), seed=0, steps=12)


class Tiny(pl.LightningModule):
    def __init__(self, conf):
        super().__init__()
        self.layer, self.conf = nn.Linear(2, 1), conf

    def configure_optimizers(self):
        return self.conf(torch.optim.SGD(self.parameters(), lr=0.1))


@pytest.mark.parametrize("form, kinds", [
    (lambda o: o, []),
    (lambda o: [o], []),
    (lambda o: ([o], [torch.optim.lr_scheduler.StepLR(o, 1)]), ["epoch"]),
    (lambda o: {"optimizer": o, "lr_scheduler": torch.optim.lr_scheduler.StepLR(o, 1)}, ["epoch"]),
    (lambda o: {"optimizer": o, "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.StepLR(o, 1), "interval": "step"}},
     ["step"]),
    (lambda o: [{"optimizer": o, "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.ReduceLROnPlateau(o),
                                                  "monitor": "val_loss"}}], ["epoch"]),
], ids=["optimizer", "list", "tuple", "dict", "dict-step", "list-of-dicts-plateau"])
def test_every_form_of_configure_optimizers_gives_one_optimizer_and_its_schedules(form, kinds) -> None:
    module = Tiny(form)
    optimizer, schedulers = lightning._optimizers(module.configure_optimizers())
    assert isinstance(optimizer, torch.optim.SGD)
    assert ["epoch" if isinstance(s, EveryEpoch) else "step" for s in schedulers] == kinds


@pytest.mark.parametrize("form, says", [
    (lambda o: [o, torch.optim.SGD([nn.Parameter(torch.ones(1))], lr=1)], "gave 2 optimizers"),
    (lambda o: {"optimizer": o, "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.StepLR(o, 1), "frequency": 2}},
     "frequency of 2 is not supported"),
    (lambda o: "adam", "configure_optimizers returned str"),
])
def test_forms_lightning_itself_would_not_step_automatically_are_refused_in_one_line(form, says) -> None:
    with pytest.raises(ContractError, match=says):
        lightning._optimizers(Tiny(form).configure_optimizers())


def test_manual_optimization_is_refused_with_what_to_do_instead() -> None:
    module = Tiny(lambda o: o)
    module.automatic_optimization = False
    with pytest.raises(ContractError, match="manual optimization .* build the TrainSetup by hand"):
        lightning.lightning_setup(CTX, module)


def test_a_shuffling_loader_without_a_generator_is_rebuilt_seeded_and_the_rest_kept() -> None:
    data = torch.utils.data.TensorDataset(torch.arange(10.0))
    original = torch.utils.data.DataLoader(data, batch_size=3, shuffle=True, drop_last=True)
    seeded = lightning.seeded(original, CTX)
    assert seeded is not original and seeded.batch_size == 3 and seeded.drop_last
    assert isinstance(seeded.sampler, torch.utils.data.RandomSampler) and seeded.sampler.generator is seeded.generator
    assert [b[0].tolist() for b in seeded] == [b[0].tolist() for b in lightning.seeded(original, CTX)]  # same order
    ordered = torch.utils.data.DataLoader(data, batch_size=3, generator=torch.Generator())
    assert lightning.seeded(ordered, CTX) is ordered  # seeds itself already


class Observed(lightning_datamodule.LazyRegressor):
    """The plugin's module, keeping its parameters as training starts."""

    def on_train_start(self) -> None:
        super().on_train_start()
        self.at_start = {k: v.detach().clone() for k, v in self.state_dict().items()}


def test_the_hooks_run_in_the_order_trainer_fit_calls_them_and_draw_what_it_draws(tmp_path) -> None:
    """Against a real ``Trainer.fit`` (one step): the same hooks of the datamodule and the module
    in the same order up to the first training_step, and from the same seed the same data drawn
    in ``setup()`` and the same layers built in ``configure_model()``."""
    calls = lightning_datamodule.CALLS
    runs = {}
    for who in ("trainer", "adapter"):
        calls.clear()
        torch.manual_seed(0)
        module, data = Observed(), lightning_datamodule.Data()
        if who == "trainer":
            pl.Trainer(accelerator="cpu", devices=1, max_steps=1, logger=False, enable_checkpointing=False,
                       enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                       limit_val_batches=0, default_root_dir=tmp_path).fit(module, datamodule=data)
        else:
            setup = lightning.lightning_setup(CTX, module, datamodule=data)
            setup.loss_fn(setup.model, next(iter(setup.loader)))
        runs[who] = (list(calls), module.at_start, data.train_set.tensors)
    (order, state, tensors), (ours, our_state, our_tensors) = runs["trainer"], runs["adapter"]
    assert ours == order and order[-1] == "module.training_step", (ours, order)
    assert state.keys() == our_state.keys() and all(torch.equal(state[k], our_state[k]) for k in state)
    assert all(torch.equal(a, b) for a, b in zip(tensors, our_tensors))


def test_self_trainer_gives_what_a_fitting_trainer_gives_and_names_what_it_does_not() -> None:
    """``self.trainer.estimated_stepping_batches`` is the run's steps, as a Trainer with
    max_steps gives it; an attribute reproci does not give is one line naming it (and a
    missing attribute to ``hasattr``)."""
    class Scheduled(Tiny):
        def configure_optimizers(self):
            opt = torch.optim.SGD(self.parameters(), lr=0.1)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.OneCycleLR(
                opt, max_lr=0.1, total_steps=self.trainer.estimated_stepping_batches), "interval": "step"}}

        def train_dataloader(self):
            return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.ones(4, 2), torch.ones(4, 1)))

    setup = lightning.lightning_setup(CTX, Scheduled(None))
    assert setup.scheduler[0].total_steps == CTX.steps
    assert not hasattr(setup.model.trainer, "strategy")

    class Strategic(Scheduled):
        def on_train_start(self):
            self.trainer.strategy.barrier()

    with pytest.raises(ContractError, match=r"self.trainer.strategy is not given outside a Trainer .*--script"):
        lightning.lightning_setup(CTX, Strategic(None))


class Hooked(pl.LightningModule):
    """A module that overrides the hooks around a training step, each recording what it saw:
    Lightning's documented learning-rate warm-up in ``optimizer_step`` (reading
    ``self.trainer.global_step``), gradients halved in ``on_before_optimizer_step``."""

    def __init__(self, seen: list) -> None:
        super().__init__()
        self.layer, self.seen = nn.Linear(3, 1), seen

    def train_dataloader(self):
        g = torch.Generator().manual_seed(0)
        data = torch.utils.data.TensorDataset(torch.randn(8, 3, generator=g), torch.randn(8, 1, generator=g))
        return torch.utils.data.DataLoader(data, batch_size=2)  # 4 batches an epoch, in order

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)

    def training_step(self, batch, batch_idx):
        self.seen.append(("training_step", batch_idx, self.global_step, self.current_epoch))
        x, y = batch
        return nn.functional.mse_loss(self.layer(x), y)

    def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure=None):
        self.seen.append(("optimizer_step", epoch, batch_idx, self.trainer.global_step))
        optimizer.step(closure=optimizer_closure)
        for group in optimizer.param_groups:
            group["lr"] = min(1.0, (self.trainer.global_step + 1) / 3) * 0.1

    def on_before_optimizer_step(self, optimizer):
        self.seen.append(("on_before_optimizer_step", round(float(self.layer.weight.grad.norm()), 6)))
        for p in self.parameters():
            p.grad.mul_(0.5)

    def on_before_zero_grad(self, optimizer):
        self.seen.append(("on_before_zero_grad",))

    def on_before_backward(self, loss):
        self.seen.append(("on_before_backward",))

    def on_after_backward(self):
        self.seen.append(("on_after_backward", round(float(self.layer.weight.grad.norm()), 6)))

    def on_train_batch_start(self, batch, batch_idx):
        self.seen.append(("on_train_batch_start", batch_idx))

    def on_after_batch_transfer(self, batch, dataloader_idx):
        self.seen.append(("on_after_batch_transfer", dataloader_idx))
        x, y = batch
        return 2 * x, y

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.seen.append(("on_train_batch_end", batch_idx, self.global_step))

    def on_train_epoch_start(self):
        self.seen.append(("on_train_epoch_start", self.current_epoch))

    def on_train_epoch_end(self):
        self.seen.append(("on_train_epoch_end", self.current_epoch))


def test_the_hooks_around_each_step_run_as_trainer_fit_runs_them_and_train_the_same_bits(tmp_path) -> None:
    """Against a real ``Trainer.fit`` of 6 steps, 2 batches each (3 epochs), clipped: the same
    hooks in the same order with the same counts, and the same parameters to the bit. The
    adapter used to skip ``optimizer_step`` and ``on_before_optimizer_step`` (no warm-up, no
    halving) and gave the same hashes as without them."""
    from reproci.worker.data.batches import Accumulated
    from reproci.worker.train import train_step

    runs = {}
    for who in ("trainer", "adapter"):
        seen: list = []
        torch.manual_seed(0)
        module = Hooked(seen)
        if who == "trainer":
            pl.Trainer(accelerator="cpu", devices=1, max_steps=6, accumulate_grad_batches=2, gradient_clip_val=0.05,
                       logger=False, enable_checkpointing=False, enable_progress_bar=False,
                       enable_model_summary=False, num_sanity_val_steps=0, default_root_dir=tmp_path).fit(module)
        else:
            ctx = ModelContext(profile="quick", device=torch.device("cpu"), seed=0, steps=6)
            setup = lightning.lightning_setup(ctx, module, grad_clip=0.05, accumulate=2)
            batches = (b for _ in range(3) for b in setup.loader)
            for step in range(1, 7):
                train_step(setup, setup.model, Accumulated([next(batches), next(batches)]), step)
        runs[who] = (seen, {k: v.clone() for k, v in module.state_dict().items()})
    (theirs, trained), (ours, ours_trained) = runs["trainer"], runs["adapter"]

    def apart(seen: list) -> tuple[list, list]:  # the Trainer calls optimizer_step before the closure that runs
        steps = [s for s in seen if s[0] == "optimizer_step"]  # the last batch's training_step and backward
        return [s for s in seen if s[0] != "optimizer_step"], steps

    assert apart(ours) == apart(theirs), "\n".join(f"{a} | {b}" for a, b in zip(ours, theirs))
    assert len(apart(ours)[1]) == 6 and ("on_train_epoch_end", 2) in ours
    assert all(torch.equal(trained[k], ours_trained[k]) for k in trained)


@pytest.mark.parametrize("hook", ["backward", "lr_scheduler_step", "configure_callbacks", "transfer_batch_to_device",
                                  "on_before_batch_transfer", "on_train_end", "on_fit_end"])
def test_a_hook_lightning_setup_does_not_call_as_the_trainer_does_is_refused_where_overridden(hook) -> None:
    overriding = type("Overriding", (Tiny,), {hook: lambda self, *a, **k: None})
    with pytest.raises(ContractError, match=rf"Overriding.{hook} is not supported \(.*--script"):
        lightning.lightning_setup(CTX, overriding(lambda o: o))


def test_every_hook_of_the_installed_lightning_is_called_as_the_trainer_calls_it_or_named() -> None:
    """A hook a new Lightning release adds fails here until it is put in one of
    lightning_fit's tables, and until then a module overriding it is refused."""
    from reproci.adapters import lightning_fit as fit

    tables = fit.CALLED | fit.NOT_IN_TRAINING | fit.OWN_METHODS | set(fit.REFUSED)
    assert not sorted(fit.hooks() - tables)
    assert not fit.CALLED & (fit.NOT_IN_TRAINING | fit.OWN_METHODS | set(fit.REFUSED))
    newer = type("Newer", (Tiny,), {"on_train_batch_middle": lambda self: None})
    original = fit.hooks
    try:
        fit.hooks = lambda: original() | {"on_train_batch_middle"}
        pl.LightningModule.on_train_batch_middle = lambda self: None
        with pytest.raises(ContractError, match="Newer.on_train_batch_middle is not supported .*does not know"):
            lightning.lightning_setup(CTX, newer(lambda o: o))
    finally:
        fit.hooks = original
        del pl.LightningModule.on_train_batch_middle


def test_the_optimizer_is_the_one_trainer_would_make() -> None:
    """Against a real Trainer's create_optimizer: the same class, arguments and two groups."""
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=20, n_positions=8, n_embd=8, n_layer=1, n_head=2))
    args = transformers.TrainingArguments(output_dir="unused", learning_rate=3e-4, weight_decay=0.1, optim="adamw_torch",
                                          adam_beta2=0.95, report_to=[])
    ours = hf._optimizer(model, args)
    theirs = transformers.Trainer(model=model, args=args).create_optimizer()
    assert type(ours) is type(theirs) and ours.defaults == theirs.defaults
    assert [(len(g["params"]), g["weight_decay"]) for g in ours.param_groups] == \
        [(len(g["params"]), g["weight_decay"]) for g in theirs.param_groups]


def test_bf16_trains_under_autocast_and_the_loss_is_the_models_own() -> None:
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=20, n_positions=8, n_embd=8, n_layer=1, n_head=2))
    args = transformers.TrainingArguments(output_dir="unused", bf16=True, use_cpu=True, per_device_train_batch_size=2, report_to=[],
                                          gradient_accumulation_steps=3, max_grad_norm=0.5)
    data = [{"input_ids": torch.arange(8) % 20, "labels": torch.arange(8) % 20} for _ in range(4)]
    setup = hf.hf_setup(CTX, model, args, train_dataset=data)
    assert (setup.accumulate, setup.grad_clip, setup.batch_size) == (3, 0.5, 6)
    out = setup.loss_fn(setup.model, next(iter(setup.loader)))
    assert out.logits.dtype == torch.bfloat16 and out.loss.shape == ()


def test_knobs_reproci_does_not_honour_are_refused() -> None:
    model = nn.Linear(2, 1)
    args = transformers.TrainingArguments(output_dir="unused", label_smoothing_factor=0.1, report_to=[])
    with pytest.raises(ContractError, match="label_smoothing_factor=0.1 is not supported"):
        hf.hf_setup(CTX, model, args, train_dataset=[])


# A value other than the default for each field hf_setup refuses (set after construction: some
# would need a GPU or a cluster to construct).
NOT_DEFAULT = {"label_smoothing_factor": 0.1, "optim_target_modules": ["attn"], "average_tokens_across_devices": False,
               "tf32": True, "use_liger_kernel": True, "liger_kernel_config": {"rope": True},
               "auto_find_batch_size": True, "dataloader_persistent_workers": True, "dataloader_in_order": False,
               "load_best_model_at_end": True, "ignore_data_skip": True, "parallelism_config": object(),
               "accelerator_config": transformers.trainer_pt_utils.AcceleratorConfig(split_batches=True),
               "fsdp": "full_shard", "fsdp_config": {"min_num_params": 1}, "deepspeed": "ds.json",
               "ddp_backend": "gloo", "ddp_find_unused_parameters": True, "ddp_bucket_cap_mb": 1,
               "ddp_broadcast_buffers": False, "ddp_static_graph": True, "ddp_timeout": 60, "sortish_sampler": True}


def test_every_field_of_the_installed_training_arguments_is_done_as_trainer_does_it_or_named_inert_or_refused() -> None:
    """A field a new transformers release adds fails here until it is put in one of hf_setup's
    tables: no field is dropped without a word."""
    import dataclasses

    tables = hf.INERT | hf.REPLACED | hf.HONOURED | set(hf.REFUSED)
    assert not [f.name for f in dataclasses.fields(transformers.TrainingArguments) if f.name not in tables]
    assert not (hf.INERT & hf.REPLACED) and not (hf.INERT | hf.REPLACED) & (hf.HONOURED | set(hf.REFUSED))
    assert not hf.HONOURED & set(hf.REFUSED)


@pytest.mark.parametrize("name", sorted(hf.REFUSED))
def test_each_field_hf_setup_does_not_do_is_refused_in_one_line_that_names_it(name) -> None:
    """data_seed, TrainingArguments' own, used to be dropped silently: each field that changes
    what is trained and that hf_setup does not do is refused where set, and only there."""
    import dataclasses

    args = _args()
    if name not in {f.name for f in dataclasses.fields(args)}:
        pytest.skip(f"transformers {transformers.__version__} has no {name}")
    data = [{"input_ids": torch.arange(4), "labels": torch.arange(4)}]
    hf.hf_setup(CTX, _tiny_gpt2(), _args(), train_dataset=data)  # at its default: taken
    setattr(args, name, NOT_DEFAULT[name])
    with pytest.raises(ContractError) as e:
        hf.hf_setup(CTX, _tiny_gpt2(), args, train_dataset=data)
    assert f"TrainingArguments {name}=" in str(e.value) and "\n" not in str(e.value)


def test_a_field_of_a_newer_release_is_refused_where_set() -> None:
    import dataclasses

    @dataclasses.dataclass
    class Newer(transformers.TrainingArguments):
        loss_reweighting: float = 1.0

    data = [{"input_ids": torch.arange(4), "labels": torch.arange(4)}]
    hf.hf_setup(CTX, _tiny_gpt2(), Newer(output_dir="unused", use_cpu=True, report_to=[]), train_dataset=data)
    with pytest.raises(ContractError, match=r"loss_reweighting=2.0 is not supported \(this version of hf_setup"):
        hf.hf_setup(CTX, _tiny_gpt2(), Newer(output_dir="unused", use_cpu=True, report_to=[], loss_reweighting=2.0),
                    train_dataset=data)


def _order(setup) -> list[int]:
    return [int(b["input_ids"][0, 0]) for b in setup.loader]


def test_data_seed_orders_the_samples_whatever_the_run_seed_as_trainer_orders_them() -> None:
    """hf_setup used to ignore data_seed: the same order as without it."""
    data = [{"input_ids": torch.full((4,), i), "labels": torch.full((4,), i)} for i in range(16)]
    seeded = [hf.hf_setup(ModelContext(profile="quick", device=torch.device("cpu"), seed=s, steps=4), _tiny_gpt2(),
                          _args(data_seed=d, per_device_train_batch_size=1), train_dataset=data)
              for s, d in ((0, 7), (1, 7), (0, 8), (0, None))]
    assert _order(seeded[0]) == _order(seeded[1])  # --seed does not move it
    assert _order(seeded[0]) != _order(seeded[2]) and _order(seeded[0]) != _order(seeded[3])
    assert seeded[0].config["training_args"]["data_seed"] == 7 and "data_seed" not in seeded[3].config["training_args"]


def _tiny_gpt2():
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=20, n_positions=8, n_embd=8, n_layer=1, n_head=2))


def _args(**kw):
    return transformers.TrainingArguments(output_dir="unused", use_cpu=True, report_to=[], **kw)


def test_activation_checkpointing_is_enabled_as_trainer_enables_it_and_named_in_the_identity() -> None:
    data = [{"input_ids": torch.arange(8) % 20, "labels": torch.arange(8) % 20}]
    plain = hf.hf_setup(CTX, _tiny_gpt2(), _args(), train_dataset=data)
    setup = hf.hf_setup(CTX, _tiny_gpt2(), _args(activation_checkpointing=True,
                                                 activation_checkpointing_kwargs={"use_reentrant": False}), train_dataset=data)
    assert setup.model.is_activation_checkpointing and not plain.model.is_activation_checkpointing
    assert setup.config["training_args"]["activation_checkpointing"] is True
    assert "activation_checkpointing" not in plain.config["training_args"]  # an unused knob keeps the old identity
    setup.model.train()
    setup.loss_fn(setup.model, next(iter(setup.loader))).loss.backward()  # the recomputed forward runs


def test_activation_checkpointing_every_n_layers_marks_the_layers_trainer_marks(tmp_path) -> None:
    """The layers checkpointed under ``every_n_layers``, against a real ``Trainer.train`` of one
    step: hf_setup once checkpointed every layer ([T, T, T, T] where Trainer gives [T, F, T, F])."""
    def four_layers():
        torch.manual_seed(0)
        return transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=20, n_positions=8, n_embd=8, n_layer=4,
                                                                    n_head=2))

    data = [{"input_ids": torch.arange(8) % 20, "labels": torch.arange(8) % 20}]
    args = transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[], max_steps=1,
                                          save_strategy="no", disable_tqdm=True, activation_checkpointing=True,
                                          activation_checkpointing_kwargs={"every_n_layers": 2, "use_reentrant": False})
    if not hasattr(args, "activation_checkpointing"):
        pytest.skip(f"transformers {transformers.__version__} has no every_n_layers")
    trainer = transformers.Trainer(model=four_layers(), args=args, train_dataset=data)
    trainer.train()
    marked = [bool(getattr(b, "gradient_checkpointing", False)) for b in trainer.model.transformer.h]
    setup = hf.hf_setup(CTX, four_layers(), args, train_dataset=data)
    assert [bool(getattr(b, "gradient_checkpointing", False)) for b in setup.model.transformer.h] == marked
    assert marked == [True, False, True, False]


def test_a_step_trains_the_bits_trainer_trains_with_its_loss_over_the_steps_label_tokens(tmp_path) -> None:
    """Against a real ``Trainer.train`` of 3 steps, 2 micro-batches each, labels padded with -100
    in varying numbers: the same parameters to the bit. Trainer passes a model that takes loss
    kwargs the step's label tokens (``num_items_in_batch``) and does not divide by the
    accumulation; hf_setup used to take each micro-batch's mean over K (other values)."""
    from reproci.worker.data.batches import Accumulated
    from reproci.worker.train import train_step

    def model():
        torch.manual_seed(0)
        return transformers.GPT2LMHeadModel(transformers.GPT2Config(
            vocab_size=20, n_positions=8, n_embd=8, n_layer=1, n_head=2, resid_pdrop=0.0, embd_pdrop=0.0,
            attn_pdrop=0.0))

    g = torch.Generator().manual_seed(0)
    data = []
    for i in range(12):
        ids = torch.randint(0, 20, (8,), generator=g)
        labels = ids.clone()
        labels[8 - i % 5:] = -100  # 0 to 4 padded positions
        data.append({"input_ids": ids, "labels": labels})
    args = transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[], max_steps=3,
                                          per_device_train_batch_size=2, gradient_accumulation_steps=2,
                                          train_sampling_strategy="sequential", save_strategy="no",
                                          disable_tqdm=True, learning_rate=1e-2)
    trainer = transformers.Trainer(model=model(), args=args, train_dataset=data)
    trainer.train()
    ctx = ModelContext(profile="quick", device=torch.device("cpu"), seed=0, steps=3)
    from reproci.worker.contract import validate

    setup = validate(hf.hf_setup(ctx, model(), args, train_dataset=data), "hf_setup")
    assert setup.config["loss"] == "num_items_in_batch"
    setup.model.train()
    batches = iter(setup.loader)
    for step in range(1, 4):
        train_step(setup, setup.model, Accumulated([next(batches), next(batches)]), step)
    theirs, ours = trainer.model.state_dict(), setup.model.state_dict()
    assert [k for k in theirs if not torch.equal(theirs[k], ours[k])] == []


def test_neftune_noise_is_added_to_the_embeddings_from_torchs_global_generator() -> None:
    data = [{"input_ids": torch.arange(8) % 20, "labels": torch.arange(8) % 20}]
    setup = hf.hf_setup(CTX, _tiny_gpt2(), _args(neftune_noise_alpha=5.0), train_dataset=data)
    embeddings, ids = setup.model.get_input_embeddings(), torch.arange(8).reshape(1, 8)
    setup.model.train()
    torch.manual_seed(1)
    noisy = embeddings(ids)
    torch.manual_seed(1)  # the generator a checkpoint holds: put back, the same noise
    assert not torch.equal(noisy, embeddings.weight[ids]) and torch.equal(embeddings(ids), noisy)
    assert setup.config["training_args"]["neftune_noise_alpha"] == 5.0


def test_group_by_length_orders_by_trainers_sampler_from_the_loader_generator_and_resumes_its_position() -> None:
    from transformers.trainer_pt_utils import LengthGroupedSampler

    from reproci.worker.data import loader as data_loader

    data = [{"input_ids": torch.arange(n) % 20, "labels": torch.arange(n) % 20} for n in (2, 8, 3, 7, 4, 6, 5, 8) * 2]
    setup = hf.hf_setup(CTX, _tiny_gpt2(), _args(train_sampling_strategy="group_by_length", per_device_train_batch_size=1,
                                                 gradient_accumulation_steps=2, remove_unused_columns=False),
                        train_dataset=data)
    sampler = setup.loader.sampler
    assert isinstance(sampler, LengthGroupedSampler) and sampler.batch_size == 2
    assert sampler.generator is setup.generator()  # the loader generator: the epoch-start snapshot holds it
    assert setup.config["training_args"]["train_sampling_strategy"] == "group_by_length"
    start = data_loader.snapshot(setup)
    run = [b["input_ids"] for b in data_loader.begin_epoch(setup, 0)]
    data_loader.restore(setup, start)
    resumed, _ = data_loader.replay_epoch(setup, 0, 5)
    assert [b["input_ids"].tolist() for b in resumed] == [b.tolist() for b in run[5:]]


def test_sequential_sampling_does_not_shuffle() -> None:
    data = [{"input_ids": torch.full((8,), i), "labels": torch.full((8,), i)} for i in range(4)]
    setup = hf.hf_setup(CTX, _tiny_gpt2(), _args(train_sampling_strategy="sequential", per_device_train_batch_size=1),
                        train_dataset=data)
    assert [int(b["input_ids"][0, 0]) for b in setup.loader] == [0, 1, 2, 3]


@pytest.mark.parametrize("kw, ctx, says", [
    ({"train_sampling_strategy": "batch_rebalance"}, CTX, "batch_rebalance' is not supported"),
    ({"train_sampling_strategy": "group_by_length"}, ModelContext(profile="quick", device=torch.device("cpu"), seed=0,
                                                                  rank=0, world_size=2),
     "group_by_length runs in one process only"),
], ids=["batch_rebalance", "group_by_length-ranks"])
def test_samplings_whose_resume_is_not_guaranteed_are_refused_in_one_line(kw, ctx, says) -> None:
    with pytest.raises(ContractError, match=says):
        hf.hf_setup(ctx, _tiny_gpt2(), _args(**kw), train_dataset=[{"input_ids": torch.arange(8)}] * 4)


def test_torch_compile_compiles_as_trainer_does_and_the_worker_hashes_the_plain_module() -> None:
    from reproci.worker import execution

    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=20, n_positions=8, n_embd=8, n_layer=1, n_head=2))
    args = transformers.TrainingArguments(output_dir="unused", torch_compile=True, torch_compile_mode="reduce-overhead",
                                          use_cpu=True, report_to=[])
    setup = hf.hf_setup(CTX, model, args, train_dataset=[{"input_ids": torch.arange(8), "labels": torch.arange(8)}])
    compiled = execution.unwrap(setup)
    assert compiled is not None and setup.model is model and compiled._orig_mod is model
    assert not any("_orig_mod" in n for n, _ in setup.model.named_parameters())


def test_a_library_stamp_in_the_config_is_not_part_of_the_models_identity() -> None:
    config = transformers.GPT2Config(n_layer=1).to_dict()
    older = {**config, "transformers_version": "5.22.0", "text_config": {"transformers_version": "5.22.0", "n": 1}}
    newer = {**config, "transformers_version": "5.23.0", "text_config": {"transformers_version": "5.23.0", "n": 1}}
    assert config_sha256(older) == config_sha256(newer)
    assert config_sha256({**newer, "n_layer": 2}) != config_sha256(newer)
    assert config_sha256({"_commit_hash": "a", "x": 1}) == config_sha256({"_commit_hash": "b", "x": 1})


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The examples (and a module that uses its batch_idx) as a new user runs them: a golden
    recorded, then a run against it."""
    cli = Cli(tmp_path_factory.mktemp("adapters"))
    models = ("-m", HF_EXAMPLE, "-m", LIGHTNING_EXAMPLE, "-m", f"{PLUGINS / 'lightning_module.py'}:adapted", "--steps", "12")
    recorded = cli("golden", "update", *models)
    assert recorded.returncode == 0, recorded.stdout + recorded.stderr
    out = cli("run", *models)
    assert out.returncode == 0, out.stdout + out.stderr
    return cli, cli.latest()


@pytest.mark.slow
@pytest.mark.parametrize("name, metric", [("hf_gpt2", "eval_loss"), ("lightning_regressor", "val_loss"),
                                          ("lightning_module.adapted", None)])
def test_each_example_runs_through_reproci_in_one_call_and_is_reproducible(run, name, metric) -> None:
    cli, doc = run
    entry = model_entry(doc, name)
    assert entry["verdict"] == verdicts.PASS, entry["message"]
    assert entry["golden"]["verdict"] == verdicts.PASS, entry["message"]
    assert entry["message"].startswith("A = B = C: bitwise reproducible, resume exact"), entry["message"]
    assert "warning" not in entry["message"]
    record = json.loads((cli.cwd / "results" / doc["run_id"] / name / "record-A.json").read_text())
    if metric:
        assert set(record["eval"]) == {metric}


@pytest.mark.slow
def test_the_hf_example_takes_its_training_arguments(run) -> None:
    cli, doc = run
    record = json.loads((cli.cwd / "results" / doc["run_id"] / "hf_gpt2" / "record-A.json").read_text())
    assert record["accumulate"] == 2 and record["batch_size"] == 8
    assert record["config"]["training_args"]["lr_scheduler_type"] == "SchedulerType.COSINE"
    assert record["config"]["hf_config"]["transformers_version"] == transformers.__version__  # kept in the record


OLDER_TRANSFORMERS = """\
import transformers.configuration_utils
transformers.configuration_utils.__version__ = "5.22.0"  # what PretrainedConfig.to_dict stamps
"""


@pytest.mark.slow
def test_a_golden_from_another_transformers_version_is_upgrade_changed(tmp_path) -> None:
    """The upgrade, simulated: the golden is recorded by processes whose transformers stamps
    5.22.0 into every config it writes (a sitecustomize on their path), with --threads 2 (as
    another version's kernels would give other bits), and its packages are edited to say
    transformers 5.22.0. Then a run with this transformers: the model's config carries another
    transformers_version, yet it is the same model, so the verdict is UPGRADE_CHANGED, exit 3,
    naming the package (with the stamp in the identity it was MODEL_CHANGED, "not compared")."""
    cli = Cli(tmp_path)
    site = tmp_path / "older"
    site.mkdir()
    (site / "sitecustomize.py").write_text(OLDER_TRANSFORMERS)
    short = ("-m", HF_EXAMPLE, "--steps", "6")
    older = cli("golden", "update", *short, "--threads", "2", env={"PYTHONPATH": f"{ROOT}:{site}"})
    assert older.returncode == 0, older.stdout + older.stderr
    recorded = cli.latest()
    assert model_entry(recorded, "hf_gpt2")["config"]["hf_config"]["transformers_version"] == "5.22.0"
    path = tmp_path / "goldens" / "local.yaml"
    header = "".join(line for line in path.read_text().splitlines(True) if line.startswith("#"))
    data = yaml.safe_load(path.read_text())
    data["packages"]["transformers"] = "5.22.0"
    path.write_text(header + yaml.safe_dump(data, sort_keys=False))
    out = cli("run", *short)
    assert out.returncode == errors.EXIT_DRIFT, out.stdout + out.stderr
    entry = model_entry(cli.latest(), "hf_gpt2")
    assert entry["config"]["hf_config"]["transformers_version"] == transformers.__version__
    assert entry["verdict"] == verdicts.UPGRADE_CHANGED, entry["message"]
    assert entry["golden"]["package_diff"]["transformers"] == ["5.22.0", transformers.__version__]
    assert f"transformers 5.22.0 → {transformers.__version__}" in entry["message"]


@pytest.mark.slow
def test_a_datamodule_that_builds_its_data_in_setup_is_reproducible_resumed_too(tmp_path) -> None:
    """Datasets built in the datamodule's ``setup()`` from the global generator, layers built in
    ``configure_model()``: every run, the resumed one (in epoch 1) included, calls the hooks in
    the Trainer's order after reproci seeded it, so A = B = C."""
    cli = Cli(tmp_path)
    out = cli("run", "-m", DATAMODULE, "--steps", "8", "--resume-at", "4")
    assert out.returncode == 0, out.stdout + out.stderr
    doc = cli.latest()
    entry = model_entry(doc, "lightning_datamodule")
    assert entry["message"].startswith("A = B = C: bitwise reproducible, resume exact"), entry["message"]
    assert entry["coverage"]["resume_epoch"] == 1
    for role in "ABC":
        record = json.loads((cli.cwd / "results" / doc["run_id"] / "lightning_datamodule" / f"record-{role}.json").read_text())
        assert record["config"]["hooks"] == [
            "datamodule.prepare_data", "module.prepare_data", "datamodule.setup", "module.setup",
            "module.configure_model", "module.configure_optimizers", "module.on_fit_start",
            "datamodule.train_dataloader", "module.on_train_start"], role
        assert record["config"]["lightning_datamodule"] == "Data" and set(record["eval"]) == {"val_loss"}


NO_ACCELERATE = """\
import sys
sys.modules["accelerate"] = None  # as if not installed: find_spec gives None, import raises
sys.modules["peft"] = None  # it needs accelerate: not installed either
"""


@pytest.mark.slow
def test_the_hf_example_without_accelerate_says_what_to_install(tmp_path) -> None:
    """transformers installed but not accelerate (a user who installed transformers alone):
    TrainingArguments refuses, and the run says in one line which package and which extra."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(NO_ACCELERATE)
    cli = Cli(tmp_path)
    out = cli("run", "-m", HF_EXAMPLE, "--steps", "4", "--resume-at", "2", env={"PYTHONPATH": f"{ROOT}:{site}"})
    assert out.returncode == errors.EXIT_RUN_ERROR, out.stdout + out.stderr
    line = "model 'hf_gpt2' needs the package 'accelerate' (TrainingArguments requires it): pip install 'reproci[hf]'"
    entry = model_entry(cli.latest(), "hf_gpt2")
    assert entry["verdict"] == verdicts.ERROR and entry["error"]["kind"] == "contract", entry
    assert entry["message"].endswith(line) and "\n" not in entry["message"], entry["message"]
    assert f"hf_gpt2: ERROR: run A: breaks the plugin contract: {line}" in out.stdout.replace("\n", " ")
    assert "Traceback" not in out.stdout + out.stderr


def test_lightning_setup_checkpoints_what_the_trainer_checkpoints_and_the_plugins_own_state() -> None:
    """The datamodule's state_dict and what on_save_checkpoint adds go into the run's extra state,
    and come back through load_state_dict and on_load_checkpoint, as a Trainer's resume puts them
    back; get_extra_state/set_extra_state beside the adapter (a TypeError before) are kept too."""
    from .plugins import lightning_state

    own = {"count": 3}
    module, data = lightning_state.KeptClassifier(0), lightning_state.StatefulData(0)
    setup = lightning.lightning_setup(CTX, module, datamodule=data, get_extra_state=lambda: dict(own),
                                      set_extra_state=own.update)
    saved = setup.get_extra_state()
    assert saved["n"] == 0 and saved["plugin"] == {"count": 3}
    assert set(saved["on_save_checkpoint"]) == {"jitter"} and set(saved["datamodule"]) == {"noise"}
    torch.randn(4, generator=module.jitter), torch.randn(4, generator=data.noise)
    own["count"] = 9
    setup.set_extra_state(saved)
    assert torch.equal(module.jitter.get_state(), saved["on_save_checkpoint"]["jitter"])
    assert torch.equal(data.noise.get_state(), saved["datamodule"]["noise"]) and own["count"] == 3
    plain = lightning.lightning_setup(CTX, lightning_state.Classifier(0), datamodule=lightning_state.Data(0))
    assert plain.get_extra_state() == {"n": 0}  # no hook, no state of its own: the batch index alone
    with pytest.raises(ContractError, match="give both get_extra_state and set_extra_state"):
        lightning.lightning_setup(CTX, lightning_state.Classifier(0), datamodule=lightning_state.Data(0),
                                  get_extra_state=dict)


def test_a_resume_puts_back_the_trainers_state_in_lightnings_order_and_under_its_keys(tmp_path) -> None:
    """Against a real ``Trainer.fit(ckpt_path=...)``: ``on_load_checkpoint`` runs before the
    datamodule's ``load_state_dict`` (reproci used to call them the other way round), and the
    checkpoint it is given holds the datamodule's state under the datamodule's class name, where
    Lightning's own checkpoint puts it (a hook reading it there used to pass unread)."""
    from .plugins import lightning_state

    order: list = []

    class Data(lightning_state.StatefulData):
        def load_state_dict(self, state_dict):
            order.append("datamodule.load_state_dict")
            super().load_state_dict(state_dict)

    class Module(lightning_state.KeptClassifier):
        def on_load_checkpoint(self, checkpoint):
            order.append(("module.on_load_checkpoint", sorted(checkpoint[type(self.trainer.datamodule).__qualname__])))
            super().on_load_checkpoint(checkpoint)

    def trainer(steps: int, **kw):
        return pl.Trainer(accelerator="cpu", devices=1, max_steps=steps, logger=False, enable_progress_bar=False,
                          enable_model_summary=False, num_sanity_val_steps=0, default_root_dir=tmp_path, **kw)

    saving = pl.callbacks.ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=2, save_top_k=-1)
    trainer(2, callbacks=[saving]).fit(Module(0), datamodule=Data(0))
    trainer(4).fit(Module(0), datamodule=Data(0), ckpt_path=saving.best_model_path or saving.last_model_path
                   or next(str(p) for p in tmp_path.glob("*.ckpt")))
    theirs = list(order)
    order.clear()
    setup = lightning.lightning_setup(CTX, Module(0), datamodule=Data(0))
    setup.set_extra_state(setup.get_extra_state())
    assert order == theirs == [("module.on_load_checkpoint", ["noise"]), "datamodule.load_state_dict"]


def test_hf_setup_takes_extra_state_beside_the_adapter() -> None:
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=20, n_positions=8, n_embd=8, n_layer=1, n_head=2))
    own = {"count": 3}
    setup = hf.hf_setup(CTX, model, transformers.TrainingArguments(output_dir="unused", report_to=[]),
                        train_dataset=[{"input_ids": torch.arange(8), "labels": torch.arange(8)}],
                        get_extra_state=lambda: dict(own), set_extra_state=own.update)
    assert setup.get_extra_state() == {"count": 3}
    setup.set_extra_state({"count": 5})
    assert own["count"] == 5


class _Kept(pl.LightningModule):
    """Keeps every loss in a persistent torchmetrics ``CatMetric`` (a list state, empty in a new
    process), and an offset tensor and a generator through ``on_save_checkpoint``."""

    def __init__(self, offset_on: str = "cpu") -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = nn.Linear(2, 1)
        self.seen = __import__("torchmetrics").CatMetric()
        self.seen.persistent(True)
        self.offset, self.jitter = torch.zeros(2, device=offset_on), torch.Generator().manual_seed(1)

    def training_step(self, batch, batch_idx):
        loss = self.layer(batch[0]).square().mean()
        self.seen.update(loss.detach())
        return loss

    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 2)), batch_size=4)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def on_save_checkpoint(self, checkpoint):
        checkpoint["offset"], checkpoint["jitter"] = self.offset + 1, self.jitter.get_state()

    def on_load_checkpoint(self, checkpoint):
        self.offset = checkpoint["offset"]
        self.jitter.set_state(checkpoint["jitter"])


def test_a_resume_puts_a_metrics_list_state_on_the_metrics_device(tmp_path) -> None:
    """The checkpoint loads on the CPU; a persistent torchmetrics list state, empty in the resumed
    process, was left holding those CPU tensors (on CUDA the next update or compute of the metric
    raised "Encountered different devices"). No GPU here: the meta device stands in for one."""
    from reproci.worker.state import checkpoint

    original = lightning.lightning_setup(CTX, _Kept())
    original.loss_fn(original.model, next(iter(original.loader)))
    checkpoint.save(str(tmp_path / "ckpt.pt"), original, checkpoint.LoopPosition(step=1))

    resumed = lightning.lightning_setup(CTX, _Kept())
    resumed.model.seen.to("meta")
    _, resume = checkpoint.load(str(tmp_path / "ckpt.pt"), resumed, CTX.device)
    resumed.set_extra_state(resume.extra)  # what the worker calls once the loader has replayed
    assert [t.device.type for t in resumed.model.seen.value] == ["meta"]
    assert resumed.model.layer.weight.device.type == "cpu"  # the rest where it was


def test_the_trainer_state_of_a_resume_is_on_the_device_it_was_saved_from() -> None:
    """What ``on_save_checkpoint`` kept comes back to ``on_load_checkpoint`` on the device it was
    saved from, as Lightning's own resume loads it, though the run's checkpoint loads on the CPU;
    a generator's state stays a CPU tensor. The meta device stands in for a GPU, and tensors made
    on the CPU for what the checkpoint's load gives back."""
    original = lightning.lightning_setup(CTX, _Kept(offset_on="meta"))
    saved = original.get_extra_state()
    loaded = {**saved, "on_save_checkpoint": {k: torch.zeros(v.shape, dtype=v.dtype) if v.is_meta else v
                                              for k, v in saved["on_save_checkpoint"].items()}}
    resumed = lightning.lightning_setup(CTX, _Kept())
    resumed.set_extra_state(loaded)
    assert resumed.model.offset.device.type == "meta"
    assert torch.equal(resumed.model.jitter.get_state(), saved["on_save_checkpoint"]["jitter"])
    assert "devices" not in lightning.lightning_setup(CTX, _Kept()).get_extra_state()  # a CPU run's state as it was
