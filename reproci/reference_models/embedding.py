"""embedding: a DLRM-style recommender trained on seeded synthetic click data.

What it exercises: several ``nn.EmbeddingBag`` tables (sum pooling over bags with
repeated indices, whose backward accumulates into shared rows: an atomics hazard on
GPUs), a plain ``nn.Embedding`` pooled with ``index_add_`` (another scatter), a bottom
MLP for dense features, pairwise dot-product interactions and a top MLP. The layout
follows Naumov et al., "Deep Learning Recommendation Model" (2019), scaled down.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from reproci.worker.contract import ModelContext, TrainSetup

from . import heldout


@dataclass(frozen=True)
class DLRMConfig:
    dense_features: int = 8
    table_sizes: tuple[int, ...] = field(default=(1000, 500, 200))  # EmbeddingBag tables
    history_size: int = 300  # nn.Embedding pooled with index_add_
    bag_size: int = 6  # indices per bag, drawn Zipf-like so rows repeat within a batch
    history_len: int = 5
    dim: int = 32
    samples: int = 16384
    batch_size: int = 2048  # large batches make rows repeat within a batch, as in production
    lr: float = 0.05
    eval_samples: int = 8192  # held-out clicks for eval_fn (variance stage): the same click model, fresh users

    @classmethod
    def for_profile(cls, profile: str) -> "DLRMConfig":
        if profile == "full":  # GPU-sized
            return cls(table_sizes=(200_000, 100_000, 50_000), history_size=50_000, dim=64,
                       samples=262_144, batch_size=2048, bag_size=20, history_len=20, eval_samples=65_536)
        return cls()


def _zipf(n: int, size: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    """Indices with a heavy head, so the same rows recur in a batch."""
    weights = 1.0 / torch.arange(1, n + 1, dtype=torch.float64)
    return torch.multinomial(weights, int(torch.tensor(size).prod()), replacement=True, generator=g).view(size)


def _features(cfg: DLRMConfig, n: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    dense = torch.randn(n, cfg.dense_features, generator=g)
    sparse = torch.stack([_zipf(s, (n, cfg.bag_size), g) for s in cfg.table_sizes], dim=1)  # (N, tables, bag)
    history = _zipf(cfg.history_size, (n, cfg.history_len), g)  # (N, L)
    return dense, sparse, history


def _clicks(dense: torch.Tensor, sparse: torch.Tensor, w: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """Click labels: likelier with dense features along ``w`` and with "hot" rows of table 0."""
    hot = (sparse[:, 0, :] % 7 == 0).float().mean(dim=1)
    return torch.bernoulli(torch.sigmoid(dense @ w + 4 * hot - 1), generator=g)


class Clicks(torch.utils.data.Dataset):
    def __init__(self, cfg: DLRMConfig, seed: int) -> None:
        g = torch.Generator().manual_seed(seed + 2)
        self.dense, self.sparse, self.history = _features(cfg, cfg.samples, g)
        self.w = torch.randn(cfg.dense_features, generator=g)  # the click model; the held-out set shares it
        self.labels = _clicks(self.dense, self.sparse, self.w, g)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        return self.dense[i], self.sparse[i], self.history[i], self.labels[i]


def mlp(sizes: list[int]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for a, b in zip(sizes[:-1], sizes[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


class DLRM(nn.Module):
    def __init__(self, cfg: DLRMConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.bottom = mlp([cfg.dense_features, 32, cfg.dim])
        self.tables = nn.ModuleList(nn.EmbeddingBag(s, cfg.dim, mode="sum") for s in cfg.table_sizes)
        self.history = nn.Embedding(cfg.history_size, cfg.dim)
        n_vec = 2 + len(cfg.table_sizes)  # dense, history, one per table
        self.top = mlp([cfg.dim + n_vec * (n_vec - 1) // 2, 64, 1])

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor, history: torch.Tensor) -> torch.Tensor:
        B = dense.shape[0]
        vecs = [self.bottom(dense)]  # (B, D)
        for t, table in enumerate(self.tables):
            vecs.append(table(sparse[:, t, :]))  # bags of shape (B, bag) -> (B, D)
        rows = self.history(history.reshape(-1))  # (B*L, D)
        owner = torch.arange(B, device=dense.device).repeat_interleave(history.shape[1])  # (B*L,)
        pooled = torch.zeros(B, self.cfg.dim, device=dense.device, dtype=rows.dtype).index_add_(0, owner, rows)
        vecs.append(pooled / history.shape[1])  # (B, D)
        z = torch.stack(vecs, dim=1)  # (B, V, D)
        inter = z @ z.transpose(1, 2)  # (B, V, V)
        i, j = torch.triu_indices(z.shape[1], z.shape[1], offset=1, device=dense.device)
        return self.top(torch.cat([vecs[0], inter[:, i, j]], dim=1)).squeeze(1)  # (B,)


def _loss(model: nn.Module, batch) -> torch.Tensor:
    dense, sparse, history, labels = batch
    return F.binary_cross_entropy_with_logits(model(dense, sparse, history), labels)


def evaluator(cfg: DLRMConfig, w: torch.Tensor, seed: int):
    """eval_fn: click accuracy and loss on held-out users of the same click model."""

    def eval_fn(model: nn.Module) -> dict[str, float]:
        g = torch.Generator().manual_seed(seed + 2 + heldout.OFFSET)
        dense, sparse, history = _features(cfg, cfg.eval_samples, g)
        labels = _clicks(dense, sparse, w, g)
        dev, bs = heldout.device_of(model), cfg.batch_size
        return heldout.metrics(((model(dense[i : i + bs].to(dev), sparse[i : i + bs].to(dev), history[i : i + bs].to(dev)),
                                 labels[i : i + bs].to(dev)) for i in range(0, cfg.eval_samples, bs)), binary=True)

    return eval_fn


def build(ctx: ModelContext) -> TrainSetup:
    cfg = DLRMConfig.for_profile(ctx.profile)
    model = DLRM(cfg).to(ctx.device)
    optimizer = torch.optim.Adagrad(model.parameters(), lr=cfg.lr)  # the usual choice for sparse tables
    data = Clicks(cfg, seed=ctx.seed)
    loader = torch.utils.data.DataLoader(  # above one rank: this rank's shard of a seeded order
        data, batch_size=cfg.batch_size, **ctx.shuffling(data), generator=ctx.generator(), drop_last=True
    )
    return TrainSetup(model=model, optimizer=optimizer, loader=loader, loss_fn=_loss,
                      batch_size=cfg.batch_size, config=asdict(cfg), eval_fn=evaluator(cfg, data.w, ctx.seed))
