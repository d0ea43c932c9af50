"""Standing fork servers (backends/standing_fork_servers.py, the ``--stand`` mode of worker/forkserver.py):
shared by reproci invocations through ``REPROCI_FORK_SERVERS``, found again by a key that
changes with whatever a run would see, killing a launcher's runs when it goes, ending when
unused. Every process here is real: real servers, real invocations of the CLI, real kills."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from reproci.backends import standing_fork_servers
from reproci.backends.base import CODE_ROOT
from reproci.backends.forking import ServerFailed
from reproci.worker.process.launch import launch_environment

from .helpers import PLUGINS, ROOT, Cli, standing_servers, stop_standing_servers

pytestmark = pytest.mark.slow
HANGS = f"{PLUGINS / 'launch_facts.py'}:hangs"


@pytest.fixture
def folder(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch):
    """A folder of this test's own standing servers (short: a socket path has 108 bytes)."""
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="rfs-"))
    monkeypatch.setenv("REPROCI_FORK_SERVERS", str(path))
    yield path
    stop_standing_servers(path)


def _env() -> dict[str, str]:
    return {**os.environ, **launch_environment(seed=0, threads=1, strict=True), "PYTHONPATH": str(ROOT)}


def _gone(pid: int, within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        try:  # a zombie of ours is gone too, once reaped
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return True
        except ChildProcessError:
            pass
        time.sleep(0.1)
    return False


def test_invocations_share_one_server_and_their_runs_are_forked(folder, tmp_path):
    cli = Cli(tmp_path)
    first = cli("run", "-m", "embedding", "--steps", "4")
    assert first.returncode == 0, first.stdout + first.stderr
    servers = standing_servers(folder)
    assert len(servers) == 1, servers
    second = cli("run", "-m", "embedding", "--steps", "4")
    assert second.returncode == 0, second.stdout + second.stderr
    assert [p.pid for p in standing_servers(folder)] == [servers[0].pid]  # the same server, still standing
    runs = cli.latest()["models"][0]["runs"]
    assert {r["launch"]["mode"] for r in runs.values()} == {"forked"}
    assert runs["A"]["start_wait_s"] < 1.0  # no server start before the second invocation's first run


def test_a_killed_invocations_runs_are_killed_and_the_server_stands(folder, tmp_path):
    """reproci killed by SIGKILL: its socket closes, and the server kills the runs it forked
    for it, then serves the next invocation. A run's own child is the run's to stop, as when a
    fresh or a plain server's run loses its launcher (tests/test_forking.py)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CI": ""}
    env.pop("PYTEST_CURRENT_TEST", None)
    proc = subprocess.Popen([sys.executable, "-m", "reproci.cli", "run", "-m", HANGS, "--steps", "3"], cwd=tmp_path,
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    facts_files: list[Path] = []
    while not facts_files and time.monotonic() < deadline:
        facts_files = list((tmp_path / "results").glob("*/*/facts.json"))
        time.sleep(0.2)
    assert facts_files, "the hanging run never started"
    facts = json.loads(facts_files[0].read_text())
    server = standing_servers(folder)
    assert len(server) == 1
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert _gone(facts["pid"]), "the run outlived its launcher"
    os.kill(facts["child"], signal.SIGKILL)
    assert [p.pid for p in standing_servers(folder)] == [server[0].pid]
    again = Cli(tmp_path)("run", "-m", "embedding", "--steps", "3")
    assert again.returncode == 0, again.stdout + again.stderr


def test_a_server_unused_for_its_idle_time_ends_and_removes_its_socket(folder):
    server = standing_fork_servers.standing_server(sys.executable, _env(), CODE_ROOT, folder, idle_s=1.0)
    (sock,) = folder.glob("*.sock")
    (proc,) = standing_servers(folder)
    server.close()  # the launcher is done with it
    assert _gone(proc.pid, within=30), "an idle standing server did not end"
    assert not sock.exists()
    again = standing_fork_servers.standing_server(sys.executable, _env(), CODE_ROOT, folder, idle_s=60.0)  # a new one starts
    assert [p.pid for p in standing_servers(folder)] != [proc.pid]
    again.close()


def test_a_dead_servers_socket_is_replaced(folder):
    env = _env()
    path = standing_fork_servers.socket_path(folder, sys.executable, {k: v for k, v in env.items() if k != "REPROCI_PARENT_PID"},
                                CODE_ROOT)
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    dead.bind(str(path))  # bound, never listening, then closed: a socket file nothing answers
    dead.close()
    server = standing_fork_servers.standing_server(sys.executable, env, CODE_ROOT, folder, idle_s=60.0)
    assert len(standing_servers(folder)) == 1
    server.close()


def test_the_key_changes_with_the_environment_the_worker_code_and_the_installed_packages(tmp_path, monkeypatch):
    package = tmp_path / "pkg"
    (package / "worker").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    code = package / "worker" / "train.py"
    code.write_text("x = 1\n")
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.setattr(standing_fork_servers, "PACKAGE", package)
    env = {"PYTHONHASHSEED": "0", "PYTHONPATH": str(site)}
    base = standing_fork_servers.socket_path(tmp_path, sys.executable, env, CODE_ROOT)
    assert standing_fork_servers.socket_path(tmp_path, sys.executable, dict(env), CODE_ROOT) == base  # stable
    assert standing_fork_servers.socket_path(tmp_path, sys.executable, {**env, "PYTHONHASHSEED": "1"}, CODE_ROOT) != base
    os.utime(code, ns=(1, 1))  # the worker's code changed
    changed = standing_fork_servers.socket_path(tmp_path, sys.executable, env, CODE_ROOT)
    assert changed != base
    (site / "newpkg-1.0.dist-info").mkdir()  # a package installed where the server imports from
    os.utime(site, ns=(2, 2))
    assert standing_fork_servers.socket_path(tmp_path, sys.executable, env, CODE_ROOT) != changed


def test_a_server_that_dies_as_it_starts_says_how(folder, tmp_path):
    """A standing server killed as it imports (SIGILL, as torch built for instructions this CPU
    lacks would kill it) is named by its signal and the likely cause."""
    (tmp_path / "sitecustomize.py").write_text("import os, signal\nos.kill(os.getpid(), signal.SIGILL)\n")
    env = {**_env(), "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    with pytest.raises(ServerFailed, match=r"^the standing fork server was killed \(SIGILL: an illegal instruction"):
        standing_fork_servers.standing_server(sys.executable, env, CODE_ROOT, folder, idle_s=60.0)


def test_a_folder_others_can_write_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(ServerFailed, match="not this user's alone"):
        standing_fork_servers.standing_server(sys.executable, _env(), CODE_ROOT, shared)


def test_a_folder_too_long_for_a_socket_is_refused_in_one_line(tmp_path):
    with pytest.raises(ServerFailed, match="too long a path for a Unix socket"):
        standing_fork_servers.standing_server(sys.executable, _env(), CODE_ROOT, tmp_path / ("x" * 120))
