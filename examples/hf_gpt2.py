"""A Hugging Face GPT-2 trained as Trainer would train it, checked by reproci in one call.

    pip install 'reproci[hf]'        # transformers and accelerate (TrainingArguments needs it)
    reproci run -m examples/hf_gpt2.py:build

Tiny and offline: a 2-layer GPT-2 from its config with random init, a word-level tokenizer
built in memory, synthetic text, HF's own collator (``DataCollatorForLanguageModeling``, causal)
and ``TrainingArguments`` with a cosine schedule over the run, warmup, weight decay, gradient
accumulation and clipping. Replace the model, the data and the arguments with yours.
"""

from __future__ import annotations

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (DataCollatorForLanguageModeling, GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast,
                          TrainingArguments)

from reproci import ModelContext, TrainSetup, hf_setup

WORDS = [f"w{i}" for i in range(60)]


def tokenizer() -> PreTrainedTokenizerFast:
    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[EOS]", *WORDS])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="[PAD]", unk_token="[UNK]", eos_token="[EOS]")


def texts(seed: int, n: int) -> list[str]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(6, 12, (n,), generator=g).tolist()
    return [" ".join(WORDS[i] for i in torch.randint(0, len(WORDS), (k,), generator=g).tolist()) for k in lengths]


def build(ctx: ModelContext) -> TrainSetup:
    tok = tokenizer()
    torch.manual_seed(ctx.seed)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_positions=16, n_embd=32, n_layer=2, n_head=2,
                                       bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id,
                                       pad_token_id=tok.pad_token_id))
    train = [tok(t) for t in texts(ctx.seed, 32)]
    held_out = [tok(t) for t in texts(ctx.seed + 1, 8)]
    args = TrainingArguments(learning_rate=1e-3, lr_scheduler_type="cosine", warmup_steps=2, weight_decay=0.01,
                             gradient_accumulation_steps=2, max_grad_norm=1.0, per_device_train_batch_size=4,
                             per_device_eval_batch_size=8, report_to=[])
    return hf_setup(ctx, model, args, train_dataset=train, eval_dataset=held_out,
                    data_collator=DataCollatorForLanguageModeling(tok, mlm=False))
