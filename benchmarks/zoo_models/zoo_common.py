"""What every zoo builder shares: synthetic data, an in-memory tokenizer, TrainingArguments.

Everything is offline and tiny: models from their config classes with random init (seeded
from the run seed before the model is built), token ids, pixels and waveforms drawn from a
generator seeded from the run seed, a word-level tokenizer built in memory (the collators pad
through ``tokenizer.pad``, so they need a real tokenizer object).

8 samples in batches of 4: 2 batches an epoch, so the zoo's default 6 steps resumed at 3
cross two epoch boundaries and the resume falls in the middle of the second epoch.
"""

from __future__ import annotations

import functools
import time
from typing import Any, Callable

import torch

from reproci.worker.contract import ModelContext, TrainSetup

SPECIAL = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")  # ids 0-4; synthetic text never uses them
PAD, UNK, CLS, SEP, MASK = range(len(SPECIAL))
VOCAB, SEQ, BATCH, SAMPLES = 96, 12, 4, 8  # 2 batches an epoch
LABELS = 3  # classes of every classification head
HELD_OUT = 1  # seed offset of the held-out examples


@functools.cache
def tokenizer() -> Any:
    """A word-level fast tokenizer over ``[PAD] … [MASK] w5 … w95``, from an in-memory vocab."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(SPECIAL + tuple(f"w{i}" for i in range(len(SPECIAL), VOCAB)))}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="[PAD]", unk_token="[UNK]",
                                   cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")


def gen(ctx: ModelContext, offset: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(ctx.seed * 7919 + offset)


def token_rows(ctx: ModelContext, n: int = SAMPLES, seq: int = SEQ, offset: int = 0, ragged: bool = True,
               vocab: int = VOCAB) -> list[list[int]]:
    """``n`` rows of synthetic ids; ragged rows (lengths seq-3 … seq) make the collators pad."""
    g = gen(ctx, offset)
    ids = torch.randint(len(SPECIAL), vocab, (n, seq), generator=g)
    lengths = torch.randint(seq - 3, seq + 1, (n,), generator=g) if ragged else torch.full((n,), seq)
    return [row[:int(k)].tolist() for row, k in zip(ids, lengths)]


def text(ctx: ModelContext, n: int = SAMPLES, offset: int = 0, **kw: Any) -> list[dict[str, Any]]:
    """Examples as a tokenizer gives them: ``{"input_ids": [...]}``."""
    return [{"input_ids": r} for r in token_rows(ctx, n, offset=offset, **kw)]


def labelled_text(ctx: ModelContext, n: int = SAMPLES, offset: int = 0, **kw: Any) -> list[dict[str, Any]]:
    """Sequence classification: the label is the first token's id modulo LABELS."""
    return [{"input_ids": r, "labels": r[0] % LABELS} for r in token_rows(ctx, n, offset=offset, **kw)]


def pairs(ctx: ModelContext, n: int = SAMPLES, offset: int = 0, **kw: Any) -> list[dict[str, Any]]:
    """Seq2seq: the target is the source reversed."""
    return [{"input_ids": r, "labels": r[::-1]} for r in token_rows(ctx, n, offset=offset, **kw)]


def images(ctx: ModelContext, n: int = SAMPLES, size: int = 32, channels: int = 3, offset: int = 0,
           labels: int = LABELS) -> list[dict[str, Any]]:
    g = gen(ctx, offset)
    x = torch.randn(n, channels, size, size, generator=g)
    y = torch.randint(0, labels, (n,), generator=g)
    return [{"pixel_values": x[i], "labels": int(y[i])} for i in range(n)]


def waveforms(ctx: ModelContext, n: int = SAMPLES, length: int = 800, offset: int = 0) -> torch.Tensor:
    return torch.randn(n, length, generator=gen(ctx, offset))


def args(**kw: Any) -> Any:
    """TrainingArguments as a small Trainer script writes them."""
    from transformers import TrainingArguments

    base = dict(output_dir="zoo-unused", learning_rate=1e-3, warmup_steps=1, weight_decay=0.01,
                per_device_train_batch_size=BATCH, per_device_eval_batch_size=BATCH, dataloader_drop_last=True,
                max_grad_norm=1.0, report_to=[])
    base.update(kw)
    return TrainingArguments(**base)


def hf(ctx: ModelContext, model: torch.nn.Module, data: list, collator: Any = None, training_args: Any = None,
       held: list | None = None, **setup: Any) -> TrainSetup:
    """The model through ``reproci.adapters.hf.hf_setup`` as Trainer would train it."""
    from reproci.adapters.hf import hf_setup

    return hf_setup(ctx, model, training_args if training_args is not None else args(), train_dataset=data,
                    data_collator=collator, eval_dataset=held, **setup)


