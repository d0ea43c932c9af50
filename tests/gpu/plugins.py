"""Plugin models for the GPU tests: every optimizer state layout, AMP, real CUDA
nondeterminism, and an op that strict mode refuses on CUDA. Each builds on ``ctx.device``."""

from __future__ import annotations

import torch
from torch import nn

from reproci.worker.contract import ModelContext, TrainSetup


def _data(ctx: ModelContext, n: int = 512, features: int = 16):
    g = torch.Generator().manual_seed(ctx.seed)
    x = torch.randn(n, features, generator=g)
    y = (x[:, :4].sum(dim=1, keepdim=True) > 0).float()
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=64, shuffle=True,
                                       generator=ctx.generator())


def _mlp(ctx: ModelContext) -> nn.Module:
    torch.manual_seed(ctx.seed)
    return nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Dropout(0.1), nn.Linear(64, 1)).to(ctx.device)


def _bce(m: nn.Module, b) -> torch.Tensor:
    return nn.functional.binary_cross_entropy_with_logits(m(b[0]), b[1])


def _with(optimizer: str):
    def build(ctx: ModelContext) -> TrainSetup:
        model = _mlp(ctx)
        params = model.parameters()
        opt = {
            "sgd": lambda: torch.optim.SGD(params, lr=0.05, momentum=0.9),
            "adam": lambda: torch.optim.Adam(params, lr=1e-3),  # state["step"] on the CPU beside CUDA params
            "adamw": lambda: torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01),
            "adagrad": lambda: torch.optim.Adagrad(params, lr=0.05),
            "adam_fused": lambda: torch.optim.Adam(params, lr=1e-3, fused=True),
            "adam_capturable": lambda: torch.optim.Adam(params, lr=1e-3, capturable=True),
        }[optimizer]()
        return TrainSetup(model=model, optimizer=opt, loader=_data(ctx), loss_fn=_bce, config={"optimizer": optimizer})
    build.__name__ = optimizer
    return build


sgd, adam, adamw, adagrad, adam_fused, adam_capturable = (
    _with(o) for o in ("sgd", "adam", "adamw", "adagrad", "adam_fused", "adam_capturable"))


def _amp(dtype: torch.dtype, *, scaler: bool):
    def build(ctx: ModelContext) -> TrainSetup:
        model = _mlp(ctx)

        def loss_fn(m: nn.Module, b) -> torch.Tensor:
            with torch.autocast(device_type=ctx.device.type, dtype=dtype):
                return _bce(m, b)

        return TrainSetup(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3), loader=_data(ctx),
                          loss_fn=loss_fn, config={"amp": str(dtype)},
                          scaler=torch.amp.GradScaler(ctx.device.type, init_scale=2.0 ** 12) if scaler else None)
    return build


amp_bf16 = _amp(torch.bfloat16, scaler=False)
# fp16 autocast with a GradScaler: the scaler's scale and growth tracker are in the checkpoint.
amp_fp16_scaler = _amp(torch.float16, scaler=True)


class CollidingPool(nn.Module):
    """Sums rows into few buckets with index_add_: on CUDA, float atomics in an order that
    changes from run to run, once deterministic algorithms are off. Each bucket's sum is divided
    by its row count (a mean): the sums of 1024 rows no longer blow the loss up (they did, to
    inf from the third step), and the atomics still add every row into one of 4 buckets."""

    buckets = 4

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(16, 256)
        self.head = nn.Linear(256, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(x).repeat(64, 1)  # many rows ...
        index = torch.arange(h.shape[0], device=h.device) % self.buckets  # ... into 4 buckets
        pooled = torch.zeros(self.buckets, h.shape[1], device=h.device).index_add_(0, index, h)
        return self.head(pooled / (h.shape[0] / self.buckets)).mean() + 0 * x.sum()


def cuda_atomics(ctx: ModelContext) -> TrainSetup:
    torch.use_deterministic_algorithms(False)  # the model's own switch: reproci names this line
    torch.manual_seed(ctx.seed)
    model = CollidingPool().to(ctx.device)
    return TrainSetup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.01), loader=_data(ctx),
                      loss_fn=lambda m, b: (m(b[0]) - b[1].mean()).square())


def no_deterministic_kernel(ctx: ModelContext) -> TrainSetup:
    """Uses torch.histc, which has no deterministic CUDA kernel: strict mode raises."""
    model = _mlp(ctx)

    def loss_fn(m: nn.Module, b) -> torch.Tensor:
        out = m(b[0])
        spread = torch.histc(out.detach().float(), bins=8).max()
        return _bce(m, b) + 0 * spread

    return TrainSetup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.01), loader=_data(ctx),
                      loss_fn=loss_fn)
