"""Deterministic replacements for the ops the audit finds (torch only: import them in a plugin).

Each computes what the op computes, in an order that does not depend on thread scheduling,
on every device: no atomic adds. ``benchmarks/audit_fixes.py`` measures what each costs
against the op it replaces, and the audit states that cost beside its finding.

- ``segment_sum(src, index, size)``: ``zeros(size, ...).index_add_(0, index, src)`` as a sort
  and a segment reduction (``torch.segment_reduce``): for ``index_add_``, ``scatter_add_`` on
  one dimension, ``index_put_(accumulate=True)`` with one index;
- ``DeterministicEmbedding``: ``nn.Embedding`` whose weight gradient is a ``segment_sum``
  instead of the accumulating ``index_put`` of the embedding backward;
- ``cumsum_by_matmul(x, dim)``: ``x.cumsum(dim)`` as a product with a triangular matrix of ones,
  for the short dimensions (sequence positions) where ``cumsum`` on CUDA has no deterministic kernel.
"""

from __future__ import annotations

from typing import Any

import torch


def segment_sum(src: torch.Tensor, index: torch.Tensor, size: int) -> torch.Tensor:
    """Rows of ``src`` summed into ``size`` rows by ``index`` (1-D, one per row of ``src``), in
    index order: equal to ``index_add_`` up to the order of the additions, and deterministic."""
    order = torch.argsort(index, stable=True)
    lengths = torch.bincount(index, minlength=size)
    return torch.segment_reduce(src.index_select(0, order), "sum", lengths=lengths, axis=0, unsafe=True)


class _EmbeddingBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, index: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(index)
        ctx.rows = weight.shape[0]
        return weight.index_select(0, index.reshape(-1)).reshape(*index.shape, weight.shape[1])

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, torch.Tensor]:
        (index,) = ctx.saved_tensors
        flat = grad.reshape(-1, grad.shape[-1])
        return None, segment_sum(flat, index.reshape(-1), ctx.rows)


class DeterministicEmbedding(torch.nn.Embedding):
    """``nn.Embedding`` (no ``padding_idx``, ``max_norm`` or sparse gradients) whose weight
    gradient is a sorted segment sum: the same numbers on every run and device."""

    def forward(self, index: torch.Tensor) -> torch.Tensor:
        if self.padding_idx is not None or self.max_norm is not None or self.sparse:
            raise ValueError("DeterministicEmbedding takes no padding_idx, max_norm or sparse=True")
        return _EmbeddingBackward.apply(index, self.weight)


def cumsum_by_matmul(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """``x.cumsum(dim)`` as ``x @ triu(ones)`` along ``dim``: deterministic, O(L²) in that dimension's length."""
    moved = x.movedim(dim, -1)
    n = moved.shape[-1]
    tri = torch.ones(n, n, dtype=x.dtype, device=x.device).triu()
    return (moved @ tri).movedim(-1, dim)
