"""The suite's own grouping (tests/conftest.py) under pytest-xdist, checked in a real run of
pytest with two workers: each module's tests go to one worker (its module fixtures, real
training runs, are made once), and the Docker-marked tests of every module to one more group.
With a pytest that drops xdist's group suffix, the tests of one module spread over both workers,
and this fails."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from .helpers import ROOT

MODULE = '''import os, time, pytest
{mark}
@pytest.mark.parametrize("i", range(4))
def test_{name}(i):
    time.sleep(0.2)
    print(os.environ["PYTEST_XDIST_WORKER"])
'''


def test_each_module_and_the_docker_tests_run_on_one_worker_each(tmp_path: Path) -> None:
    shutil.copy(ROOT / "tests" / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "pyproject.toml").write_text('[tool.pytest.ini_options]\nmarkers = ["docker: d", "slow: s"]\n')
    for name, mark in (("alpha", ""), ("beta", ""), ("d_one", "pytestmark = pytest.mark.docker"),
                       ("d_two", "pytestmark = pytest.mark.docker")):
        (tmp_path / f"test_{name}.py").write_text(MODULE.format(name=name, mark=mark))
    out = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-v", "-p", "no:cacheprovider"],
                         cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    workers: dict[str, set[str]] = {}
    for worker, module in re.findall(r"\[(gw\d)\] .*PASSED test_(\w+?)\.py::", out.stdout):
        group = "docker" if module.startswith("d_") else module
        workers.setdefault(group, set()).add(worker)
    assert set(workers) == {"alpha", "beta", "docker"}, out.stdout
    assert all(len(w) == 1 for w in workers.values()), workers
