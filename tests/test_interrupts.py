"""Ctrl-C at any moment of ``reproci run``'s first seconds: exit 130 within seconds, one line,
nothing half-written, no process and no temporary folder left (``cli._interrupt``,
``orchestrate.run_all``)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from reproci import cli, errors

from .helpers import PLUGINS, ROOT, docker_client, interruptible, left_behind, said

# Across the start: the CLI's own imports (to ~0.6 s), the run folder, torch's import beside the
# first runs (to ~3 s), the fork server's start and the first runs. Each point costs its delay
# and the seconds the CLI takes to stop; the runs (300 steps) last well past the last point.
DELAYS = (0.1, 0.3, 0.6, 0.9, 1.3, 1.8, 2.4, 3.0)
ENDS_WITHIN_S = 10.0
IMAGE = "reproci/cpu-torch2.13:1"  # .ci/docker-setup.sh builds it
INTERPRETER_START = "interrupted in the interpreter's own start"


@pytest.mark.parametrize("where", ["<frozen importlib._bootstrap>", "<string>"])
def test_a_ctrl_c_where_raising_breaks_the_interpreter_is_raised_once_that_code_is_left(where):
    """A KeyboardInterrupt raised inside importlib's bootstrap can leave the import lock held
    for good (and is swallowed in a module lock's weakref callback): every other thread that
    imports then waits for ever. Raised in code ``exec`` runs from a string (dataclasses make
    their methods so), it makes the interpreter exit killed by SIGINT even once caught. There
    the CLI's handler raises nothing and delivers the signal again a moment later."""
    scope: dict = {}
    exec(compile("import sys\nframe = sys._getframe()", where, "exec"), scope)
    before = signal.signal(signal.SIGINT, cli._interrupt)
    try:
        with pytest.raises(KeyboardInterrupt):  # elsewhere: at once, as Python's own handler
            cli._interrupt(signal.SIGINT, sys._getframe())
        try:
            cli._interrupt(signal.SIGINT, scope["frame"])  # there: nothing raised ...
        except KeyboardInterrupt:
            pytest.fail(f"KeyboardInterrupt raised at once in {where}")
        with pytest.raises(KeyboardInterrupt):
            time.sleep(20 * cli.REDELIVER_S)  # ... but once that code is left, waking a wait
    finally:
        signal.signal(signal.SIGINT, before)


def _env(tmp: Path) -> dict[str, str]:
    """The CLI's environment: its runs' TMPDIR is ``tmp`` (a standing fork server's for it, once)."""
    env = {k: v for k, v in os.environ.items() if k not in ("GITHUB_STEP_SUMMARY", "GITHUB_ACTIONS", "PYTEST_CURRENT_TEST")}
    env.update({"PYTHONPATH": str(ROOT), "TMPDIR": str(tmp), "CI": ""})
    return env


def _at_moments(tmp_path: Path, env: dict[str, str], delays: tuple[float, ...], args: tuple[str, ...],
                engine: Any = None) -> list[str]:
    """Ctrl-C at each delay after a start: what went wrong."""
    failures: list[str] = []
    for delay in delays:
        wrong = [INTERPRETER_START]
        for attempt in range(5):  # a loaded host can take longer than the first point to start Python
            start, at = time.monotonic(), delay + 0.1 * attempt
            wrong = _ctrl_c(tmp_path / f"at-{at:.1f}-{attempt}", env, args,
                            lambda start=start, at=at: time.monotonic() - start >= at, f"at {at:.1f} s", engine)
            if wrong != [INTERPRETER_START]:
                break
        failures += wrong
    return failures


def _left_in(tmp: Path) -> list[str]:
    """What runs left in their TMPDIR: multiprocessing's folders (a loader worker's), a run's own."""
    return sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*") if p.name.startswith(("pymp-", "reproci-run-")))


def _ctrl_c(cwd: Path, env: dict[str, str], args: tuple[str, ...], when: Callable[[], bool], what: str,
            engine: Any = None) -> list[str]:
    """Start ``reproci run ARGS`` in ``cwd``, press Ctrl-C once ``when()`` holds: what went wrong."""
    cwd.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "reproci.cli", "run", *args], cwd=cwd, env=env,
                            preexec_fn=interruptible, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not when() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    if proc.poll() is not None:
        _, err = proc.communicate()
        return [f"Ctrl-C {what}: the run had ended (exit {proc.returncode}) before it: make it longer; "
                f"it said {err[-300:]!r}"]
    proc.send_signal(signal.SIGINT)
    sent = time.monotonic()
    try:
        _, err = proc.communicate(timeout=ENDS_WITHIN_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        return [f"Ctrl-C {what}: still running {ENDS_WITHIN_S:g} s later; it said {err[-800:]!r}"]
    took, lines, wrong = time.monotonic() - sent, [line for line in said(err) if line.strip()], []
    if proc.returncode != errors.EXIT_INTERRUPTED and 'cli.py", line' not in err and "interrupted" not in err:
        return [INTERPRETER_START]  # before the CLI's module began: Python's own start (site, .pth files, the package)
    if proc.returncode != errors.EXIT_INTERRUPTED or "Traceback" in err or len(lines) != 1 \
            or not lines[0].startswith("interrupted"):
        wrong.append(f"Ctrl-C {what}: exit {proc.returncode} after {took:.1f} s, said {err[-800:]!r}")
    if (cwd / "results").exists() and any((cwd / "results").iterdir()):
        wrong.append(f"Ctrl-C {what}: left {sorted(os.listdir(cwd / 'results'))} in results/")
    if left := left_behind(cwd, pid=proc.pid, engine=engine):
        wrong.append(f"Ctrl-C {what}: left running {left}")
    if left := _left_in(Path(env["TMPDIR"])):
        wrong.append(f"Ctrl-C {what}: left {left} in TMPDIR")
    return wrong


@pytest.mark.slow
def test_ctrl_c_at_any_moment_of_the_start_ends_the_run_at_once(tmp_path):
    """Ctrl-C used to hang a run for minutes when it landed while the CLI's main thread held
    importlib's lock (the threads importing beside the runs waited for ever), to print a
    traceback while the CLI's modules loaded, and to leave each loader worker's pymp-* folder in
    /tmp. The last point waits for a loader worker's folder. About 30 s here."""
    tmp = Path(tempfile.mkdtemp(prefix="rci-"))  # the runs' TMPDIR, short: a Unix socket's path has 108 bytes
    env = _env(tmp)
    try:
        failures = _at_moments(tmp_path, env, DELAYS, ("-m", "embedding", "--steps", "300"))
        failures += _ctrl_c(tmp_path / "loader", env, ("-m", f"{PLUGINS / 'resumable.py'}:worker_augmented", "--steps", "400"),
                            lambda: any(tmp.rglob("pymp-*")), "while loader workers run")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    assert not failures, "\n".join(failures)


@pytest.mark.slow
@pytest.mark.docker
def test_ctrl_c_at_moments_of_a_docker_runs_start_ends_it_at_once(tmp_path):
    """With --image, Ctrl-C 0.5-1.5 s in used to hang in 6 of 18 tries. About 15 s here."""
    engine = docker_client(IMAGE)
    tmp = Path(tempfile.mkdtemp(prefix="rci-"))
    try:
        failures = _at_moments(tmp_path, _env(tmp), (0.6, 0.9, 1.2, 2.0),
                               ("--image", IMAGE, "-m", "embedding", "--steps", "300"), engine)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        engine.close()
    assert not failures, "\n".join(failures)


@pytest.mark.docker
def test_a_ctrl_c_while_the_engine_makes_the_preflight_container_leaves_no_container(monkeypatch):
    """The preflight's container is created from the main thread, where Ctrl-C lands. A
    KeyboardInterrupt raised while the engine is still making it left it behind, created and
    unknown to reproci (once in CI). Here the engine is slow to make it: the request in flight,
    the container made 0.6 s later whatever the client does, as a loaded daemon does."""
    import concurrent.futures
    import threading

    from reproci import backends
    from reproci.backends import docker_engine
    from reproci.plugins import build_options

    engine = docker_client(IMAGE)
    real, asked = docker_engine.Engine.create, threading.Event()

    def loaded_daemon(self, *args, **kwargs):
        made: concurrent.futures.Future = concurrent.futures.Future()

        def daemon():
            time.sleep(0.6)
            try:
                made.set_result(real(self, *args, **kwargs))
            except BaseException as e:
                made.set_exception(e)

        threading.Thread(target=daemon, daemon=True).start()
        asked.set()
        return made.result()

    def ctrl_c():
        asked.wait(60)
        time.sleep(0.2)
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

    monkeypatch.setattr(docker_engine.Engine, "create", loaded_daemon)
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        threading.Thread(target=ctrl_c, daemon=True).start()
        with pytest.raises(KeyboardInterrupt):
            backends.create(build_options({"image": IMAGE, "models": ("embedding",)}, env={}))
            time.sleep(5)  # the preflight ran before the Ctrl-C: wait for it here
        time.sleep(1.0)  # past the moment the engine made it
        left = left_behind(pid=os.getpid(), engine=engine, within=3.0)
    finally:
        signal.signal(signal.SIGINT, before)
        engine.close()
    assert not left, left
