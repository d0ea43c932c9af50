"""Fixtures; the helpers they use, and that test modules import, are in tests/helpers.py."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from tests.helpers import Cli, real_results, stop_standing_servers


@pytest.fixture
def reproci(tmp_path: Path) -> Cli:
    return Cli(tmp_path)


@pytest.fixture(scope="session")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Real results files (two real runs, a golden, edited copies), made once per session."""
    return real_results(tmp_path_factory)


@pytest.fixture(scope="session", autouse=True)
def standing_fork_servers() -> Iterator[Path]:
    """The reproci invocations of the session share standing fork servers, as a user's repeated
    invocations may (``REPROCI_FORK_SERVERS``): each launch environment's server starts once,
    not in every test. They are stopped when the session ends."""
    folder = Path(tempfile.mkdtemp(prefix="reproci-fs-"))  # short: a Unix socket's path has 108 bytes
    saved = os.environ.get("REPROCI_FORK_SERVERS")
    os.environ["REPROCI_FORK_SERVERS"] = str(folder)
    yield folder
    if saved is None:
        os.environ.pop("REPROCI_FORK_SERVERS", None)
    else:
        os.environ["REPROCI_FORK_SERVERS"] = saved
    stop_standing_servers(folder)
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(autouse=True)
def not_ci_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests run outside CI mode unless they say ``--ci`` or set ``CI`` themselves: a CI runner
    sets ``CI=true``, and a missing golden would fail every run that expects to record one."""
    monkeypatch.delenv("CI", raising=False)


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch):
    """The CLI entry point in-process (exit codes and output as a user sees them)."""
    from reproci.cli import main

    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)  # never write to a real run's summary
    monkeypatch.delenv("GITHUB_ACTIONS", raising=False)

    def call(*args: str) -> tuple[int, str, str]:
        code = main(list(args))
        captured = capsys.readouterr()
        return code, captured.out, " ".join(captured.err.split())
    return call


SLOW_FIXTURES = {"files", "reproci", "workspace", "real_reproci"}  # each starts real training runs


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups (`-n auto --dist loadgroup`)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that uses a fixture making real training runs is slow, marked or not, so that
    ``pytest -m "not slow and not docker"`` stays a quick check.

    Under pytest-xdist each module's tests form a group that one worker runs (its module
    fixtures, real training runs, are made once), and the Docker tests of every module form one
    more: they share one engine, its images and the containers they count."""
    for item in items:
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
        group = "docker" if item.get_closest_marker("docker") is not None else item.nodeid.split("::")[0]
        item.add_marker(pytest.mark.xdist_group(group))


# A skip whose reason names one of the project's own modules: `No module named 'reproci.x'`,
# `could not import 'reproci.reference_models.conv'` (an import of the project that failed, made a skip).
OWN_MODULE = re.compile(r"(?<![\w./-])reproci(?:\.[A-Za-z_]\w*)+|['\"]reproci['\"]")


def skipped(reporter: pytest.TerminalReporter) -> list[tuple[str, str]]:
    """(node id, reason) of every skipped test (or module) the run reported."""
    out = []
    for report in reporter.stats.get("skipped", []):
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, (tuple, list)) else str(longrepr)  # (path, line, reason)
        out.append((report.nodeid, reason.removeprefix("Skipped: ")))
    return out


def _own_skips(config: pytest.Config) -> list[tuple[str, str]]:
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    return [(n, r) for n, r in skipped(reporter) if OWN_MODULE.search(r)] if reporter is not None else []


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A skip that names the project's own modules fails the session: an ImportError in
    reproci/ is a bug, never a missing optional tool."""
    if not hasattr(session.config, "workerinput") and _own_skips(session.config) and exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, exitstatus: int, config: pytest.Config):
    """Every skipped test with its reason, after pytest's own summaries, just above its last
    line: what the run did not check."""
    yield
    listed = skipped(terminalreporter)
    if not listed:
        return
    terminalreporter.write_line("skipped:")
    for nodeid, reason in sorted(listed):
        terminalreporter.write_line(f"  {nodeid}: {reason}")
    own = _own_skips(config)
    if own:
        terminalreporter.write_line(f"error: {len(own)} skipped for a module of the project itself (an import of "
                                    "reproci failed): that is a failure", red=True, bold=True)
