"""The type checker and the linter over the package: a field of reproci's own dataclasses renamed
in one place, a name left undefined, an import gone unused fail here in seconds, not late in a
20-minute suite. Their configuration is pyproject.toml's [tool.mypy] and [tool.ruff]."""

from __future__ import annotations

import subprocess
import sys

from .helpers import ROOT, installed


def _failure(p: subprocess.CompletedProcess[str]) -> str:
    return f"exit {p.returncode}\n{p.stdout}{p.stderr}"


def test_mypy_finds_no_type_error_in_the_package() -> None:
    installed("mypy")
    p = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, _failure(p)


def test_ruff_finds_nothing_in_the_package_its_tests_and_benchmarks() -> None:
    installed("ruff")
    p = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-fix", "reproci", "tests", "benchmarks"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, _failure(p)
