"""The benchmark scripts still start: each imports what it measures and parses its options."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from .helpers import ROOT

SCRIPTS = sorted((ROOT / "benchmarks").glob("*.py"))


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS, ids=[s.name for s in SCRIPTS])
def test_each_benchmark_starts(script):
    p = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "usage:" in p.stdout


def test_the_gpu_check_script_is_valid_bash():
    p = subprocess.run(["bash", "-n", str(ROOT / "benchmarks" / "gpu_check.sh")], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


def _load(name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_in_process_benchmarks_measure_a_few_steps():
    """The benchmarks that call the worker's functions directly still match their signatures
    (a `--help` does not reach them, and the GPU check runs one of them on CUDA)."""
    fp = _load("determinism_overhead").fingerprint_overhead("embedding", steps=15)  # one block each: on, off, floor
    # Ratios of times: what they are is the benchmark's to print; here, that each was measured.
    assert fp.direct > 0 and fp.batch_us > 0 and fp.state_us > 0 and fp.step_ms > 0
    assert all(isinstance(x, float) and math.isfinite(x) for x in fp)
    fused, reference, state = _load("determinism_overhead").device_kernels("embedding")
    assert 0 < fused < reference and state > 0
    plain, recorded, ops = _load("op_record_cost").step_cost("embedding", repeats=1)
    assert plain > 0 and recorded > 0 and ops > 10
