"""Planted bugs, one kind per architecture family, each on a zoo architecture that passes
as written: the verdict each must get is in ``benchmarks/zoo.py`` (``expect``).

- a private RNG in the collator: a ``random.Random`` inside the collate function (token
  dropout), seeded apart from the run and not in the checkpoint: a resumed run draws from a
  fresh one (RESUME_BROKEN);
- a clock seed: ``torch.manual_seed(time.time_ns())`` in the factory, so every run starts from
  other initial weights (NONDETERMINISTIC);
- an EMA outside the checkpoint: a weight EMA updated after every step and read by the held-out
  metric, not declared as training state: a resumed run starts a fresh EMA (RESUME_BROKEN).
  Its twin declares it in ``TrainSetup.state_modules`` and must pass.

The diffusers, peft and Lightning bugs sit beside their clean entries (``diffusion.py``,
``lora.py``, ``lightning_zoo.py``).
"""

from __future__ import annotations

import random
from typing import Any

import hf_audio
import hf_seq2seq
import hf_text
import hf_vision
import torch
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
from zoo_common import BATCH, HELD_OUT, build, dataset

from reproci.worker.contract import ModelContext, TrainSetup


class TokenDropout:
    """Wraps a collator: drops each source token with probability 0.15, drawn from ``rng``."""

    def __init__(self, collate: Any, rng: random.Random) -> None:
        self.collate, self.rng = collate, rng

    def __call__(self, features: list[dict[str, Any]]) -> Any:
        kept = [dict(f, input_ids=[t for t in f["input_ids"] if self.rng.random() > 0.15] or f["input_ids"][:1])
                for f in features]
        return self.collate(kept)


def bert_collator_rng(ctx: ModelContext) -> TrainSetup:
    """BERT MLM whose collator drops tokens from its own ``random.Random(seed)``."""
    return build(ctx, hf_text.SPECS["bert"], wrap_collator=lambda c: TokenDropout(c, random.Random(ctx.seed)))


def bart_collator_rng(ctx: ModelContext) -> TrainSetup:
    """BART whose collator drops source tokens (a denoising corruption) from its own ``random.Random(seed)``."""
    return build(ctx, hf_seq2seq.SPECS["bart"], wrap_collator=lambda c: TokenDropout(c, random.Random(ctx.seed + 1)))


def vit_clock_seed(ctx: ModelContext) -> TrainSetup:
    """ViT initialised after ``torch.manual_seed(time.time_ns())``."""
    return build(ctx, hf_vision.SPECS["vit"], clock_seed=True)


def _ema(ctx: ModelContext, spec: dict[str, Any], declared: bool) -> TrainSetup:
    box: dict[str, Any] = {}

    def after_step(step: int) -> None:
        box["ema"].update_parameters(box["model"])

    def eval_fn(m: torch.nn.Module) -> dict[str, float]:
        ema = box["ema"]
        ema.eval()
        return {"ema_loss": float(ema.module(**box["held"]).loss)}

    def capture(collate: Any) -> Any:
        box["collate"] = collate
        return collate

    setup = build(ctx, spec, wrap_collator=capture, held_out=False, after_step=after_step)
    setup.eval_fn = eval_fn  # hf_setup sets its own (None without an eval_dataset)
    box["model"] = setup.model
    box["ema"] = AveragedModel(setup.model, multi_avg_fn=get_ema_multi_avg_fn(0.9))
    box["held"] = {k: v.to(ctx.device) if isinstance(v, torch.Tensor) else v
                   for k, v in box["collate"](dataset(spec["task"], ctx, spec, offset=HELD_OUT)[:BATCH]).items()}
    if declared:
        setup.state_modules = {"ema": box["ema"]}
    return setup


def wav2vec2_ema_unsaved(ctx: ModelContext) -> TrainSetup:
    """Wav2Vec2ForCTC with a weight EMA (torch AveragedModel) the checkpoint does not hold."""
    return _ema(ctx, hf_audio.SPECS["wav2vec2_ctc"], declared=False)


def wav2vec2_ema_declared(ctx: ModelContext) -> TrainSetup:
    """The same EMA declared in TrainSetup.state_modules: checkpointed and restored (must pass)."""
    return _ema(ctx, hf_audio.SPECS["wav2vec2_ctc"], declared=True)
