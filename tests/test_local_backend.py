"""The local backend: every worker run a fresh subprocess of this interpreter, with the
determinism environment set before it starts, stopped with everything it started on a
timeout or when the backend is left, and none started once it is left.

Most runs here are real ``python -m reproci.worker`` subprocesses that a
``sitecustomize`` on the inherited PYTHONPATH stops before the worker imports torch: it
records what the process was given (environment, directory) and then exits, or starts a
grandchild and hangs, as a slow model would. One run (marked slow) trains for real.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from reproci import errors
from reproci.backends import local
from reproci.backends.base import CODE_ROOT
from reproci.plugins import build_options
from reproci.worker.process.spec import WorkerSpec

from .helpers import ROOT, left_behind

HOOK = """\
import json, os, subprocess, sys, time
report = os.environ.get("REPROCI_TEST_HOOK")
if report:
    child = subprocess.Popen(["sleep", "600"]) if os.environ["REPROCI_TEST_HOOK_MODE"] == "hang" else None
    seen = {"env": dict(os.environ), "cwd": os.getcwd(), "pid": os.getpid(), "child": child and child.pid}
    with open(report + ".tmp", "w") as f:
        json.dump(seen, f)
    os.replace(report + ".tmp", report)
    print("hook: worker started", flush=True)
    if child is None:
        os._exit(7)
    time.sleep(600)
"""


@pytest.fixture
def backend() -> local.LocalBackend:
    """Fresh subprocesses only (runs forked from a server: tests/test_forking.py)."""
    return local.LocalBackend(build_options({"fork_server": False}, env={}))


@pytest.fixture
def spec(tmp_path: Path) -> tuple[WorkerSpec, Path]:
    s = WorkerSpec(model_ref="embedding", model_name="embedding", role="A", steps=2, seed=7, threads=2,
                   output="record-A.json")
    (tmp_path / "embedding").mkdir()
    path = tmp_path / "embedding" / "spec-A.json"
    s.write(path)
    return s, path


@pytest.fixture
def hook(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Turns the next worker runs into an early exit (``exit``) or a hang with a grandchild
    (``hang``); returns a function that sets the mode and gives the file the run reports to."""
    site = tmp_path / "hook"
    site.mkdir()
    (site / "sitecustomize.py").write_text(HOOK)
    monkeypatch.setenv("PYTHONPATH", str(site))
    report = tmp_path / "seen.json"
    monkeypatch.setenv("REPROCI_TEST_HOOK", str(report))

    def mode(name: str) -> Path:
        monkeypatch.setenv("REPROCI_TEST_HOOK_MODE", name)
        return report
    yield mode
    if report.exists():  # a failed test leaves nothing running
        worker = json.loads(report.read_text())
        for pid in (worker["pid"], worker["child"]):
            if pid and alive(pid) and _hooked(pid, report):  # never a process that took a finished run's pid
                os.kill(pid, signal.SIGKILL)


def _hooked(pid: int, report: Path) -> bool:
    """Whether process ``pid`` is one this test's hook started (its environment names ``report``)."""
    try:
        return f"REPROCI_TEST_HOOK={report}".encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False


def seen(report: Path, within: float = 20.0) -> dict:
    deadline = time.monotonic() + within
    while not report.exists():
        assert time.monotonic() < deadline, "the worker never started"
        time.sleep(0.02)
    return json.loads(report.read_text())


