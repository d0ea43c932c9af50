"""Plugin models built with the real Hugging Face ``transformers`` library (test-only), each
correct version beside a buggy twin where the library invites a resume bug.

Everything is tiny and offline: models from small configs with random init (seeded from the
run seed), synthetic token ids from a seeded generator, and a word-level tokenizer built in
memory (the collators pad through ``tokenizer.pad``, so they need a real tokenizer object).
Batches are the collators' own ``BatchEncoding`` (a ``UserDict``, not a ``dict``).

16 samples in batches of 4: 4 batches an epoch, so a 12-step run crosses two epoch
boundaries and ``--resume-at 6`` falls in the middle of the second epoch.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import transformers
from tokenizers import Tokenizer, models, pre_tokenizers
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
from transformers import (
    BertConfig,
    BertForMaskedLM,
    DataCollatorForLanguageModeling,
    DataCollatorForSeq2Seq,
    GPT2Config,
    GPT2LMHeadModel,
    PreTrainedTokenizerFast,
    T5Config,
    T5ForConditionalGeneration,
    get_linear_schedule_with_warmup,
)
from transformers.optimization import Adafactor

from reproci import ModelContext, TrainSetup

SPECIAL = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")  # ids 0-4; synthetic text never uses them
VOCAB, SEQ, BATCH, SAMPLES = 64, 12, 4, 16  # 4 batches an epoch
HELD_OUT = 1  # seed offset of the held-out batch


@functools.cache
def _tokenizer() -> PreTrainedTokenizerFast:
    """A word-level fast tokenizer over ``[PAD] … [MASK] w5 … w63``, from an in-memory vocab."""
    vocab = {t: i for i, t in enumerate(SPECIAL + tuple(f"w{i}" for i in range(len(SPECIAL), VOCAB)))}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="[PAD]", unk_token="[UNK]",
                                   cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")


def _tokens(ctx: ModelContext, n: int = SAMPLES, offset: int = 0, seq2seq: bool = False) -> list[dict[str, list[int]]]:
    """``n`` examples of synthetic ids, as a tokenizer gives them (``{"input_ids": [...]}``); for
    seq2seq the target is the source reversed."""
    g = torch.Generator().manual_seed(ctx.seed * 7919 + offset)
    ids = torch.randint(len(SPECIAL), VOCAB, (n, SEQ), generator=g).tolist()
    return [{"input_ids": row, "labels": row[::-1]} if seq2seq else {"input_ids": row} for row in ids]


def _gpt2(ctx: ModelContext) -> GPT2LMHeadModel:
    torch.manual_seed(ctx.seed)
    config = GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=2, n_head=2, bos_token_id=2, eos_token_id=3)
    return GPT2LMHeadModel(config).to(ctx.device)


def _bert(ctx: ModelContext) -> BertForMaskedLM:
    torch.manual_seed(ctx.seed)
    return BertForMaskedLM(BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                      intermediate_size=64, max_position_embeddings=SEQ, pad_token_id=0)).to(ctx.device)


def _loss(model: torch.nn.Module, batch: Any) -> torch.Tensor:
    return model(**batch).loss


def _setup(ctx: ModelContext, model: torch.nn.Module, collator: Any, *, data: list | None = None,
           optimizer: torch.optim.Optimizer | None = None, loader_kw: dict[str, Any] | None = None,
           **kw: Any) -> TrainSetup:
    """A shuffling DataLoader over ``data`` (default ``_tokens(ctx)``) collated by ``collator``;
    AdamW with linear warmup unless an optimizer is given (then no scheduler)."""
    data = _tokens(ctx) if data is None else data
    loader = torch.utils.data.DataLoader(data, batch_size=BATCH, shuffle=True, generator=ctx.generator(),
                                         collate_fn=collator, drop_last=True, **(loader_kw or {}))
    scheduler = None
    if optimizer is None:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        scheduler = get_linear_schedule_with_warmup(optimizer, num_warmup_steps=2, num_training_steps=ctx.steps)
    kw.setdefault("loss_fn", _loss)
    return TrainSetup(model=model, optimizer=optimizer, loader=loader, scheduler=scheduler, batch_size=BATCH, **kw)


def _clm() -> DataCollatorForLanguageModeling:
    return DataCollatorForLanguageModeling(tokenizer=_tokenizer(), mlm=False)


def _mlm(**kw: Any) -> DataCollatorForLanguageModeling:
    return DataCollatorForLanguageModeling(tokenizer=_tokenizer(), mlm=True, mlm_probability=0.15, **kw)


# -- causal LM --------------------------------------------------------------------------------

def gpt2_clm(ctx: ModelContext) -> TrainSetup:
    """GPT-2 with DataCollatorForLanguageModeling(mlm=False), AdamW and linear warmup."""
    return _setup(ctx, _gpt2(ctx), _clm())


def gpt2_full_determinism(ctx: ModelContext) -> TrainSetup:
    """gpt2_clm after ``transformers.enable_full_determinism`` (which seeds everything, turns
    deterministic algorithms on and sets CUBLAS_WORKSPACE_CONFIG=":16:8")."""
    transformers.enable_full_determinism(ctx.seed)
    return gpt2_clm(ctx)


def _gpt2_ema(ctx: ModelContext, declared: bool) -> TrainSetup:
    model = _gpt2(ctx)
    ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.9))
    held = _clm()(_tokens(ctx, BATCH, offset=HELD_OUT)).to(ctx.device)

    def loss_fn(m: torch.nn.Module, batch: Any) -> torch.Tensor:
        ema.update_parameters(model)  # the plain module: ``m`` may be wrapped in DDP
        return m(**batch).loss

    def eval_fn(m: torch.nn.Module) -> dict[str, float]:
        ema.eval()
        return {"ema_loss": float(ema.module(**held).loss)}

    extra = {"state_modules": {"ema": ema}} if declared else {}
    return _setup(ctx, model, _clm(), loss_fn=loss_fn, eval_fn=eval_fn, **extra)


def gpt2_ema_unsaved(ctx: ModelContext) -> TrainSetup:
    """A weight EMA the harness is not told about: a resumed run starts a fresh EMA."""
    return _gpt2_ema(ctx, declared=False)


def gpt2_ema_declared(ctx: ModelContext) -> TrainSetup:
    """The same EMA declared as training state (``TrainSetup.state_modules``)."""
    return _gpt2_ema(ctx, declared=True)


# -- masked LM --------------------------------------------------------------------------------

def bert_mlm(ctx: ModelContext) -> TrainSetup:
    """BERT with DataCollatorForLanguageModeling(mlm=True): masking from torch's global RNG."""
    return _setup(ctx, _bert(ctx), _mlm())


