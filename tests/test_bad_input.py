"""Bad input and faults: one line on stderr, the documented exit code, nothing written.

Each test drives the real CLI (in-process through ``main`` where nothing trains, a
subprocess where a signal or a run is involved) and asserts the exit code, that stderr's
last line is the one-line message with no traceback, and what is (not) left on disk."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from pipeline import errors

from .helpers import ROOT, interruptible

RUN = ("run", "-m", "embedding", "--steps", "2")


def one_line(err: str) -> str:
    assert "Traceback" not in err, err
    return err.strip().splitlines()[-1]


@pytest.mark.parametrize("args, code, fragment", [
    (("--seed", "-1"), errors.EXIT_USAGE, "--seed -1 is out of range: use 0 .. 4294967295"),
    (("--seed", "99999999999999999999"), errors.EXIT_USAGE, "out of range"),
    (("--image", ""), errors.EXIT_USAGE, "--image is empty"),
    (("--image", "foo", "--gpus", "banana"), errors.EXIT_USAGE, "--gpus 'banana': use all, a count"),
    (("--steps", "99999999999999999999999"), errors.EXIT_USAGE, "is more than 1,000,000 steps a run"),
])
def test_bad_values_are_refused_before_any_run(cli, tmp_path, monkeypatch, args, code, fragment):
    monkeypatch.chdir(tmp_path)
    got, out, err = cli(*RUN, *args)
    assert got == code and fragment in one_line(err)
    assert not (tmp_path / "results").exists()


def test_a_golden_of_binary_garbage_is_exit_6_and_golden_update_replaces_it(cli, reproci, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "goldens").mkdir()
    (tmp_path / "goldens" / "local.yaml").write_bytes(bytes(range(256)) * 4)
    for args in (RUN, ("golden", "show", "local")):
        got, _, err = cli(*args)
        assert got == errors.EXIT_GOLDEN and "unreadable golden (not UTF-8 text" in one_line(err)
    p = reproci("golden", "update", *RUN[1:])
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "goldens" / "local.yaml").read_text().startswith("# reproci golden hashes")


def test_a_config_that_is_not_text_is_a_usage_error(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.yaml").write_bytes(b"\xff\xfe\x00steps: 3")
    got, _, err = cli(*RUN, "--config", "bad.yaml")
    assert got == errors.EXIT_USAGE and "bad.yaml: not UTF-8 text" in one_line(err)


def test_a_goldens_dir_that_is_a_file_is_refused_before_training(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("")
    got, _, err = cli("golden", "update", *RUN[1:], "--goldens-dir", "afile")
    assert got == errors.EXIT_USAGE and "--goldens-dir afile is a file, not a directory" in one_line(err)
    assert not (tmp_path / "results").exists()


def test_a_goldens_dir_that_does_not_exist_is_said_and_in_ci_refused(cli, reproci, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    got, _, err = cli(*RUN, "--goldens-dir", "typo", "--ci")
    assert got == errors.EXIT_USAGE and "--goldens-dir typo does not exist: check the path" in one_line(err)
    p = reproci(*RUN, "--goldens-dir", "typo")
    assert p.returncode == 0 and "notice: --goldens-dir typo does not exist" in p.stderr


@pytest.mark.slow
def test_the_printed_golden_update_command_clears_the_notice(reproci):
    """After a plugin run with its own steps, resume point and goldens dir, the advice carries them."""
    plugin = str(ROOT / "tests" / "plugins" / "idioms.py") + ":namedtuple_batch"
    args = ("-m", plugin, "--steps", "8", "--resume-at", "3", "--goldens-dir", "gd")
    p = reproci("run", *args)
    assert p.returncode == 0, p.stderr
    line = next(x for x in p.stderr.splitlines() if x.startswith("notice: no golden"))
    command = line.split("`")[1]
    assert command == f"reproci golden update --image local -m {plugin} --steps 8 --resume-at 3 --goldens-dir gd"
    assert reproci(*command.split()[1:]).returncode == 0
    q = reproci("run", *args)
    assert q.returncode == 0 and "notice: no golden" not in q.stderr
    assert reproci.latest()["models"][0]["verdict"] == "PASS"


@pytest.mark.slow
def test_sigterm_stops_the_run_cleanly_with_exit_143(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CI": ""}
    proc = subprocess.Popen([sys.executable, "-m", "pipeline.cli", *RUN[:3], "--steps", "400"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=interruptible)
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob("results/*/embedding/spec-A.json")) and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == errors.EXIT_TERMINATED, err
    assert one_line(err) == "terminated (SIGTERM): unfinished runs were stopped; nothing was recorded"
    assert not list(tmp_path.glob("results/2*")), "the unfinished run directory is removed"


def test_a_killed_worker_is_said_as_killed_not_as_an_exit_code():
    from pipeline.runner import _death

    assert _death(-9) == "was killed (SIGKILL: out of memory, or killed by hand)"
    assert _death(137) == "was killed (SIGKILL: out of memory, or killed by hand)"
    assert _death(1) == "died with exit code 1"


def test_the_cli_starts_without_importing_torch():
    """`reproci --version` and `--help` answer at once: torch (seconds to import) is the workers'."""
    code = "import sys, pipeline.cli; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0
    out = subprocess.run([sys.executable, "-m", "pipeline.cli", "--version"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "reproci, version 0.1.0"


def _workers_of(spec_dir) -> list[int]:
    """Live worker processes of runs under ``spec_dir``: a fresh one names its spec file on its
    command line; a forked one has its server's command line and works in its spec's directory."""
    out = []
    for proc in os.listdir("/proc"):
        if proc.isdigit():
            try:
                cmd = open(f"/proc/{proc}/cmdline", "rb").read().decode(errors="replace")
                cwd = os.readlink(f"/proc/{proc}/cwd")
            except OSError:
                continue
            if "pipeline.worker" in cmd and (str(spec_dir) in cmd or cwd.startswith(str(spec_dir))):
                out.append(int(proc))
    return out


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_a_killed_reproci_leaves_no_worker_and_the_next_run_sweeps_its_directory(tmp_path):
    """A worker in a step that prints nothing for an hour (it would never notice its closed pipe)
    dies with the reproci that launched it, killed by SIGKILL."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CI": ""}
    hang = f"{ROOT / 'tests' / 'plugins' / 'faulty.py'}:hang"
    proc = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "run", "-m", hang, "--steps", "4", "-j", "1"],
                            cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not _workers_of(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _workers_of(tmp_path), "no worker started"
    run_dirs = list(tmp_path.glob("results/2*"))
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 30
    while _workers_of(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _workers_of(tmp_path), "the worker outlived its reproci"
    assert run_dirs and all(d.exists() for d in run_dirs)  # SIGKILL: nobody could clean up
    q = subprocess.run([sys.executable, "-m", "pipeline.cli", *RUN], cwd=tmp_path, env=env, capture_output=True,
                       text=True)
    assert q.returncode == 0, q.stderr
    assert f"notice: removed {run_dirs[0].relative_to(tmp_path)}: the unfinished run of a reproci process that is gone" \
        in q.stderr
    assert not run_dirs[0].exists()
