"""The benchmark scripts still start: each imports what it measures and parses its options."""

from __future__ import annotations

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
