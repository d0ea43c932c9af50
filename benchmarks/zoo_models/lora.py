"""peft: LoRA adapters on tiny transformers models, trained through ``hf_setup`` as Trainer
trains a ``PeftModel`` (only the adapter weights, and the head peft is told to save, train;
LoRA's dropout draws from torch's global RNG)."""

from __future__ import annotations

import time
from typing import Any

import hf_text
import torch
from zoo_common import args, collator, hf, labelled_text, seeded, text

from reproci.worker.contract import ModelContext, TrainSetup


def _peft(ctx: ModelContext, spec: dict[str, Any], lora: dict[str, Any], clock_seed: bool = False) -> Any:
    import transformers
    from peft import LoraConfig, get_peft_model

    cfg_name, kw = spec["config"]
    base = seeded(ctx, lambda: getattr(transformers, spec["model"])(getattr(transformers, cfg_name)(**kw)))
    if clock_seed:
        torch.manual_seed(time.time_ns())
    return get_peft_model(base, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.1, **lora))


def _train(ctx: ModelContext, name: str, lora: dict[str, Any], data: Any, clock_seed: bool = False) -> TrainSetup:
    spec = hf_text.SPECS[name]
    model = _peft(ctx, spec, lora, clock_seed)
    return hf(ctx, model, data(ctx), collator(spec["task"], model), training_args=args(learning_rate=5e-3),
              held=data(ctx, offset=1)[:4])


def gpt2_lora(ctx: ModelContext) -> TrainSetup:
    """LoRA on GPT-2's fused attention projection (``c_attn``, a Conv1D), causal LM."""
    return _train(ctx, "gpt2", {"target_modules": ["c_attn"], "task_type": "CAUSAL_LM", "fan_in_fan_out": True}, text)


def llama_lora(ctx: ModelContext) -> TrainSetup:
    """LoRA on Llama's q/v projections, causal LM."""
    return _train(ctx, "llama", {"target_modules": ["q_proj", "v_proj"], "task_type": "CAUSAL_LM"}, text)


def bert_lora_cls(ctx: ModelContext) -> TrainSetup:
    """LoRA on BERT's query/value, sequence classification; the classifier trained in full
    (peft's ``modules_to_save`` for the SEQ_CLS task)."""
    return _train(ctx, "bert_cls", {"target_modules": ["query", "value"], "task_type": "SEQ_CLS"}, labelled_text)


def gpt2_lora_clock_seed(ctx: ModelContext) -> TrainSetup:
    """Planted: the factory seeds torch from the wall clock before peft adds the adapters, so
    their initial weights (and LoRA's dropout masks) differ from run to run."""
    return _train(ctx, "gpt2", {"target_modules": ["c_attn"], "task_type": "CAUSAL_LM", "fan_in_fan_out": True}, text,
                  clock_seed=True)
