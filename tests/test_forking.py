"""Fork servers of the local backend (backends/forking.py, worker/forkserver.py): a forked run
sees exactly what a fresh interpreter started with the same environment sees, writes a
bit-equal record, is stopped with everything it started, and a run a server cannot give
that starts as a fresh process, saying why. Every run here is a real process: a real server,
real forks, a real fresh interpreter beside them."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from reproci.backends import forking, forkpool, local
from reproci.backends.base import CODE_ROOT
from reproci.plugins import build_options
from reproci.worker import forkserver
from reproci.worker.process.spec import WorkerSpec

from .helpers import PLUGINS, left_behind, started_by
from .test_local_backend import gone

FACTS = f"{PLUGINS / 'launch_facts.py'}:facts"
HANGS = f"{PLUGINS / 'launch_facts.py'}:hangs"
# Measurements, not results: what a run took and held, and how it was started.
MEASURED = {"timings", "step_times_s", "data_times_s", "steps_per_s", "samples_per_s", "peak_memory_bytes"}


@pytest.fixture
def backends():
    made: list[local.LocalBackend] = []

    def make(fork_server: bool = True) -> local.LocalBackend:
        made.append(local.LocalBackend(build_options({"fork_server": fork_server}, env={})))
        return made[-1]
    yield make
    for b in made:
        b.__exit__(None, None, None)


def launch(backend: local.LocalBackend, spec: WorkerSpec, work: Path, *, timeout: float = 120):
    """Run ``spec`` in ``work``; (result, the facts it wrote or None)."""
    work.mkdir(parents=True, exist_ok=True)
    path = work / f"spec-{spec.role}.json"
    facts = work / "facts.json"
    spec.write(path)
    result = backend.launch(spec, path, timeout=timeout)
    return result, (json.loads(facts.read_text()) if facts.exists() else None)


def both(backends, spec: WorkerSpec, tmp_path: Path) -> tuple[dict, dict]:
    fresh_result, fresh = launch(backends(fork_server=False), spec, tmp_path / "fresh")
    forked_result, forked = launch(backends(), spec, tmp_path / "forked")
    assert fresh_result.returncode == 0 == forked_result.returncode, (fresh_result.log_tail, forked_result.log_tail)
    assert fresh_result.launch["mode"] == "fresh" and forked_result.launch == {"mode": "forked"}
    return fresh, forked


def comparable(facts: dict, work: Path) -> dict:
    """Facts less the pid, the run's directory written as WORK. (The random draws are in:
    the harness seeds Python's and numpy's generators before the plugin runs.)"""
    out = {k: v for k, v in facts.items() if k != "pid"}
    return json.loads(json.dumps(out).replace(str(work), "WORK"))


SPEC = WorkerSpec(model_ref=FACTS, model_name="facts", role="A", steps=3, seed=5, output="record-A.json")


@pytest.fixture(scope="module")
def forking_backend():
    """A backend with fork servers that tests of SPEC's launch environment share: its server starts once."""
    backend = local.LocalBackend(build_options({"fork_server": True}, env={}))
    yield backend
    backend.__exit__(None, None, None)


@pytest.fixture(scope="module")
def plain_pair(tmp_path_factory, forking_backend):
    """SPEC run once fresh (``--no-fork-server``) and once forked: the results and facts of both,
    and the folder each ran in. Several promises read this one pair."""
    work = tmp_path_factory.mktemp("plain-pair")
    fresh_backend = local.LocalBackend(build_options({"fork_server": False}, env={}))
    try:
        fresh_result, fresh = launch(fresh_backend, SPEC, work / "fresh")
    finally:
        fresh_backend.__exit__(None, None, None)
    forked_result, forked = launch(forking_backend, SPEC, work / "forked")
    return {"fresh": (fresh_result, fresh), "forked": (forked_result, forked), "work": work}


