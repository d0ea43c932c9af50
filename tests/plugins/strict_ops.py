"""A model whose one step runs every op of ``torch.use_deterministic_algorithms``' two lists
that a CPU can run, each on a tensor grad flows through where the list says "when attempting
to differentiate": what the audit must report in full (``tests/test_audit.py``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from reproci import ModelContext, TrainSetup


class EveryOp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(64))
        self.bag = nn.EmbeddingBag(10, 4, mode="max")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.w * x.mean()
        terms = [self._convs(w), self._pools(w), self._indexed(w), self._others(w)]
        terms.append(self.bag(torch.tensor([[1, 2], [3, 3]])).sum())
        return torch.stack([t.reshape(()) for t in terms]).sum()

    @staticmethod
    def _convs(w: torch.Tensor) -> torch.Tensor:
        out = F.conv1d(w[:16].reshape(1, 1, 16), w[:3].reshape(1, 1, 3)).sum()
        out = out + F.conv2d(w[:16].reshape(1, 1, 4, 4), w[:4].reshape(1, 1, 2, 2)).sum()
        out = out + F.conv3d(w[:8].reshape(1, 1, 2, 2, 2), w[:8].reshape(1, 1, 2, 2, 2)).sum()
        out = out + F.conv_transpose1d(w[:4].reshape(1, 1, 4), w[:2].reshape(1, 1, 2)).sum()
        out = out + F.conv_transpose2d(w[:4].reshape(1, 1, 2, 2), w[:4].reshape(1, 1, 2, 2)).sum()
        out = out + F.conv_transpose3d(w[:8].reshape(1, 1, 2, 2, 2), w[:8].reshape(1, 1, 2, 2, 2)).sum()
        for d, shape in ((1, (1, 1, 8)), (2, (1, 1, 4, 4)), (3, (1, 1, 2, 2, 2))):
            x = w[:8 if d != 2 else 16].reshape(shape)
            out = out + F.pad(x, (1,) * (2 * d), mode="replicate").sum() + F.pad(x, (1,) * (2 * d), mode="reflect").sum()
        return out

    @staticmethod
    def _pools(w: torch.Tensor) -> torch.Tensor:
        v3, v2 = w[:64].reshape(1, 1, 4, 4, 4), w[:16].reshape(1, 1, 4, 4)
        out = F.max_pool3d(v3, 2).sum() + F.avg_pool3d(v3, 2).sum()
        out = out + F.adaptive_avg_pool2d(v2, 2).sum() + F.adaptive_avg_pool3d(v3, 2).sum() + F.adaptive_max_pool2d(v2, 2).sum()
        out = out + F.fractional_max_pool2d(v2, 2, output_size=2, _random_samples=torch.rand(1, 1, 2)).sum()
        out = out + F.fractional_max_pool3d(v3, 2, output_size=2, _random_samples=torch.rand(1, 1, 3)).sum()
        v1 = w[:8].reshape(1, 1, 8)
        p1, i1 = F.max_pool1d(v1, 2, return_indices=True)
        p2, i2 = F.max_pool2d(v2, 2, return_indices=True)
        p3, i3 = F.max_pool3d(v3, 2, return_indices=True)
        out = out + F.max_unpool1d(p1, i1, 2).sum() + F.max_unpool2d(p2, i2, 2).sum() + F.max_unpool3d(p3, i3, 2).sum()
        for mode, x in (("linear", v1), ("bilinear", v2), ("bicubic", v2), ("trilinear", v3)):
            out = out + F.interpolate(x, scale_factor=2, mode=mode, align_corners=False).sum()
        out = out + F.grid_sample(v2, torch.zeros(1, 2, 2, 2), align_corners=False).sum()
        return out

    @staticmethod
    def _indexed(w: torch.Tensor) -> torch.Tensor:
        idx = torch.tensor([0, 1, 1, 3])
        out = w[[idx]].sum()  # __getitem__ with a list of tensors: its backward accumulates
        y = w.clone()
        y[idx] = w[:4]  # index_put_, accumulate=False
        out = out + y.sum() + y.index_put((idx,), w[:4], accumulate=True).sum()
        out = out + w.clone().put_(idx, w[:4], accumulate=True).sum() + w.clone().put_(idx, w[:4]).sum()
        out = out + torch.zeros(8).scatter_add_(0, idx, w[:4]).sum() + torch.gather(w, 0, idx).sum()
        out = out + torch.zeros(8).index_add(0, idx, w[:4]).sum() + torch.index_select(w, 0, idx).sum()
        out = out + torch.repeat_interleave(w[:4], 2).sum()  # its backward is index_select's (an index_add_)
        out = out + torch.zeros(8).index_copy(0, idx, w[:4]).sum()
        out = out + torch.zeros(8).scatter(0, idx, w[:4]).sum()
        for reduce in ("sum", "mean", "prod"):
            out = out + torch.ones(8).scatter_reduce(0, idx, w[:4], reduce=reduce).sum()
        return out

    @staticmethod
    def _others(w: torch.Tensor) -> torch.Tensor:
        sparse = torch.eye(4).reshape(1, 4, 4).to_sparse()
        out = torch.bmm(sparse, w[:16].reshape(1, 4, 4)).sum()
        logits = w[:48].reshape(1, 3, 4, 4)
        out = out + F.nll_loss(F.log_softmax(logits, 1), torch.zeros(1, 4, 4, dtype=torch.long))
        log_probs = F.log_softmax(w[:40].reshape(10, 1, 4), 2)
        out = out + F.ctc_loss(log_probs, torch.tensor([[1, 2]]), torch.tensor([10]), torch.tensor([2]))
        out = out + torch.histc(w.detach(), bins=4).sum() * 0 + torch.bincount(torch.tensor([0, 1, 1]),
                                                                                 weights=w[:3].detach()).sum()
        out = out + torch.median(w[:8].reshape(2, 4), dim=1).values.sum() + w.cumsum(0).sum()
        return out


def build(ctx: ModelContext) -> TrainSetup:
    torch.manual_seed(ctx.seed)
    model = EveryOp()
    data = torch.utils.data.TensorDataset(torch.randn(16, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=4, shuffle=True, generator=ctx.generator())
    return TrainSetup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=1e-3), loader=loader,
                      loss_fn=lambda m, b: m(b[0]), batch_size=4)
