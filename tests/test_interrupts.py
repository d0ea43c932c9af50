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

import pytest

from reproci import cli, errors

from .helpers import ROOT, interruptible, left_behind, said

# Across the start: the CLI's own imports (to ~0.6 s), the run folder, torch's import beside the
# first runs (to ~3 s), the fork server's start and the first runs. Each point costs its delay
# and the seconds the CLI takes to stop.
DELAYS = (0.1, 0.3, 0.6, 0.9, 1.3, 1.8, 2.4, 3.0)
ENDS_WITHIN_S = 10.0


def test_a_ctrl_c_inside_importlibs_locking_is_raised_once_that_code_is_left():
    """A KeyboardInterrupt raised inside importlib's bootstrap can leave the import lock held
    for good (and is swallowed in a module lock's weakref callback): every other thread that
    imports then waits for ever. There the CLI's handler raises nothing and delivers the signal
    again a moment later."""
    scope: dict = {}
    exec(compile("import sys\nframe = sys._getframe()", "<frozen importlib._bootstrap>", "exec"), scope)
    before = signal.signal(signal.SIGINT, cli._interrupt)
    try:
        with pytest.raises(KeyboardInterrupt):  # outside importlib: at once, as Python's own handler
            cli._interrupt(signal.SIGINT, sys._getframe())
        cli._interrupt(signal.SIGINT, scope["frame"])  # inside it: nothing raised here ...
        with pytest.raises(KeyboardInterrupt):
            time.sleep(20 * cli.REDELIVER_S)  # ... but once that code is left
    finally:
        signal.signal(signal.SIGINT, before)


def _pymp(folder: Path) -> list[str]:
    """multiprocessing's temporary folders (a loader worker's), anywhere in ``folder``."""
    return sorted(str(p) for p in folder.rglob("pymp-*"))


@pytest.mark.slow
def test_ctrl_c_at_any_moment_of_the_start_ends_the_run_at_once(tmp_path):
    """Ctrl-C used to hang a run for minutes when it landed while the CLI's main thread held
    importlib's lock (the threads importing beside the runs waited for ever), and to print a
    traceback while the CLI's modules loaded. About 25 s here."""
    tmp = Path(tempfile.mkdtemp(prefix="rci-"))  # the runs' TMPDIR, short: a Unix socket's path has 108 bytes
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp)}
    failures = []
    try:
        for delay in DELAYS:
            cwd = tmp_path / f"at-{delay}"
            cwd.mkdir()
            proc = subprocess.Popen([sys.executable, "-m", "reproci.cli", "run", "-m", "embedding", "--steps", "30"],
                                    cwd=cwd, env=env, preexec_fn=interruptible, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
            time.sleep(delay)
            proc.send_signal(signal.SIGINT)
            sent = time.monotonic()
            try:
                _, err = proc.communicate(timeout=ENDS_WITHIN_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                _, err = proc.communicate()
                failures.append(f"Ctrl-C at {delay} s: still running {ENDS_WITHIN_S:g} s later; it said {err[-800:]!r}")
                continue
            took = time.monotonic() - sent
            lines = [line for line in said(err) if line.strip()]
            if proc.returncode != errors.EXIT_INTERRUPTED or "Traceback" in err or len(lines) != 1 \
                    or not lines[0].startswith("interrupted"):
                failures.append(f"Ctrl-C at {delay} s: exit {proc.returncode} after {took:.1f} s, said {err[-800:]!r}")
            if (cwd / "results").exists() and any((cwd / "results").iterdir()):
                failures.append(f"Ctrl-C at {delay} s: left {sorted(os.listdir(cwd / 'results'))} in results/")
            if left := left_behind(cwd, pid=proc.pid):
                failures.append(f"Ctrl-C at {delay} s: left running {left}")
            if left := _pymp(tmp):
                failures.append(f"Ctrl-C at {delay} s: left {left}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    assert not failures, "\n".join(failures)
