"""conv: a small ResNet-style CNN trained on seeded synthetic images.

What it exercises: convolutions (cuDNN algorithm choice on GPUs), BatchNorm running
statistics (buffers, hashed like parameters), dropout (RNG), and a DataLoader with two
worker processes doing random augmentation (crop, flip, noise), seeded through a loader
generator and ``worker_init_fn``. The block design follows He et al., "Deep Residual
Learning for Image Recognition" (2015), scaled down.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from reproci.worker.contract import ModelContext, TrainSetup

from . import heldout


@dataclass(frozen=True)
class ConvConfig:
    image_size: int = 16  # small enough for a CPU check in seconds
    channels: int = 32  # width of the first stage; doubled in the second (~40 ms a step on one CPU thread)
    classes: int = 10
    dataset_size: int = 256  # 8 batches per epoch: resume lands mid-epoch
    batch_size: int = 32
    num_workers: int = 2  # augmentation runs in worker processes, as in real pipelines
    dropout: float = 0.1
    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 5e-4
    eval_size: int = 512  # held-out images for eval_fn (variance stage): same classes, fresh noise

    @classmethod
    def for_profile(cls, profile: str) -> "ConvConfig":
        if profile == "full":  # GPU-sized
            return cls(image_size=32, channels=64, dataset_size=8192, batch_size=128, num_workers=4, eval_size=2048)
        return cls()


class SyntheticImages(torch.utils.data.Dataset):
    """Class-dependent blobs plus noise; augmentation draws from the worker's RNGs."""

    def __init__(self, cfg: ConvConfig, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.labels = torch.randint(cfg.classes, (cfg.dataset_size,), generator=g)
        prototypes = torch.randn(cfg.classes, 3, cfg.image_size, cfg.image_size, generator=g)
        noise = 0.5 * torch.randn(cfg.dataset_size, 3, cfg.image_size, cfg.image_size, generator=g)
        self.images = prototypes[self.labels] + noise  # (N, 3, H, W)
        self.prototypes = prototypes  # (classes, 3, H, W): the held-out set shares them
        self.pad = 2

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.images[i]
        size = x.shape[-1]
        x = F.pad(x, (self.pad,) * 4, mode="reflect")  # (3, H+4, W+4)
        dy, dx = torch.randint(0, 2 * self.pad + 1, (2,)).tolist()  # torch RNG of this worker
        x = x[:, dy : dy + size, dx : dx + size]  # random crop back to (3, H, W)
        if np.random.rand() < 0.5:  # numpy RNG, seeded by worker_init_fn
            x = x.flip(-1)
        x = x + 0.05 * torch.randn_like(x)
        return x, self.labels[i]


class Block(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut = nn.Sequential()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + self.shortcut(x))


class SmallResNet(nn.Module):
    def __init__(self, cfg: ConvConfig) -> None:
        super().__init__()
        c = cfg.channels
        self.stem = nn.Sequential(nn.Conv2d(3, c, 3, 1, 1, bias=False), nn.BatchNorm2d(c), nn.ReLU())
        self.stage1 = Block(c, c, 1)  # (B, c, H, W)
        self.stage2 = Block(c, 2 * c, 2)  # (B, 2c, H/2, W/2)
        self.dropout = nn.Dropout(cfg.dropout)
        self.head = nn.Linear(2 * c, cfg.classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stage2(self.stage1(self.stem(x)))
        x = x.mean(dim=(2, 3))  # (B, 2c)
        return self.head(self.dropout(x))  # (B, classes)


def _loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    return F.cross_entropy(model(x), y)


def evaluator(cfg: ConvConfig, prototypes: torch.Tensor, seed: int):
    """eval_fn: accuracy and loss on held-out images of the same classes, unaugmented."""

    def eval_fn(model: nn.Module) -> dict[str, float]:
        g = torch.Generator().manual_seed(seed + heldout.OFFSET)
        labels = torch.randint(cfg.classes, (cfg.eval_size,), generator=g)
        images = prototypes[labels] + 0.5 * torch.randn(cfg.eval_size, 3, cfg.image_size, cfg.image_size, generator=g)
        dev, bs = heldout.device_of(model), cfg.batch_size
        return heldout.metrics((model(images[i : i + bs].to(dev)), labels[i : i + bs].to(dev))
                               for i in range(0, cfg.eval_size, bs))

    return eval_fn


def build(ctx: ModelContext) -> TrainSetup:
    cfg = ConvConfig.for_profile(ctx.profile)
    model = SmallResNet(cfg).to(ctx.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    data = SyntheticImages(cfg, seed=ctx.seed)
    loader = torch.utils.data.DataLoader(
        data,
        batch_size=cfg.batch_size,  # per rank
        **ctx.shuffling(data),  # shuffle=True; above one rank, this rank's shard of a seeded order
        num_workers=cfg.num_workers,
        worker_init_fn=ctx.seed_worker,
        generator=ctx.generator(),
        drop_last=True,
    )
    return TrainSetup(
        model=model,
        optimizer=optimizer,
        loader=loader,
        loss_fn=_loss,
        batch_size=cfg.batch_size,
        config=asdict(cfg),
        eval_fn=evaluator(cfg, data.prototypes, ctx.seed),
    )
