"""``tests/gpu/``: the stages on a real GPU. Every test here is marked ``gpu``. Where torch
sees no CUDA device (CI) the device-independent ones run on the CPU, small (``SIZE``): the
tests themselves stay checked between GPU runs. The CUDA-only ones (marked ``cuda_only``)
skip there, and say so.

``REPROCI_GPU_TEST_DEVICE=cpu`` runs them on the CPU where a GPU is visible too.
"""

from __future__ import annotations

import os

import pytest
import torch

DEVICE = os.environ.get("REPROCI_GPU_TEST_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")
# Steps and resume point: on a GPU, the size the tests were written for; on the CPU, the fewest
# that still resume in the middle of a run (what a CPU run proves here does not grow with steps).
CUDA_SIZE = ("--steps", "12", "--resume-at", "6")
SIZE = CUDA_SIZE if DEVICE == "cuda" else ("--steps", "4", "--resume-at", "2")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/gpu/" not in str(item.fspath).replace(os.sep, "/"):
            continue
        item.add_marker(pytest.mark.gpu)
        item.add_marker(pytest.mark.slow)  # each trains for real, on whichever device
        if DEVICE != "cuda" and item.get_closest_marker("cuda_only"):
            item.add_marker(pytest.mark.skip(reason="needs CUDA: its behaviour differs on the CPU"))


@pytest.fixture
def device() -> str:
    return DEVICE
