"""Plugin models whose gradients exist at some steps and not at others (test-only): a real
transformers model with LayerDrop, and a tiny model with a branch that runs every other step,
each correct version beside a buggy twin whose bug lives in the conditional gradient.

Everything is tiny and offline: 16 samples in batches of 4 (4 batches an epoch), random init
seeded from the run seed, synthetic data from a seeded generator.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn

from reproci import ModelContext, TrainSetup

FEATURES, BATCH, SAMPLES = 8, 4, 16  # 4 batches an epoch


def _loader(ctx: ModelContext, data: Any) -> torch.utils.data.DataLoader:
    return torch.utils.data.DataLoader(data, batch_size=BATCH, shuffle=True, generator=ctx.generator(), drop_last=True)


# -- a real transformers model with LayerDrop -------------------------------------------------

MELS, FRAMES, TOKENS, VOCAB = 8, 16, 6, 32  # Whisper's encoder halves the frames: 8 positions


def whisper_layerdrop(ctx: ModelContext) -> TrainSetup:
    """A tiny Whisper (random init) trained with encoder and decoder LayerDrop 0.5: each step
    skips a random subset of layers (drawn from torch's global RNG), whose parameters then
    have no gradient at that step. The encoder's positional embedding is frozen."""
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    torch.manual_seed(ctx.seed)
    config = WhisperConfig(vocab_size=VOCAB, num_mel_bins=MELS, d_model=16, encoder_layers=2, decoder_layers=2,
                           encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
                           decoder_ffn_dim=32, max_source_positions=FRAMES // 2, max_target_positions=TOKENS + 2,
                           encoder_layerdrop=0.5, decoder_layerdrop=0.5, pad_token_id=0, bos_token_id=1,
                           eos_token_id=2, decoder_start_token_id=1, suppress_tokens=None, begin_suppress_tokens=None)
    model = WhisperForConditionalGeneration(config).to(ctx.device)
    g = torch.Generator().manual_seed(ctx.seed * 7919)
    features = torch.randn(SAMPLES, MELS, FRAMES, generator=g)  # (N, mels, frames)
    labels = torch.randint(3, VOCAB, (SAMPLES, TOKENS), generator=g)  # (N, T)
    data = [{"input_features": features[i], "labels": labels[i]} for i in range(SAMPLES)]
    return TrainSetup(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3),
                      loader=_loader(ctx, data), loss_fn=lambda m, b: m(**b).loss, batch_size=BATCH)


# -- a branch that runs every other step ------------------------------------------------------

class Branchy(nn.Module):
    """A trunk every step, and a branch added on the steps its schedule picks: the branch's
    parameters have a gradient on those steps only. The schedule counts forward passes in a
    buffer (checkpointed with the model) or, in the buggy twin, in a Python attribute (not)."""

    def __init__(self, *, on_odd: bool, counter_in_buffer: bool = True) -> None:
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(FEATURES, 16), nn.Tanh(), nn.Linear(16, 1))
        self.branch = nn.Linear(FEATURES, 1)  # registered last: backward reaches it first
        self.on_odd = on_odd
        self.counter_in_buffer = counter_in_buffer
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))
        self.py_calls = 0

    def uses_branch(self) -> bool:
        if self.counter_in_buffer:
            self.calls += 1
            n = int(self.calls)
        else:
            self.py_calls += 1
            n = self.py_calls
        return (n % 2 == 1) == self.on_odd

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, F) -> (B, 1)
        y = self.trunk(x)
        return y + self.branch(x) if self.uses_branch() else y


def _branchy_setup(ctx: ModelContext, model: Branchy) -> TrainSetup:
    g = torch.Generator().manual_seed(ctx.seed * 7919)
    x = torch.randn(SAMPLES, FEATURES, generator=g)
    data = list(zip(x, x[:, :1] * 2 + 0.1))
    return TrainSetup(model=model.to(ctx.device), optimizer=torch.optim.Adam(model.parameters(), lr=1e-2),
                      loader=_loader(ctx, data), batch_size=BATCH,
                      loss_fn=lambda m, b: nn.functional.mse_loss(m(b[0]), b[1]))


def branch_every_other_step(ctx: ModelContext) -> TrainSetup:
    """The branch runs on even steps (2, 4, ...): no gradient for it at step 1."""
    torch.manual_seed(ctx.seed)
    return _branchy_setup(ctx, Branchy(on_odd=False))


def branch_noisy_gradient(ctx: ModelContext) -> TrainSetup:
    """The branch of ``branch_every_other_step``, whose gradient gets noise from a generator
    seeded from the OS on the steps it runs: nondeterministic in that gradient only."""
    torch.manual_seed(ctx.seed)
    model = Branchy(on_odd=False)
    noise = torch.Generator().manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)
    model.branch.weight.register_hook(lambda grad: grad + 1e-3 * torch.randn(grad.shape, generator=noise).to(grad))
    return _branchy_setup(ctx, model)


def branch_counter_unsaved(ctx: ModelContext) -> TrainSetup:
    """The branch runs on odd steps by a counter kept in a Python attribute, which the
    checkpoint does not hold: a resumed run counts from 0 again and runs the branch on the
    other steps."""
    torch.manual_seed(ctx.seed)
    return _branchy_setup(ctx, Branchy(on_odd=True, counter_in_buffer=False))
