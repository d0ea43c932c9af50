"""The many-tensor sums behind the fingerprints give exactly one reduction per tensor."""

import numpy as np
import pytest
import torch

from reproci.worker.state.fingerprint import bit_checksum
from reproci.worker.state.tensor_bits import flat_int, np_bits
from reproci.worker.state.wrapping_sums import array_sums


def _mixed(seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1000, generator=g), torch.empty(0), torch.randn(3, 5, generator=g).to(torch.bfloat16),
            torch.randn(7, generator=g, dtype=torch.float64), torch.rand(9, generator=g) > 0.5,
            torch.randint(-2**62, 2**62, (11,), generator=g), torch.randint(0, 255, (5,), generator=g).to(torch.uint8),
            torch.randn(2, generator=g).half(), torch.empty(0, dtype=torch.float64), torch.tensor(3.0),
            # large enough to be reduced where they lie, of each width
            torch.randn(5000, generator=g), torch.randint(-2**62, 2**62, (4100,), generator=g),
            torch.randn(4096, generator=g).to(torch.bfloat16), torch.rand(6000, generator=g) > 0.5]


@pytest.mark.parametrize("seed", range(3))
def test_array_sums_equal_one_reduction_per_tensor_for_every_width(seed):
    ts = _mixed(seed)
    arrays = [np_bits(t) for t in ts]
    one_each = [int(np.add.reduce(a, dtype=np.int64 if a.itemsize == 8 else np.int32)) for a in arrays]
    assert array_sums(arrays).tolist() == one_each == [bit_checksum(t).item() for t in ts]


def test_array_sums_with_a_workspace_follow_a_changing_layout():
    """The buffers are reused at the largest size seen; a smaller, larger or empty layout
    afterwards still sums each array alone (a stale tail of the buffer never leaks in)."""
    workspace: dict = {}
    g = torch.Generator().manual_seed(0)
    big, small = torch.randn(500, generator=g), torch.randn(7, generator=g)
    for ts in ([big, small], [small], [big, big, small], [torch.empty(0), small], [torch.empty(0)], []):
        assert array_sums([np_bits(t) for t in ts], workspace).tolist() == [bit_checksum(t).item() for t in ts]


def test_one_ulp_in_any_array_changes_only_its_sum():
    ts = _mixed(5)
    before = array_sums([np_bits(t) for t in ts]).tolist()
    ts[0][123] = torch.nextafter(ts[0][123], torch.tensor(float("inf")))
    after = array_sums([np_bits(t) for t in ts]).tolist()
    assert after[0] != before[0] and after[1:] == before[1:]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
                                   torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64])
def test_np_bits_reads_what_flat_int_reads_for_every_dtype_and_layout(dtype):
    """The numpy reading of a tensor's bits (the CPU checksums') is the torch one (the device
    checksums'), whichever path makes it: a contiguous tensor read in place, a parameter that
    requires grad, a transposed tensor, a scalar."""
    g = torch.Generator().manual_seed(1)
    base = (torch.randn(6, 4, generator=g) * 1000).to(dtype) if dtype != torch.complex64 else torch.randn(
        6, 4, generator=g, dtype=dtype)
    cases = [base, base.t(), base[0, 0], base[::2]]
    if dtype.is_floating_point:
        cases.append(torch.nn.Parameter(base.clone()))
    for t in cases:
        got, want = np_bits(t), flat_int(t).numpy()
        assert got.dtype.kind in "iu" and got.itemsize == want.itemsize and got.ndim == 1
        assert np.array_equal(got.view(want.dtype), want)
