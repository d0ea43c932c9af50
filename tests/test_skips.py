"""What a test run skipped is said at its end, each test with its reason (``tests/conftest.py``),
and a skip that names one of the project's own modules fails the run: an ImportError in
``reproci`` (its reference models among them) is a bug, never an optional tool that is missing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from .helpers import ROOT

TESTS = '''
import pytest

def test_runs():
    pass

@pytest.mark.skip(reason="shellcheck is not installed")
def test_a_tool_is_missing():
    pass

def test_an_import_of_the_project_fails():
    pytest.importorskip("reproci.no_such_module")
'''


def _pytest(tmp_path: Path, source: str, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_sample.py").write_text(source)
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "tests.conftest", "-n", "0",
                           "-o", "addopts=", "--rootdir", str(tmp_path), "-c", str(tmp_path / "pytest.ini"), *args,
                           str(tmp_path / "test_sample.py")], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_every_skip_is_listed_with_its_reason_and_a_skipped_project_import_fails_the_run(tmp_path):
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    p = _pytest(tmp_path, TESTS)
    assert p.returncode == 1, p.stdout + p.stderr
    tail = p.stdout[p.stdout.index("\nskipped:\n"):].splitlines()
    assert tail[2:4] == ["  test_sample.py::test_a_tool_is_missing: shellcheck is not installed",
                         "  test_sample.py::test_an_import_of_the_project_fails: could not import "
                         "'reproci.no_such_module': No module named 'reproci.no_such_module'"]
    assert tail[4].startswith("error: 1 skipped for a module of the project itself")
    assert "1 passed, 2 skipped in" in p.stdout  # the tests themselves passed or skipped


def test_a_skip_for_a_missing_tool_alone_leaves_the_run_green(tmp_path):
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    p = _pytest(tmp_path, TESTS.rsplit("\ndef test_an_import", 1)[0])
    assert p.returncode == 0, p.stdout + p.stderr
    assert "skipped:\n  test_sample.py::test_a_tool_is_missing: shellcheck is not installed\n" in p.stdout
    assert "error:" not in p.stdout
