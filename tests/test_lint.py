"""The type checker and the linter over the package: a field of reproci's own dataclasses renamed
in one place, a name left undefined, an import gone unused fail here in seconds, not late in a
20-minute suite. Their configuration is pyproject.toml's [tool.mypy] and [tool.ruff]."""

from __future__ import annotations

import os
import subprocess
import sys

from .helpers import ROOT, installed

SOURCE = ROOT / "pipeline"  # installs as the package reproci
LINK = ROOT / ".cache" / "mypy-src" / "reproci"  # pyproject.toml's mypy_path reads the package through it


def _link_the_package() -> None:
    """.cache/mypy-src/reproci -> pipeline/: mypy reads the source folder as the package it installs as
    (it does not follow the editable install's import hook), so ``from reproci.x import y`` and
    ``from .x import y`` name one module."""
    target = os.path.relpath(SOURCE, LINK.parent)
    if LINK.is_symlink() and os.readlink(LINK) == target:
        return
    LINK.parent.mkdir(parents=True, exist_ok=True)
    fresh = LINK.with_name(f".reproci-{os.getpid()}")
    fresh.symlink_to(target, target_is_directory=True)
    os.replace(fresh, LINK)


def _failure(p: subprocess.CompletedProcess[str]) -> str:
    return f"exit {p.returncode}\n{p.stdout}{p.stderr}"


def test_mypy_finds_no_type_error_in_the_package() -> None:
    installed("mypy")
    _link_the_package()
    p = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, _failure(p)


def test_ruff_finds_nothing_in_the_package_its_tests_and_benchmarks() -> None:
    installed("ruff")
    p = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-fix", "pipeline", "tests", "benchmarks"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, _failure(p)
