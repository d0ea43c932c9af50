"""The per-step batch checksums a run keeps: each value is that of ``batch_checksum`` and
``contents_checksum`` of the step's batch, however the CPU's mixing is put off."""

import numpy as np
import pytest
import torch

from reproci.worker.data import batchlog, batchsum
from reproci.worker.data.batchlog import BatchLog
from reproci.worker.data.batchsum import batch_checksum, contents_checksum


class Accumulated(list):
    """A step's micro-batches, as the harness hands them over (matched by type name)."""


def _batches():
    g = torch.Generator().manual_seed(0)
    out = []
    for n in (8, 3, 8, 1, 20, 8):  # rows vary: the row sums of different steps differ in length
        out.append({"x": torch.randn(n, 5, generator=g), "ids": torch.randint(0, 2**40, (n, 2, 3), generator=g),
                    "mask": torch.rand(n, generator=g) > 0.5, "text": ["a" * (i + 1) for i in range(2)]})
    out.insert(2, [object()])  # nothing the checksums can see: 0 and 0
    out.insert(4, (torch.randn(4, 2, generator=g).half(), torch.zeros(0, 3), torch.tensor(7)))
    out.append(Accumulated([(torch.ones(2, 2),), (torch.arange(6).reshape(3, 2),)]))
    return out


def _expected(batches):
    sums, contents = [], []
    for b in batches:
        s = batch_checksum(b)
        if isinstance(b, Accumulated):
            c = sum(contents_checksum(m).item() for m in b)
        else:
            c = contents_checksum(b)
            c = 0 if c is None else c.item()
        sums.append(0 if s is None else s.item())
        contents.append(c % 2**32)
    return sums, contents


@pytest.mark.parametrize("pending", [1, 10, batchlog.PENDING_ROWS])
def test_every_step_reads_its_own_batch_checksums_whenever_they_are_mixed(monkeypatch, pending):
    """Mixed every step, every few steps, or once at the end: the same values, in step order."""
    monkeypatch.setattr(batchlog, "PENDING_ROWS", pending)
    batches = _batches()
    log = BatchLog()
    for b in batches:
        log.add(b)
    assert len(log) == len(batches)
    assert log.values() == _expected(batches)
    assert log.values() == _expected(batches)  # reading twice changes nothing


def test_a_batch_changed_after_it_was_logged_keeps_the_values_it_had():
    """Only row sums wait to be mixed, never the batch: a loader that reuses its buffers (or
    a step that writes into its batch) cannot change what an earlier step recorded."""
    x = torch.arange(12, dtype=torch.float32).reshape(4, 3)
    expected = _expected([(x,)])
    log = BatchLog()
    log.add((x,))
    x.mul_(-1)
    assert log.values() == expected


def test_mixing_many_batches_at_once_equals_the_reference_arithmetic():
    """``mix_rows`` over many batches gives each batch the torch reference's value."""
    g = torch.Generator().manual_seed(1)
    batches = [[torch.randint(-2**31, 2**31 - 1, (r, c), generator=g, dtype=torch.int32) for c in (1, 4, 9)]
               for r in (1, 5, 64)]
    mixed = batchsum.mix_rows([batchsum.row_sums(ts) for ts in batches])
    assert mixed == [batchsum.device_contents(ts).item() for ts in batches]
    assert all(isinstance(v, int) for v in mixed)


def test_a_batch_of_many_leaves_keeps_exact_values():
    """Tensor i of a batch counts 2i+1 times; with many leaves (a list of strings) the weighted
    total outgrows 64 bits before it is reduced, and stays exact."""
    strings = [chr(33 + i % 90) * (1 + i % 5) for i in range(3000)]
    log = BatchLog()
    log.add(strings)
    assert log.values() == _expected([strings])
    assert np.uint64(log.values()[1][0]) < 2**32


def test_a_device_batch_is_logged_without_a_copy_to_the_host():
    """On a GPU a copy to the host waits for the device, once per step. The meta device
    stands in for one here (it has no data, so any copy to the host raises): every step's
    two checksums, of a plain batch and of micro-batches, stay on the device until the end."""
    log = BatchLog()
    for n in (4, 6):
        x, y = torch.randn(n, 3, device="meta"), torch.randint(0, 5, (n,), device="meta")
        log.add((x, y))
        log.add({"ids": y, "x": x})
        log.add(Accumulated([(x,), (x, y)]))
    assert len(log) == 6
    assert all(v.device.type == "meta" for v in log.checksums + log.contents)