@pytest.mark.parametrize("change", [
    {},
    pytest.param({"hash_seed": 123}, marks=pytest.mark.slow, id="hash-seed-probe"),
    pytest.param({"mode": "default"}, marks=pytest.mark.slow, id="default-mode"),
    pytest.param({"cpu_isa": "avx2"}, marks=pytest.mark.slow, id="cpu-isa-cap"),
    pytest.param({"env": {"REPROCI_TEST_VAR": "probe"}}, marks=pytest.mark.slow, id="spec-variable"),
], ids=lambda c: "strict" if not c else None)
def test_a_forked_run_sees_what_a_fresh_interpreter_sees(backends, tmp_path, change, request) -> None:
    if change:
        fresh, forked = both(backends, dataclasses.replace(SPEC, **change), tmp_path)
    else:  # SPEC itself: the module's pair
        pair = request.getfixturevalue("plain_pair")
        (fresh_result, fresh), (forked_result, forked) = pair["fresh"], pair["forked"]
        assert fresh_result.returncode == 0 == forked_result.returncode, (fresh_result.log_tail, forked_result.log_tail)
        assert fresh_result.launch["mode"] == "fresh" and forked_result.launch == {"mode": "forked"}
        tmp_path = pair["work"]
    assert comparable(forked, tmp_path / "forked") == comparable(fresh, tmp_path / "fresh")
    assert forked["hash_randomization"] == 1 and forked["session_leader"] and forked["parent_is_launcher"]
    assert forked["argv"][0].endswith(os.path.join("reproci", "worker", "__main__.py"))
    assert forked["main"] == ["__main__", "reproci.worker.__main__", "__main__.py"] and not forked["main_imported"]
    assert forked["fds"] == [0, 1, 2] and forked["stdin"] == os.devnull and not forked["cuda_initialized"]
    if "hash_seed" in change:
        assert forked["env"]["PYTHONHASHSEED"] == "123"


def test_a_run_ends_as_its_interpreter_would_forked_or_fresh(plain_pair) -> None:
    """Runs end without tearing torch's modules down (about 0.2 s a run), but what an exit
    does that anyone can see still happens: a non-daemon thread is joined, then the atexit
    handlers run, and the output is flushed into the run's log."""
    for name in ("fresh", "forked"):
        result, _ = plain_pair[name]
        assert result.returncode == 0, result.log_tail
        assert (plain_pair["work"] / name / "exit.txt").read_text() == "thread atexit", name
        assert "unflushed line at exit" in result.log_tail, name


@pytest.mark.slow
def test_runs_of_one_environment_share_a_server_and_another_environment_gets_its_own(backends, tmp_path) -> None:
    backend = backends()
    results = [launch(backend, dataclasses.replace(SPEC, role=r), tmp_path / r) for r in ("A", "B")]
    other = launch(backend, dataclasses.replace(SPEC, role="C", hash_seed=9), tmp_path / "C")
    assert [r.launch for r, _ in results + [other]] == [{"mode": "forked"}] * 3
    assert len(backend.servers._servers) == 2  # one per launch environment
    a, b = results[0][1], results[1][1]
    assert a["pid"] != b["pid"]
    assert a["hashes"] == b["hashes"] != other[1]["hashes"]


@pytest.mark.slow
def test_a_forked_run_writes_the_record_of_a_fresh_one_bit_for_bit(backends, tmp_path) -> None:
    """The whole determinism record of run A (a checkpoint at k, fingerprints, batch sums,
    hashes, eval) of a reference model, less what is measured (times, memory)."""
    spec = WorkerSpec(model_ref="embedding", model_name="embedding", role="A", steps=8, seed=3, output="record-A.json",
                      checkpoint_at=4, checkpoint_path="ckpt-4.pt", final_dump_path="final-A.pt", evaluate=True)
    records = {}
    for name, fork in (("fresh", False), ("forked", True)):
        result, _ = launch(backends(fork_server=fork), spec, tmp_path / name, timeout=300)
        assert result.returncode == 0, result.log_tail
        records[name] = {k: v for k, v in json.loads((tmp_path / name / "record-A.json").read_text()).items()
                         if k not in MEASURED}
    assert records["forked"] == records["fresh"]
    assert (tmp_path / "forked" / "ckpt-4.pt").read_bytes() == (tmp_path / "fresh" / "ckpt-4.pt").read_bytes()


