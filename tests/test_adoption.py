"""Adoption as a new user lives it: reproci's wheel installed into a fresh virtual environment,
a git repository of the user's own (a tiny model, and a ``pipeline`` package of its own, the
commonest package name in ML repositories), ``reproci init``, a first run (NEW), the golden
update that run prints, run as printed, and a CI run (PASS); with Docker, the shipped CPU image
built and run from that repository. Nothing here reads reproci's checkout but the wheel."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from reproci import verdicts

from .helpers import ROOT, build_wheel, unavailable

pytestmark = pytest.mark.slow

# The user's own code: a package named `pipeline` (their data pipeline) and a model package.
USER_FILES = {
    "pipeline/__init__.py": '"""The team\'s data pipeline (nothing to do with reproci)."""\n',
    "pipeline/data.py": '''\
import torch


def regression_set(seed: int, n: int = 256) -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    return torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True).tanh())
''',
    "tinynet/__init__.py": "",
    "tinynet/model.py": '''\
from torch import nn


class TinyNet(nn.Module):
    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, width), nn.GELU(), nn.Dropout(0.1), nn.Linear(width, 1))

    def forward(self, x):
        return self.body(x)
''',
}

# The plugin `reproci init` wrote, with its three questions answered from the user's own packages.
PLUGIN = '''\
import torch
from torch import nn

from pipeline.data import regression_set
from reproci import ModelContext, TrainSetup
from tinynet.model import TinyNet


def build(ctx: ModelContext) -> TrainSetup:
    model = TinyNet().to(ctx.device)
    dataset = regression_set(ctx.seed)
    loader = torch.utils.data.DataLoader(dataset, batch_size=16, **ctx.shuffling(dataset), generator=ctx.generator())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def loss_fn(model, batch):
        x, y = batch
        return nn.functional.mse_loss(model(x), y)

    return TrainSetup(model=model, optimizer=optimizer, loader=loader, loss_fn=loss_fn, batch_size=16,
                      config={"width": 32})
'''

SHORT = ("--steps", "4", "--resume-at", "2")


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtual environment holding reproci's wheel and its dependencies (torch pinned
    by the development constraints, as a user pins theirs). Made once per test session: under
    pytest-xdist this module's Docker test runs on another worker than its other test, and the
    two share the one environment (the first to ask makes it; the other waits for it)."""
    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # the session's, across its workers
    env = shared / "adoption-venv"
    with FileLock(str(shared / "adoption-venv.lock")):
        if not (env / "bin" / "reproci").is_file():
            wheel = build_wheel(tmp_path_factory.mktemp("wheel"))
            shutil.rmtree(env, ignore_errors=True)  # a half-made one, from a make that failed
            subprocess.run([sys.executable, "-m", "venv", str(env)], check=True, timeout=300)
            subprocess.run([str(env / "bin" / "pip"), "install", "-q", "-c", str(ROOT / "constraints-dev.txt"),
                            str(wheel)], check=True, capture_output=True, text=True, timeout=900)
    return env / "bin"


@pytest.fixture(scope="module")
def repo(venv: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The user's repository, set up by `reproci init`, its plugin answered."""
    repo = tmp_path_factory.mktemp("user") / "forecaster"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    for name, text in USER_FILES.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    return repo


def git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", *args], cwd=cwd, check=True,
                   capture_output=True, timeout=60)


def reproci(bin_dir: Path, cwd: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    """The installed console script, as a user's shell runs it: no PYTHONPATH, nothing of the checkout."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CI", "GITHUB_ACTIONS", "GITHUB_STEP_SUMMARY")}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    return subprocess.run([str(bin_dir / "reproci"), *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def verdicts_of(repo: Path) -> list[str]:
    """The verdict of every model of the last run, from its results file."""
    return [m["verdict"] for m in json.loads((repo / "results" / "latest.json").read_text())["models"]]


def advised(stderr: str) -> list[str]:
    """The golden update the run advised, as words to run."""
    found = re.search(r"Record with `(reproci golden update[^`]*)`", " ".join(stderr.split()))
    assert found, stderr
    return shlex.split(found.group(1))


def test_from_a_wheel_init_first_run_printed_golden_update_and_ci_run_in_a_users_repository(
        venv: Path, repo: Path) -> None:
    r = reproci(venv, repo, "init", "--adapter", "plain")
    assert r.returncode == 0, r.stderr
    plugin = next(repo.glob("reproci_*.py"))
    assert {"reproci.yaml", ".github/workflows/reproci.yml", ".github/workflows/golden-update.yml"} <= {
        p.relative_to(repo).as_posix() for p in repo.rglob("*") if p.is_file()}
    assert "TODO(reproci)" in plugin.read_text()
    next_lines = [line.strip() for line in r.stdout.splitlines() if line.strip().startswith("reproci ")]
    assert next_lines[0] == "reproci run", r.stdout
    plugin.write_text(PLUGIN)  # the three questions answered with the user's own packages

    first = reproci(venv, repo, "run", *SHORT)
    assert first.returncode == 0, first.stderr
    assert verdicts_of(repo) == [verdicts.NEW], first.stdout
    update = advised(first.stderr)
    assert update[-4:] == list(SHORT), update

    recorded = reproci(venv, repo, *update[1:])
    assert recorded.returncode == 0, recorded.stderr
    assert (repo / "goldens" / "local.yaml").is_file()

    ci = reproci(venv, repo, "run", "--ci", *SHORT)
    assert ci.returncode == 0, ci.stderr
    assert verdicts_of(repo) == [verdicts.PASS], ci.stdout
    assert not (repo / "pipeline" / "worker").exists()  # the user's package is theirs alone


@pytest.fixture(scope="module")
def docker_engine() -> None:
    """Skip without a Docker engine, or fail under REPROCI_REQUIRE_DOCKER=1; asked before the
    venv is made (a module fixture listed first)."""
    if shutil.which("docker") is None and not Path("/var/run/docker.sock").exists():
        unavailable("DOCKER", "no Docker engine here (.ci/run starts one)")


@pytest.mark.docker
def test_from_a_wheel_the_shipped_cpu_image_builds_and_runs_the_users_model(docker_engine: None, venv: Path,
                                                                           repo: Path) -> None:
    if not next(repo.glob("reproci_*.py"), None):
        assert reproci(venv, repo, "init").returncode == 0
        next(repo.glob("reproci_*.py")).write_text(PLUGIN)
    built = reproci(venv, repo, "images", "build", "cpu-torch2.13")
    assert built.returncode == 0, built.stderr
    r = reproci(venv, repo, "run", "--image", "cpu-torch2.13", *SHORT)
    assert r.returncode == 0, r.stderr
    assert verdicts_of(repo) == [verdicts.NEW], r.stdout  # no golden for this image yet
