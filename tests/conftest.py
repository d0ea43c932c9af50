"""Fixtures; the helpers they use, and that test modules import, are in tests/helpers.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import Cli, real_results


@pytest.fixture
def reproci(tmp_path: Path) -> Cli:
    return Cli(tmp_path)


@pytest.fixture(scope="session")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Real results files (two real runs, a golden, edited copies), made once per session."""
    return real_results(tmp_path_factory)


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch):
    """The CLI entry point in-process (exit codes and output as a user sees them)."""
    from pipeline.cli import main

    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)  # never write to a real run's summary
    monkeypatch.delenv("GITHUB_ACTIONS", raising=False)

    def call(*args: str) -> tuple[int, str, str]:
        code = main(list(args))
        captured = capsys.readouterr()
        return code, captured.out, " ".join(captured.err.split())
    return call


SLOW_FIXTURES = {"files", "reproci", "workspace", "real_reproci"}  # each starts real training runs


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that uses a fixture making real training runs is slow, marked or not, so that
    ``pytest -m "not slow and not docker"`` stays a quick check."""
    for item in items:
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
