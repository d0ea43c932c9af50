"""timm: a tiny ViT and a tiny ResNet from ``timm.create_model`` (random init, no weights),
AdamW and timm's cosine scheduler stepped as timm steps it (``step_update`` every optimizer
step), mixup-free cross entropy on random images.

timm imports torchvision; where torchvision does not import (the package index's wheels are
CUDA builds that fail beside a CPU torch), the zoo skips these entries and says why.
"""

from __future__ import annotations

import torch
from zoo_common import BATCH, LABELS, images, seeded

from reproci.worker.contract import ModelContext, TrainSetup


def _train(ctx: ModelContext, name: str, **kw: object) -> TrainSetup:
    import timm
    from timm.scheduler import CosineLRScheduler

    model = seeded(ctx, lambda: timm.create_model(name, pretrained=False, num_classes=LABELS, **kw)).to(ctx.device)
    data = [(d["pixel_values"], d["labels"]) for d in images(ctx)]
    loader = torch.utils.data.DataLoader(data, batch_size=BATCH, shuffle=True, generator=ctx.generator(), drop_last=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    scheduler = CosineLRScheduler(optimizer, t_initial=ctx.steps, warmup_t=1, t_in_epochs=False)
    return TrainSetup(model=model, optimizer=optimizer, scheduler=scheduler, loader=loader, batch_size=BATCH,
                      loss_fn=lambda m, b: torch.nn.functional.cross_entropy(m(b[0]), b[1]),
                      config={"timm_model": name, **{k: str(v) for k, v in kw.items()}})


def vit_tiny(ctx: ModelContext) -> TrainSetup:
    return _train(ctx, "vit_tiny_patch16_224", img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2)


def resnet10t(ctx: ModelContext) -> TrainSetup:
    return _train(ctx, "resnet10t")