def alive(pid: int) -> bool:
    """Whether a process runs (a zombie waiting for a parent that never reaps counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def gone(pid: int, within: float = 5.0) -> bool:
    deadline = time.monotonic() + within
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_a_worker_gets_the_determinism_environment_and_runs_in_its_spec_directory(
        backend, spec, hook, monkeypatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "64")  # owned by the launcher: the spec's threads win
    monkeypatch.setenv("PYTHONHASHSEED", "random")
    monkeypatch.setenv("REPROCI_TEST_KEPT", "yes")  # anything else is inherited
    s, path = spec
    report = hook("exit")
    result = backend.launch(s, path, timeout=60)
    assert (result.returncode, result.timed_out) == (7, False)
    assert result.log_tail.splitlines()[-1] == "hook: worker started"
    worker = seen(report)
    env = worker["env"]
    assert (env["PYTHONHASHSEED"], env["OMP_NUM_THREADS"], env["MKL_NUM_THREADS"]) == ("7", "2", "2")
    assert env["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8" and env["PYTHONUNBUFFERED"] == "1"
    assert env["PYTHONPATH"].split(os.pathsep) == [str(CODE_ROOT), str(path.parent.parent / "hook")]
    assert env["REPROCI_TEST_KEPT"] == "yes"
    assert Path(worker["cwd"]) == path.parent


def test_a_relative_pythonpath_reaches_the_worker_as_this_directory_read_it(
        backend, spec, hook, monkeypatch, tmp_path) -> None:
    """A worker starts in a folder of its own: ``PYTHONPATH=hook:`` (a relative entry, an empty
    one) is passed on absolute, as this process's interpreter read it, so the worker finds what
    the pre-check found here (the hook's sitecustomize runs: exit 7)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", f"hook{os.pathsep}")
    s, path = spec
    report = hook("exit")
    result = backend.launch(s, path, timeout=60)
    assert result.returncode == 7, result.log_tail
    env = seen(report)["env"]
    assert env["PYTHONPATH"].split(os.pathsep) == [str(CODE_ROOT), str(tmp_path / "hook"), str(tmp_path)]


def test_a_module_model_found_by_pythonpath_dot_trains(reproci) -> None:
    """``PYTHONPATH=. reproci run -m mine:build`` as a user types it: every run used to fail with
    'No module named mine' after the pre-check had found it."""
    (reproci.cwd / "mine.py").write_text((ROOT / "examples" / "mlp_plugin.py").read_text())
    r = reproci("run", "-m", "mine:build", "--steps", "2", env={"PYTHONPATH": f"{ROOT}{os.pathsep}."})
    assert r.returncode == 0, r.stdout + r.stderr
    assert [m["verdict"] for m in reproci.latest()["models"]] == ["NEW"]


def test_a_default_mode_run_is_not_given_the_strict_cublas_setting(backend, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    env = backend.environment(WorkerSpec(model_ref="conv", model_name="conv", role="A", steps=2, mode="default"))
    assert "CUBLAS_WORKSPACE_CONFIG" not in env  # an inherited value is dropped too


def test_a_worker_that_cannot_read_its_spec_fails_and_its_last_line_is_kept(backend, spec) -> None:
    s, path = spec
    path.write_text(json.dumps({**json.loads(path.read_text()), "version": 99}))
    result = backend.launch(s, path, timeout=60)
    assert result.returncode == 1 and not result.timed_out
    assert result.log_tail.splitlines()[-1].startswith("ValueError: worker spec version 99 is not 1")
    assert not (path.parent / "record-A.json").exists()


def test_a_run_past_its_timeout_is_killed_with_everything_it_started(backend, spec, hook) -> None:
    s, path = spec
    report = hook("hang")
    result = backend.launch(s, path, timeout=1.5)
    assert result.timed_out and result.returncode == -signal.SIGKILL
    assert result.seconds >= 1.5
    seen(report)
    assert left_behind(path.parent) == []  # its own process group: the grandchild too


def test_leaving_the_backend_stops_a_running_worker(backend, spec, hook) -> None:
    s, path = spec
    report = hook("hang")
    results = []
    launcher = threading.Thread(target=lambda: results.append(backend.launch(s, path, timeout=120)))
    launcher.start()
    seen(report)
    backend.__exit__(None, None, None)  # as on Ctrl-C: the with block is left
    launcher.join(timeout=60)
    assert not launcher.is_alive()
    assert results[0].returncode == -signal.SIGKILL and not results[0].timed_out
    assert left_behind(path.parent) == []


def test_a_closed_backend_starts_no_new_run(backend, spec, hook) -> None:
    s, path = spec
    report = hook("exit")
    with backend:
        pass
    assert backend.closed
    with pytest.raises(errors.WorkerFailed, match="run A not started: the run was interrupted") as e:
        backend.launch(s, path, timeout=60)
    assert e.value.kind == "interrupted"
    time.sleep(0.5)
    assert not report.exists() and not (path.parent / "record-A.json").exists()


def test_a_run_starting_as_the_backend_is_left_is_stopped_at_once(backend, spec, hook, monkeypatch) -> None:
    """Ctrl-C between the closed check and the start: close() cannot see that process, so launch stops it."""
    s, path = spec
    report = hook("hang")
    real_popen = subprocess.Popen
    started = []

    def popen_then_leave(*args, **kwargs):
        proc = real_popen(*args, **kwargs)
        started.append(proc)
        seen(report)
        backend.__exit__(None, None, None)  # the main thread leaves the backend right now
        return proc

    monkeypatch.setattr(local.subprocess, "Popen", popen_then_leave)
    with pytest.raises(errors.WorkerFailed, match="not started: the run was interrupted"):
        backend.launch(s, path, timeout=5)
    assert started and report.exists() and left_behind(path.parent) == []


def test_the_local_backend_records_no_image(backend) -> None:
    assert backend.image_info() == {"name": "local", "reference": None, "digest": None, "backend": "local"}


@pytest.mark.slow
def test_a_real_worker_run_writes_its_record(backend, spec) -> None:
    """...and reports its steps as it goes, over its output, kept out of the log tail."""
    s, path = spec
    steps: list[tuple[int, int]] = []
    result = backend.launch(s, path, timeout=300, on_step=lambda step, stop: steps.append((step, stop)))
    assert result.returncode == 0 and not result.timed_out, result.log_tail
    assert steps and steps[-1] == (s.steps, s.steps) and steps == sorted(steps)
    assert "@reproci:step" not in result.log_tail
    record = json.loads((path.parent / "record-A.json").read_text())
    assert record["status"] == "ok" and len(record["final_sha256"]) == 64
    assert record["role"] == "A" and record["model"] == "embedding"


NO_DOCKER_SDK = """\
import importlib.abc, sys


class NoDockerSdk(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("docker", "requests"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


sys.meta_path.insert(0, NoDockerSdk())
from reproci import backends, errors, plugins

with backends.create(plugins.build_options({"models": ("embedding",)}, env={})) as b:
    print(b.name, b.image_info()["name"])
try:
    backends.create(plugins.build_options({"image": "reproci/cpu-torch2.13:1"}, env={}))
except errors.InfrastructureError as e:
    print(e)
"""


def test_the_local_backend_needs_no_docker_sdk_and_docker_runs_say_what_is_missing(tmp_path) -> None:
    out = subprocess.run([sys.executable, "-c", NO_DOCKER_SDK], cwd=tmp_path, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(CODE_ROOT)}, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "local local",
        "--image runs workers in containers through the Docker SDK, which is not installed here: "
        "pip install docker, or drop --image for the local backend"]


needs_no_gpu = pytest.mark.skipif(local.cuda_missing() is None, reason="torch here sees a GPU")


@needs_no_gpu
def test_cuda_where_torch_sees_no_gpu_is_refused_before_any_run(cli, tmp_path, monkeypatch) -> None:
    """It used to be found by the first run, 16 s in: now before the run folder is made."""
    monkeypatch.chdir(tmp_path)
    started = time.monotonic()
    code, _, err = cli("run", "--device", "cuda", "-m", "embedding")
    assert code == errors.EXIT_INFRA, err
    assert err.startswith("error: --device cuda: torch ") and "sees no GPU; use --device cpu" in err
    assert time.monotonic() - started < 5 and not (tmp_path / "results").exists()


@needs_no_gpu
def test_a_cuda_build_of_torch_is_asked_whether_it_sees_a_gpu(tmp_path, monkeypatch) -> None:
    """A CUDA build imports and trains on a host without a GPU: its own answer decides."""
    import importlib.util

    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "version.py").write_text("__version__ = '2.14.1+cu130'\ncuda = '13.0'\nhip = None\n")
    fake = importlib.util.spec_from_file_location("torch", tmp_path / "torch" / "__init__.py",
                                                  submodule_search_locations=[str(tmp_path / "torch")])
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: fake if name == "torch" else None)
    assert local.cuda_missing() == f"torch {__import__('torch').__version__} here sees no GPU (torch.cuda.is_available() is False)"