def seeded(ctx: ModelContext, make: Callable[[], torch.nn.Module]) -> torch.nn.Module:
    """``make()`` with torch's global RNG seeded from the run seed, as a script's set_seed does."""
    torch.manual_seed(ctx.seed)
    return make()


def config(cls_name: str, **kw: Any) -> Any:
    import transformers

    return getattr(transformers, cls_name)(**kw)


def model(cls_name: str, cfg: Any) -> torch.nn.Module:
    import transformers

    return getattr(transformers, cls_name)(cfg)


# -- one factory per architecture, from a table of specs ----------------------------------------

def collator(task: str, model: torch.nn.Module) -> Any:
    """The collator a Trainer script uses for the task."""
    from transformers import (
        DataCollatorForLanguageModeling,
        DataCollatorForSeq2Seq,
        DataCollatorWithPadding,
        default_data_collator,
    )

    if task == "clm":
        return DataCollatorForLanguageModeling(tokenizer=tokenizer(), mlm=False)
    if task == "mlm":
        return DataCollatorForLanguageModeling(tokenizer=tokenizer(), mlm=True, mlm_probability=0.15)
    if task == "seqcls":
        return DataCollatorWithPadding(tokenizer())
    if task == "seq2seq":
        return DataCollatorForSeq2Seq(tokenizer(), model=model, label_pad_token_id=-100)
    return default_data_collator


def dataset(task: str, ctx: ModelContext, spec: dict[str, Any], offset: int = 0) -> list[dict[str, Any]]:
    data = spec.get("data")
    if data is not None:
        return data(ctx, offset=offset)
    seq = spec.get("seq", SEQ)
    if task in ("clm", "mlm"):
        return text(ctx, offset=offset, seq=seq)
    if task == "seqcls":
        return labelled_text(ctx, offset=offset, seq=seq)
    if task == "seq2seq":
        return pairs(ctx, offset=offset, seq=seq)
    if task == "image":
        return images(ctx, offset=offset, size=spec.get("image_size", 32))
    raise ValueError(f"no data for task {task!r}: give the spec a 'data'")


def build(ctx: ModelContext, spec: dict[str, Any], *, wrap_collator: Callable[[Any], Any] | None = None,
          held_out: bool = True, clock_seed: bool = False, **setup: Any) -> TrainSetup:
    """One spec: ``config`` (class name, kwargs), ``model`` (class name), ``task``; optional
    ``data(ctx, offset)``, ``collator(model)``, ``args`` (TrainingArguments overrides),
    ``make(cfg)`` (the model from its config, where the class alone does not do).
    ``wrap_collator`` wraps the collator; ``setup`` adds TrainSetup fields (without
    ``held_out``, the spec's held-out loss is not the run's ``eval_fn``); ``clock_seed`` seeds
    torch from the wall clock before the model is built, instead of from the run seed."""
    cfg_name, cfg_kw = spec["config"]
    cfg = config(cfg_name, **cfg_kw) if isinstance(cfg_name, str) else cfg_name(**cfg_kw)
    make = spec.get("make") or (lambda c: model(spec["model"], c))
    if clock_seed:
        torch.manual_seed(time.time_ns())
        m = make(cfg)
    else:
        m = seeded(ctx, lambda: make(cfg))
    task = spec["task"]
    collate = spec["collator"](m) if "collator" in spec else collator(task, m)
    if wrap_collator is not None:
        collate = wrap_collator(collate)
    return hf(ctx, m, dataset(task, ctx, spec), collate, training_args=args(**spec.get("args", {})),
              held=dataset(task, ctx, spec, offset=HELD_OUT)[:BATCH] if held_out else None, **setup)


def factories(specs: dict[str, dict[str, Any]], namespace: dict[str, Any]) -> None:
    """A module-level factory ``NAME(ctx)`` for every spec, as the plugin contract names them."""
    for name, spec in specs.items():
        def factory(ctx: ModelContext, _spec: dict[str, Any] = spec) -> TrainSetup:
            return build(ctx, _spec)
        factory.__name__ = factory.__qualname__ = name
        source = getattr(spec["config"][0], "__name__", spec["config"][0])
        factory.__doc__ = f"{spec['model']} ({spec['head']}) from {source} with tiny sizes, random init."
        namespace[name] = factory