def test_a_run_of_two_threads_is_forked_with_the_threads_a_fresh_one_gets(backends, tmp_path) -> None:
    """numpy's OpenBLAS would start its pool as the server loads numpy; the server holds it
    at one thread and each run gets its own count back, started after the fork."""
    spec = dataclasses.replace(SPEC, threads=2)
    forked, fresh = (launch(backends(fork_server=f), spec, tmp_path / name) for f, name in ((True, "k"), (False, "f")))
    assert forked[0].returncode == 0 and fresh[0].returncode == 0, forked[0].log_tail + fresh[0].log_tail
    assert forked[0].launch == {"mode": "forked"} and fresh[0].launch["mode"] == "fresh"
    for key in ("torch_threads", "numpy_blas_threads"):
        assert forked[1][key] == fresh[1][key] == 2, key
    assert forked[1]["env"] == fresh[1]["env"] and forked[1]["env"]["OPENBLAS_NUM_THREADS"] == "2"


def test_a_server_with_a_second_thread_refuses_to_fork(tmp_path) -> None:
    """Checked in the server itself, not only predicted: here a ``sitecustomize`` of the
    environment starts a thread as the interpreter starts, and the server says so instead of forking."""
    (tmp_path / "sitecustomize.py").write_text("import threading, time\n"
                                               "threading.Thread(target=time.sleep, args=(600,), daemon=True).start()\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{CODE_ROOT}", "REPROCI_PARENT_PID": str(os.getpid())}
    servers = forkpool.ForkServers()
    key, make = servers.local(sys.executable, env, CODE_ROOT)
    try:
        with pytest.raises(forking.ServerFailed, match=r"the server holds \d+ threads"):
            servers.server(key, make)
        with pytest.raises(forking.ServerFailed, match="threads"):  # remembered: no second start
            servers.server(key, lambda: pytest.fail("started again"))
    finally:
        servers.close()


def test_a_server_killed_by_a_signal_says_which_and_why(tmp_path) -> None:
    """A server that dies as it imports (here by SIGILL, as torch built for instructions this
    CPU lacks would kill it) is named by its signal and the likely cause, not by an exit code."""
    (tmp_path / "sitecustomize.py").write_text("import os, signal\nos.kill(os.getpid(), signal.SIGILL)\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{CODE_ROOT}", "REPROCI_PARENT_PID": str(os.getpid())}
    servers = forkpool.ForkServers()
    key, make = servers.local(sys.executable, env, CODE_ROOT)
    try:
        with pytest.raises(forking.ServerFailed, match=r"^the server stopped: it was killed \(SIGILL: an illegal "
                                                       r"instruction, likely code built for instructions this CPU lacks"):
            servers.server(key, make)
    finally:
        servers.close()


def test_the_thread_check_sees_a_python_thread() -> None:
    assert forkserver.unsafe() is None or "threads" in forkserver.unsafe()  # pytest may hold threads of its own
    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        assert "threads" in forkserver.unsafe()
    finally:
        stop.set()
        t.join()


@pytest.mark.slow
def test_a_dead_server_falls_back_to_a_fresh_process_with_one_warning(backends, tmp_path, capsys) -> None:
    backend = backends()
    first, _ = launch(backend, SPEC, tmp_path / "1")
    assert first.launch == {"mode": "forked"}
    (server,) = backend.servers._servers.values()
    server.proc.kill()
    server.proc.wait()
    results = [launch(backend, dataclasses.replace(SPEC, role=r), tmp_path / r)[0] for r in ("B", "C")]
    assert all(r.returncode == 0 and r.launch["mode"] == "fresh" for r in results)
    assert results[0].launch["why"].startswith("the fork server failed: the server is gone")
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "start as fresh processes" in warnings[0]


