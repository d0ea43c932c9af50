"""GPT-2 small as a device benchmark model: what a run records per step costs on a real model.

GPT-2 small from its config class (124 M parameters, 12 layers, 768 wide), random init, no
download; 8 × 512 synthetic tokens a step (the full profile; the quick profile, for the counts a
CPU makes, 1 × 128: the same state, a step a CPU takes in seconds); AdamW; bf16 autocast on CUDA
(float32 elsewhere).
Its state (parameters, gradients, Adam's two moments: about 2 GB in float32) is what the
per-step record reads, so the record's cost on this model is its cost on models people train.

    python benchmarks/determinism_overhead.py --device cuda --models gpt2_small

Needs transformers (``pip install 'reproci[hf]'``); the benchmark skips it with that reason
where transformers is absent.
"""

from __future__ import annotations

import torch

from reproci.worker.contract import ModelContext, TrainSetup

SHAPES = {"full": (8, 512), "quick": (1, 128)}  # batch, tokens
VOCAB = 50257
STEPS_OF_DATA = 64  # distinct synthetic batches (the loader's epoch)


def build(ctx: ModelContext) -> TrainSetup:
    from transformers import GPT2Config, GPT2LMHeadModel

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(ctx.seed)
        model = GPT2LMHeadModel(GPT2Config()).to(ctx.device)  # the defaults are GPT-2 small
    model.config.use_cache = False
    batch, seq = SHAPES[ctx.profile]
    g = torch.Generator().manual_seed(ctx.seed)
    tokens = torch.randint(0, VOCAB, (STEPS_OF_DATA * batch, seq), generator=g)
    data = torch.utils.data.TensorDataset(tokens)
    loader = torch.utils.data.DataLoader(data, batch_size=batch, **ctx.shuffling(data), generator=ctx.generator(),
                                         drop_last=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    bf16 = ctx.device.type == "cuda"

    def loss(m: torch.nn.Module, step_batch: list[torch.Tensor]) -> torch.Tensor:
        (ids,) = step_batch
        with torch.autocast(ctx.device.type, dtype=torch.bfloat16, enabled=bf16):
            return m(input_ids=ids, labels=ids).loss

    return TrainSetup(model=model, optimizer=optimizer, loader=loader, loss_fn=loss, grad_clip=1.0,
                      batch_size=batch, config={"model": "gpt2-small", "batch": batch, "seq": seq, "bf16": bf16})
