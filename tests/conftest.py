from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PLUGINS = ROOT / "tests" / "plugins"


class Cli:
    """Drives the real ``reproci`` command in a subprocess, in a scratch directory."""

    def __init__(self, cwd: Path) -> None:
        self.cwd = cwd

    def __call__(self, *args: str, env: dict[str, str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        full_env = {k: v for k, v in os.environ.items() if k not in ("GITHUB_STEP_SUMMARY", "GITHUB_ACTIONS")}
        full_env.update({"CI": "", "PYTHONPATH": str(ROOT), "COLUMNS": "200", **(env or {})})
        return subprocess.run([sys.executable, "-m", "pipeline.cli", *args], cwd=self.cwd, env=full_env,
                              capture_output=True, text=True, timeout=timeout)

    def latest(self) -> dict:
        return json.loads((self.cwd / "results" / "latest.json").read_text())


@pytest.fixture
def reproci(tmp_path: Path) -> Cli:
    return Cli(tmp_path)


def model_entry(doc: dict, name: str) -> dict:
    return next(m for m in doc["models"] if m["model"] == name)


@pytest.fixture(scope="session")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Real results files (two real runs, a golden, edited copies), made once per session."""
    from tests.test_merge import real_results

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


def interruptible() -> None:
    """``preexec_fn`` for a CLI that a test will interrupt: Ctrl-C as at a terminal, even when
    the test run itself was started in the background (which ignores SIGINT, and children
    inherit that)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)
