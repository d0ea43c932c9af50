"""diffusers: a tiny UNet2DModel trained as denoising diffusion (DDPMScheduler, the noise and
timesteps drawn from torch's global RNG), with diffusers' own cosine warmup schedule and a
weight EMA (``diffusers.training_utils.EMAModel``) updated after every optimizer step, as
diffusers' ``train_unconditional.py`` example trains; and a tiny UNet2DConditionModel
conditioned on random "text" embeddings through cross-attention, with v-prediction.

``EMAModel`` is not an ``nn.Module`` (its weights are a list of shadow tensors), so it cannot
be a ``TrainSetup.state_modules`` entry: its ``state_dict()``/``load_state_dict()`` are the
plugin's extra state, checkpointed and restored with the run. The held-out metric is the EMA
weights' denoising loss on a fixed batch and fixed noise (``ema_loss``).
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.nn.functional as F
from zoo_common import BATCH, SAMPLES, gen, seeded

from reproci.worker.contract import ModelContext, TrainSetup

SIZE, CHANNELS, TIMESTEPS = 16, 3, 100
CONTEXT = (4, 16)  # tokens and width of the conditioning embeddings


def _unet() -> torch.nn.Module:
    from diffusers import UNet2DModel

    return UNet2DModel(sample_size=SIZE, in_channels=CHANNELS, out_channels=CHANNELS, layers_per_block=1,
                       block_out_channels=(16, 32), down_block_types=("DownBlock2D", "AttnDownBlock2D"),
                       up_block_types=("AttnUpBlock2D", "UpBlock2D"), norm_num_groups=8, attention_head_dim=8)


def _unet_condition() -> torch.nn.Module:
    from diffusers import UNet2DConditionModel

    return UNet2DConditionModel(sample_size=SIZE, in_channels=CHANNELS, out_channels=CHANNELS, layers_per_block=1,
                                block_out_channels=(16, 32), down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                                up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), norm_num_groups=8,
                                cross_attention_dim=CONTEXT[1], attention_head_dim=8)


def _images(ctx: ModelContext, n: int = SAMPLES, offset: int = 0, conditioned: bool = False) -> list[Any]:
    g = gen(ctx, offset)
    x = torch.randn(n, CHANNELS, SIZE, SIZE, generator=g).tanh()
    if not conditioned:
        return list(x)
    c = torch.randn(n, *CONTEXT, generator=g)
    return [(x[i], c[i]) for i in range(n)]


def _setup(ctx: ModelContext, *, conditioned: bool, ema_saved: bool) -> TrainSetup:
    from diffusers import DDPMScheduler
    from diffusers.optimization import get_cosine_schedule_with_warmup
    from diffusers.training_utils import EMAModel

    model = seeded(ctx, _unet_condition if conditioned else _unet).to(ctx.device)
    noise_scheduler = DDPMScheduler(num_train_timesteps=TIMESTEPS, beta_schedule="squaredcos_cap_v2",
                                    prediction_type="v_prediction" if conditioned else "epsilon")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-2)
    lr = get_cosine_schedule_with_warmup(optimizer, num_warmup_steps=1, num_training_steps=ctx.steps)
    ema = EMAModel(model.parameters(), decay=0.9, use_ema_warmup=True, inv_gamma=1.0, power=0.75)
    loader = torch.utils.data.DataLoader(_images(ctx, conditioned=conditioned), batch_size=BATCH, shuffle=True,
                                         generator=ctx.generator(), drop_last=True)

    def denoising_loss(m: torch.nn.Module, batch: Any, noise: torch.Tensor | None = None,
                       t: torch.Tensor | None = None) -> torch.Tensor:
        x, context = batch if conditioned else (batch, None)
        noise = torch.randn_like(x) if noise is None else noise
        t = torch.randint(0, TIMESTEPS, (x.shape[0],), device=x.device) if t is None else t
        noisy = noise_scheduler.add_noise(x, noise, t)
        out = m(noisy, t, encoder_hidden_states=context).sample if conditioned else m(noisy, t).sample
        target = noise_scheduler.get_velocity(x, noise, t) if conditioned else noise
        return F.mse_loss(out, target)

    held = torch.utils.data.default_collate(_images(ctx, BATCH, offset=1, conditioned=conditioned))
    g = gen(ctx, 2)
    held_noise = torch.randn(BATCH, CHANNELS, SIZE, SIZE, generator=g)
    held_t = torch.randint(0, TIMESTEPS, (BATCH,), generator=g)

    def eval_fn(m: torch.nn.Module) -> dict[str, float]:
        shadow = copy.deepcopy(m)
        ema.copy_to(shadow.parameters())
        batch = tuple(x.to(ctx.device) for x in held) if conditioned else held.to(ctx.device)
        return {"ema_loss": float(denoising_loss(shadow, batch, held_noise.to(ctx.device), held_t.to(ctx.device)))}

    extra: dict[str, Any] = {}
    if ema_saved:
        extra = {"get_extra_state": lambda: {"ema": ema.state_dict()},
                 "set_extra_state": lambda s: ema.load_state_dict(s["ema"])}
    return TrainSetup(model=model, optimizer=optimizer, scheduler=lr, loader=loader, loss_fn=denoising_loss,
                      after_step=lambda step: ema.step(model.parameters()), eval_fn=eval_fn, grad_clip=1.0,
                      batch_size=BATCH, config={"unet": dict(model.config), "scheduler": dict(noise_scheduler.config)},
                      **extra)


def unet2d_ddpm_ema(ctx: ModelContext) -> TrainSetup:
    """UNet2DModel + DDPMScheduler, its EMAModel checkpointed as extra state."""
    return _setup(ctx, conditioned=False, ema_saved=True)


def unet2d_condition_vpred(ctx: ModelContext) -> TrainSetup:
    """UNet2DConditionModel (cross-attention) + DDPMScheduler with v-prediction, EMA as extra state."""
    return _setup(ctx, conditioned=True, ema_saved=True)


def unet2d_ema_unsaved(ctx: ModelContext) -> TrainSetup:
    """Planted: the same EMAModel left out of the checkpoint; the resumed run's EMA starts afresh."""
    return _setup(ctx, conditioned=False, ema_saved=False)
