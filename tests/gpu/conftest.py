"""``tests/gpu/``: the stages on a real GPU. Every test here is marked ``gpu`` and skipped
where torch sees no CUDA device, so CI (which has none) stays green.

``REPROCI_GPU_TEST_DEVICE=cpu`` runs the device-independent tests here on the CPU, to check
the tests themselves on a machine without a GPU; the CUDA-only ones stay skipped.
"""

from __future__ import annotations

import os

import pytest
import torch

DEVICE = os.environ.get("REPROCI_GPU_TEST_DEVICE") or ("cuda" if torch.cuda.is_available() else None)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/gpu/" not in str(item.fspath).replace(os.sep, "/"):
            continue
        item.add_marker(pytest.mark.gpu)
        if DEVICE is None:
            item.add_marker(pytest.mark.skip(reason="torch sees no CUDA device (REPROCI_GPU_TEST_DEVICE=cpu "
                                                    "runs the device-independent tests on the CPU)"))
        elif DEVICE != "cuda" and item.get_closest_marker("cuda_only"):
            item.add_marker(pytest.mark.skip(reason="needs CUDA: its behaviour differs on the CPU"))


@pytest.fixture
def device() -> str:
    assert DEVICE is not None
    return DEVICE