def bert_mlm_private_generator(ctx: ModelContext) -> TrainSetup:
    """The collator's own ``seed=``: masking from a private generator inside the collate_fn,
    not in the checkpoint, so a resumed run masks from a fresh one."""
    return _setup(ctx, _bert(ctx), _mlm(seed=ctx.seed))


def bert_mlm_private_generator_fixed(ctx: ModelContext) -> TrainSetup:
    """The same private generator, made now (the collator makes it lazily on its first call)
    and exposed through extra state."""
    collator = _mlm(seed=ctx.seed)
    collator.create_rng()
    gen = collator.generator
    return _setup(ctx, _bert(ctx), collator, get_extra_state=lambda: {"mask_gen": gen.get_state()},
                  set_extra_state=lambda s: gen.set_state(s["mask_gen"]))


def bert_mlm_persistent_workers(ctx: ModelContext) -> TrainSetup:
    """Masking in 2 persistent worker processes: their RNG carries across epochs."""
    return _setup(ctx, _bert(ctx), _mlm(), loader_kw={"num_workers": 2, "persistent_workers": True})


def bert_mlm_workers_fixed(ctx: ModelContext) -> TrainSetup:
    """Masking in 2 worker processes started afresh each epoch, seeded from the loader generator."""
    return _setup(ctx, _bert(ctx), _mlm(), loader_kw={"num_workers": 2, "persistent_workers": False,
                                                      "worker_init_fn": ctx.seed_worker})


# -- seq2seq ----------------------------------------------------------------------------------

def t5_adafactor(ctx: ModelContext) -> TrainSetup:
    """T5 with DataCollatorForSeq2Seq (decoder_input_ids from the model) and Adafactor with
    relative steps (its state holds Python numbers and a tensor it replaces every step)."""
    torch.manual_seed(ctx.seed)
    model = T5ForConditionalGeneration(T5Config(vocab_size=VOCAB, d_model=32, d_kv=16, d_ff=64, num_layers=1,
                                                num_decoder_layers=1, num_heads=2, pad_token_id=0, eos_token_id=3,
                                                decoder_start_token_id=0)).to(ctx.device)
    optimizer = Adafactor(model.parameters(), scale_parameter=True, relative_step=True, warmup_init=True, lr=None)
    return _setup(ctx, model, DataCollatorForSeq2Seq(_tokenizer(), model=model), data=_tokens(ctx, seq2seq=True),
                  optimizer=optimizer)


def gpt2_adapted_full_determinism(ctx: ModelContext) -> TrainSetup:
    """GPT-2 through the HF adapter with TrainingArguments(full_determinism=True): HF's own
    switch (enable_full_determinism), applied as Trainer applies it."""
    from transformers import TrainingArguments

    from reproci import hf_setup

    args = TrainingArguments(output_dir="unused", learning_rate=1e-3, warmup_steps=2, full_determinism=True,
                             per_device_train_batch_size=BATCH, report_to=[])
    return hf_setup(ctx, _gpt2(ctx), args, train_dataset=_tokens(ctx), data_collator=_clm())


# -- CTC (speech) -----------------------------------------------------------------------------

def _ctc_data(ctx: ModelContext) -> list[dict[str, Any]]:
    """16 clips of 400 samples of seeded noise, each with a 3-token transcript (ids 1-11)."""
    g = torch.Generator().manual_seed(ctx.seed * 7919)
    audio = torch.randn(SAMPLES, 400, generator=g)
    labels = torch.randint(1, 12, (SAMPLES, 3), generator=g)
    return [{"input_values": audio[i], "labels": labels[i]} for i in range(SAMPLES)]


def wav2vec2_ctc(ctx: ModelContext) -> TrainSetup:
    """Wav2Vec2ForCTC through the HF adapter: its loss runs inside
    ``torch.backends.cudnn.flags(enabled=False)``, which reads the legacy TF32 getter."""
    from transformers import TrainingArguments, Wav2Vec2Config, Wav2Vec2ForCTC

    from reproci import hf_setup

    torch.manual_seed(ctx.seed)
    config = Wav2Vec2Config(vocab_size=12, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                            intermediate_size=32, conv_dim=(8, 8), conv_stride=(5, 2), conv_kernel=(10, 3),
                            num_conv_pos_embeddings=8, num_conv_pos_embedding_groups=2, layerdrop=0.0,
                            mask_time_prob=0.0, pad_token_id=0, ctc_loss_reduction="mean")
    args = TrainingArguments(output_dir="unused", learning_rate=1e-3, per_device_train_batch_size=BATCH, report_to=[])
    return hf_setup(ctx, Wav2Vec2ForCTC(config).to(ctx.device), args, train_dataset=_ctc_data(ctx))
