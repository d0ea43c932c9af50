"""A timm ViT with timm's own weight EMA (``ModelEmaV3``) (test-only), declared as training
state and left out of it. timm imports torchvision; where it cannot be imported (beside the
CPU torch of the dev set-up, the package index's torchvision wheels are CUDA builds that do
not import), tests/test_real_models.py skips these and says so.
"""

from __future__ import annotations

from typing import Any

import timm
import torch
from timm.utils import ModelEmaV3

from reproci import ModelContext, TrainSetup

IMAGE, CLASSES, BATCH, SAMPLES = 16, 4, 4, 16


def _vit_ema(ctx: ModelContext, declared: bool) -> TrainSetup:
    torch.manual_seed(ctx.seed)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=IMAGE, patch_size=8,
                              num_classes=CLASSES, embed_dim=32, depth=1, num_heads=2).to(ctx.device)
    ema = ModelEmaV3(model, decay=0.9)
    g = torch.Generator().manual_seed(ctx.seed)
    x = torch.randn(SAMPLES + BATCH, 3, IMAGE, IMAGE, generator=g)
    y = torch.randint(0, CLASSES, (SAMPLES + BATCH,), generator=g)
    data = torch.utils.data.TensorDataset(x[:SAMPLES], y[:SAMPLES])
    held = (x[SAMPLES:].to(ctx.device), y[SAMPLES:].to(ctx.device))
    loader = torch.utils.data.DataLoader(data, batch_size=BATCH, shuffle=True, generator=ctx.generator())

    def loss_fn(m: torch.nn.Module, batch: Any) -> torch.Tensor:
        ema.update(model)
        return torch.nn.functional.cross_entropy(m(batch[0]), batch[1])

    def eval_fn(m: torch.nn.Module) -> dict[str, float]:
        return {"ema_loss": float(torch.nn.functional.cross_entropy(ema.module(held[0]), held[1]))}

    return TrainSetup(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3), loader=loader,
                      loss_fn=loss_fn, eval_fn=eval_fn, batch_size=BATCH,
                      state_modules={"ema": ema} if declared else {})


def vit_ema_unsaved(ctx: ModelContext) -> TrainSetup:
    return _vit_ema(ctx, declared=False)


def vit_ema_declared(ctx: ModelContext) -> TrainSetup:
    return _vit_ema(ctx, declared=True)


def vit_cosine_after_step(ctx: ModelContext) -> TrainSetup:
    """timm as its train.py trains: CosineLRScheduler (``step_update`` per step, ``step(epoch)``
    per epoch, warmup by updates) and the EMA updated after the optimizer step, declared."""
    from timm.scheduler import CosineLRScheduler

    setup = _vit_ema(ctx, declared=True)
    ema = setup.state_modules["ema"]
    setup.loss_fn = lambda m, b: torch.nn.functional.cross_entropy(m(b[0]), b[1])
    setup.scheduler = CosineLRScheduler(setup.optimizer, t_initial=4, warmup_t=3, warmup_prefix=True,
                                        t_in_epochs=False)
    setup.after_step = lambda step: ema.update(setup.model, step=step)
    return setup