@pytest.mark.slow
def test_a_forked_run_past_its_timeout_is_killed_with_everything_it_started(forking_backend, tmp_path) -> None:
    result, seen = launch(forking_backend, dataclasses.replace(SPEC, model_ref=HANGS), tmp_path / "h", timeout=4)
    assert result.launch == {"mode": "forked"} and result.timed_out and result.returncode == -signal.SIGKILL
    assert seen is not None and left_behind(tmp_path) == []  # the run and the grandchild it started


@pytest.mark.slow
def test_leaving_the_backend_stops_forked_runs_and_their_servers(backends, tmp_path) -> None:
    backend = backends()
    facts = tmp_path / "h" / "facts.json"
    results = []
    launcher = threading.Thread(target=lambda: results.append(
        launch(backend, dataclasses.replace(SPEC, model_ref=HANGS), tmp_path / "h", timeout=120)))
    launcher.start()
    deadline = time.monotonic() + 60
    while not facts.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    seen = json.loads(facts.read_text())
    (server,) = backend.servers._servers.values()
    backend.__exit__(None, None, None)  # as on Ctrl-C
    launcher.join(timeout=60)
    assert not launcher.is_alive() and results[0][0].returncode == -signal.SIGKILL
    assert server.proc.wait(timeout=10) is not None  # the server is gone
    assert seen["child"] and left_behind(tmp_path) == []  # and so are the run and the grandchild it started


ORPHAN = """\
import dataclasses, json, sys, threading
from pathlib import Path
from reproci.backends import local
from reproci.plugins import build_options
from reproci.worker.process.spec import WorkerSpec
work = Path(sys.argv[1])
work.mkdir()
spec = WorkerSpec(model_ref=sys.argv[2], model_name="h", role="A", steps=3, output="record-A.json")
spec.write(work / "spec.json")
backend = local.LocalBackend(build_options({}, env={}))
threading.Thread(target=backend.launch, args=(spec, work / "spec.json"), kwargs={"timeout": 600}, daemon=True).start()
threading.Event().wait()
"""


@pytest.mark.slow
def test_a_launcher_killed_by_sigkill_takes_its_servers_and_their_runs_with_it(tmp_path) -> None:
    work = tmp_path / "w"
    proc = subprocess.Popen([sys.executable, "-c", ORPHAN, str(work), HANGS], cwd=CODE_ROOT,
                            env={**os.environ, "PYTHONPATH": str(CODE_ROOT)})
    try:
        deadline = time.monotonic() + 60
        while not (work / "facts.json").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        seen = json.loads((work / "facts.json").read_text())
    finally:
        proc.kill()
        proc.wait()
    assert gone(seen["pid"], within=10)  # the server died with the launcher, the run with the server
    left = [p.pid for p in started_by(work, pid=proc.pid)]
    os.kill(seen["child"], signal.SIGKILL)  # the run's own grandchild is the run's to stop (as without a server)
    assert left == [seen["child"]]  # and nothing else: no server, no run


def test_no_fork_server_starts_every_run_fresh(plain_pair) -> None:
    result, _ = plain_pair["fresh"]
    assert result.returncode == 0 and result.launch == {"mode": "fresh", "why": "--no-fork-server"}


def test_a_ddp_run_is_started_by_torchrun_not_forked() -> None:
    assert forking.fresh_reason({}, world_size=2) == "torchrun starts the ranks"
    assert forking.fresh_reason({"OMP_NUM_THREADS": "1"}, world_size=1) is None


def test_a_server_whose_connection_breaks_before_it_is_ready_says_so() -> None:
    """The control socket reset by the other end (the server died as it started): one error naming the
    reset, the server stopped, not a NameError from the reason read after its except clause ended."""
    import socket
    import struct

    listener = socket.create_server(("127.0.0.1", 0))
    control = socket.create_connection(listener.getsockname())
    peer, _ = listener.accept()
    listener.close()
    peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    peer.close()  # an RST, not an end of file: recv raises ConnectionResetError
    stopped: list[bool] = []
    with pytest.raises(forking.ServerFailed, match="the server stopped: .*reset by peer"):
        forking.ForkServer(control, stop=lambda: stopped.append(True), describe=lambda: "it exited 1")
    assert stopped == [True]
