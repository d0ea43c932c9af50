"""Batches of every shape users pass: moved to the device with their types kept, and seen
whole by the batch checksums (``reproci/worker/data/batchtree.py``, ``batchsum.py``)."""

from __future__ import annotations

import collections
import dataclasses

import numpy as np
import pytest
import torch

from reproci.worker.data import batchtree
from reproci.worker.data.batchsum import batch_checksum, contents_checksum

CPU = torch.device("cpu")
Sample = collections.namedtuple("Sample", "x y")


@dataclasses.dataclass(frozen=True)
class Frozen:
    x: torch.Tensor
    tag: str


class Graph:
    """An object of a library's own type that moves itself (as PyG's Data does)."""

    def __init__(self, edges: torch.Tensor) -> None:
        self.edges = edges
        self.moved_to: torch.device | None = None

    def to(self, device: torch.device) -> "Graph":
        out = Graph(self.edges.to(device))
        out.moved_to = device
        return out


def test_an_hf_batch_encoding_keeps_its_type_and_is_checksummed_like_a_dict():
    transformers = pytest.importorskip("transformers")
    ids = torch.arange(12).reshape(3, 4)
    batch = transformers.BatchEncoding({"input_ids": ids, "labels": ids.clone()})
    moved = batchtree.to_device(batch, CPU)
    assert type(moved) is transformers.BatchEncoding and set(moved) == {"input_ids", "labels"}
    assert batch_checksum(batch) is not None
    assert batch_checksum(batch).item() == batch_checksum(dict(batch)).item()


def test_namedtuples_dataclasses_and_objects_with_to_keep_their_types():
    s = batchtree.to_device(Sample(torch.ones(2), torch.zeros(2)), CPU)
    assert type(s) is Sample and torch.equal(s.x, torch.ones(2))
    f = batchtree.to_device(Frozen(torch.ones(2), "a"), CPU)
    assert type(f) is Frozen and f.tag == "a"
    g = batchtree.to_device({"graph": Graph(torch.zeros(2, 3))}, CPU)["graph"]
    assert g.moved_to == CPU


def test_every_leaf_is_in_the_checksum_and_what_it_cannot_see_is_named():
    x = torch.randn(4, 3)
    assert batch_checksum(Sample(x, torch.arange(4))).item() != batch_checksum(Sample(x, torch.arange(4) + 1)).item()
    assert batch_checksum(Frozen(x, "a")).item() != batch_checksum(Frozen(x, "b")).item()
    assert batch_checksum({"x": x, "n": np.arange(3)}).item() != batch_checksum({"x": x, "n": np.arange(3) + 1}).item()
    assert batchtree.opaque({"x": x, "graph": Graph(torch.zeros(1))}) == [
        f"batch['graph'] ({Graph.__module__}.Graph)"]
    assert batchtree.opaque(Sample(x, 3)) == []


def test_the_contents_checksum_tells_a_reorder_from_other_contents():
    x, y = torch.randn(4, 3), torch.arange(4)
    perm = torch.tensor([2, 0, 3, 1])
    assert batch_checksum((x, y)).item() != batch_checksum((x[perm], y[perm])).item()  # order-sensitive
    assert contents_checksum((x, y)).item() == contents_checksum((x[perm], y[perm])).item()  # order-free
    masked = x.clone()
    masked[1, 2] = 0.0
    assert contents_checksum((masked, y)).item() != contents_checksum((x, y)).item()
    # a value moved to another row is other contents, not a reorder
    swapped = x.clone()
    swapped[0, 0], swapped[1, 0] = x[1, 0], x[0, 0]
    assert contents_checksum((swapped, y)).item() != contents_checksum((x, y)).item()


def test_a_sparse_tensor_in_a_batch_is_checksummed_as_its_dense_form():
    dense = torch.tensor([[0.0, 1.5], [2.0, 0.0]])
    assert batch_checksum(dense.to_sparse()).item() == batch_checksum(dense).item()
