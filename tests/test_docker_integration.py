"""``reproci run --image`` end to end against a real Docker engine and the CPU test image.

Skipped when no engine answers or the image is missing, unless REPROCI_REQUIRE_DOCKER=1
(.ci/run sets it), in which case that is a failure. Every CLI run here is a real
subprocess; every container is a real one, found afterwards by its labels.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import pytest

from reproci import errors

from .helpers import PLUGINS, ROOT, docker_client, interruptible, left_behind, model_entry

pytestmark = pytest.mark.docker
IMAGE = "reproci/cpu-torch2.13:1"
BASE = "reproci/base-bookworm:1"
SHORT = ("--steps", "4", "--resume-at", "2")  # A, B and C as in a full run; what these tests prove needs no more steps
FAULTY = PLUGINS / "faulty.py"


@pytest.fixture(scope="module")
def engine():
    """The Docker SDK client; skip (or fail under REPROCI_REQUIRE_DOCKER=1) without an engine and the image."""
    client = docker_client(IMAGE, BASE)
    yield client
    client.close()


class Run:
    """A finished CLI subprocess: exit code, output, its pid (the containers' reproci.pid label) and cwd."""

    def __init__(self, proc: subprocess.Popen, out: str, err: str, cwd: Path) -> None:
        self.pid, self.returncode, self.stdout, self.stderr, self.cwd = proc.pid, proc.returncode, out, err, cwd

    def latest(self) -> dict:
        return json.loads((self.cwd / "results" / "latest.json").read_text())


def start(cwd: Path, *args: str, env: dict[str, str] | None = None, **popen) -> subprocess.Popen:
    full_env = {**os.environ, "CI": "", "PYTHONPATH": str(ROOT), "COLUMNS": "200", **(env or {})}
    full_env.pop("GITHUB_STEP_SUMMARY", None)
    full_env.pop("GITHUB_ACTIONS", None)
    return subprocess.Popen([sys.executable, "-m", "reproci.cli", *args], cwd=cwd, env=full_env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen)


def reproci(cwd: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 300, **popen) -> Run:
    proc = start(cwd, *args, env=env, **popen)
    out, err = proc.communicate(timeout=timeout)
    return Run(proc, out, err, cwd)


def containers_of(client, pid: int) -> list:
    """Containers of the run with PID, in any state; one removed while listing (a probe ending) is left out."""
    return client.containers.list(all=True, filters={"label": f"reproci.pid={pid}"}, ignore_removed=True)


@pytest.fixture(scope="module")
def matrix(engine, tmp_path_factory):
    """The same short matrix in the image (recording goldens) and on the local backend."""
    cwd = tmp_path_factory.mktemp("matrix")
    args = ("run", "-m", "embedding", "-m", "conv", *SHORT)
    docker_run = reproci(cwd, *args, "--image", IMAGE, "--update-golden")  # the manifest caps it at avx2
    docker_doc = docker_run.latest() if docker_run.returncode == 0 else None
    local_run = reproci(cwd, *args, "--cpu-isa", "avx2")
    return docker_run, docker_doc, local_run, local_run.latest() if local_run.returncode == 0 else None


def test_the_image_gives_the_same_hashes_as_the_local_backend(matrix):
    docker_run, doc, local_run, local = matrix
    assert docker_run.returncode == 0, docker_run.stdout + docker_run.stderr
    assert local_run.returncode == 0, local_run.stdout + local_run.stderr
    assert local["packages"]["torch"] == doc["packages"]["torch"] == "2.13.0+cpu"
    assert doc["options"]["threads"] == local["options"]["threads"] == 1
    for name in ("embedding", "conv"):
        d, loc = model_entry(doc, name), model_entry(local, name)
        assert {r["final_sha256"] for r in d["runs"].values()} == {d["final_sha256"]}  # A = B = C in the image
        assert d["final_sha256"] == loc["final_sha256"], name


def test_the_committed_golden_holds_on_this_host(engine, tmp_path):
    """goldens/cpu-torch2.13.yaml was recorded with the image's CPU cap (avx2, from the manifest):
    it matches bit for bit on any x86-64 host of the golden's CPU vendor with AVX2 or more,
    whatever its ISA. Another vendor's CPU (the golden is an AMD EPYC's; an Intel Xeon with AMX,
    under the same cap and under every MKL_CBWR setting, gives other hashes: MKL's kernels differ
    by vendor at one ISA) is ENV_CHANGED, the CPU vendor named, exit 3: never a PASS by luck."""
    import yaml

    golden_vendor = yaml.safe_load((ROOT / "goldens" / "cpu-torch2.13.yaml").read_text())["environment"]["cpu_id"]["vendor"]
    run = reproci(tmp_path, "run", "--image", "cpu-torch2.13", "--goldens-dir", str(ROOT / "goldens"), "--ci",
                  timeout=600)  # three models at the committed settings: over 300 s on a loaded 2-core host
    doc = run.latest()
    assert doc["options"]["cpu_isa"] == "avx2" and doc["environment"]["cpu_capability"] == "AVX2"
    host_vendor = doc["environment"]["cpu_id"]["vendor"]
    if host_vendor == golden_vendor:
        assert run.returncode == 0, run.stdout + run.stderr
        assert [m["verdict"] for m in doc["models"]] == ["PASS"] * 3, [m["message"] for m in doc["models"]]
        return
    assert run.returncode == 3, run.stdout + run.stderr
    for m in doc["models"]:
        assert m["verdict"] == "ENV_CHANGED", m["message"]
        assert f"CPU vendor {golden_vendor} → {host_vendor}" in m["message"], m["message"]


def test_the_image_digest_is_recorded_and_shown(engine, matrix):
    docker_run, doc, _, _ = matrix
    image = engine.images.get(IMAGE)
    assert doc["image"]["backend"] == "docker" and doc["image"]["reference"] == IMAGE
    assert doc["image"]["digest"] == image.id and doc["image"]["digest"].startswith("sha256:")
    assert image.id[:19] in docker_run.stdout.splitlines()[0]  # the table title
    golden = next((docker_run.cwd / "goldens").glob("*.yaml")).read_text()
    assert image.id in golden  # the golden says which image made it
    run_dir = docker_run.cwd / "results" / doc["run_id"]
    spec = json.loads((run_dir / "embedding" / "spec-A.json").read_text())
    assert spec["image"]["digest"] == image.id


def test_no_container_is_left_after_a_run(engine, matrix):
    assert left_behind(matrix[0].cwd, pid=matrix[0].pid, engine=engine) == []


def _unprivileged() -> dict:
    """Popen arguments that run the CLI as another, unprivileged user, if this root process can."""
    sock = Path("/var/run/docker.sock")
    if os.getuid() != 0 or not sock.exists() or os.stat(sock).st_gid == 0:
        return {}
    popen = {"user": 4242, "group": 4242, "extra_groups": [os.stat(sock).st_gid]}
    try:  # this interpreter may live where that user cannot reach (e.g. under /root)
        ok = subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(ROOT)!r}); import reproci.cli"],
                            cwd="/", capture_output=True, timeout=60, check=False, **popen).returncode == 0
    except PermissionError:
        ok = False
    return popen if ok else {}


def test_a_new_user_gets_a_pass_and_owns_every_file(engine, matrix):
    """Run as an unprivileged user where the tests run as root and that user can run this
    Python; else as the current user (the container's user setting is also checked on a
    live container in the Ctrl-C test)."""
    popen = _unprivileged()
    uid, gid = (popen["user"], popen["group"]) if popen else (os.getuid(), os.getgid())
    scratch = Path(tempfile.mkdtemp(prefix="reproci-user-"))
    try:
        shutil.copytree(matrix[0].cwd / "goldens", scratch / "goldens")
        for p in [scratch, *scratch.rglob("*")]:
            os.chown(p, uid, gid)
        run = reproci(scratch, "run", "--image", IMAGE, "-m", "embedding", *SHORT, env={"HOME": str(scratch)}, **popen)
        assert run.returncode == 0, run.stdout + run.stderr
        assert model_entry(run.latest(), "embedding")["verdict"] == "PASS"
        assert "PASS" in run.stdout and run.latest()["image"]["digest"][:19] in run.stdout
        files = list((scratch / "results").rglob("*"))
        assert any(f.name == "record-C.json" for f in files)
        assert {f.stat().st_uid for f in files} == {uid}
        assert left_behind(run.cwd, pid=run.pid, engine=engine) == []
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def test_a_crashing_plugin_is_an_error_and_leaves_no_container(engine, tmp_path):
    run = reproci(tmp_path, "run", "--image", IMAGE, *SHORT, "-m", f"{FAULTY}:crash_at_step_3",
                  "-m", "tests.plugins.faulty:private_rng_exposed")
    assert run.returncode == errors.EXIT_RUN_ERROR, run.stdout + run.stderr
    doc = run.latest()
    crash = model_entry(doc, "faulty.crash_at_step_3")
    assert crash["verdict"] == "ERROR" and "illegal memory access" in crash["message"]
    assert model_entry(doc, "faulty.private_rng_exposed")["verdict"] == "NEW"  # a plugin module, mounted
    assert left_behind(run.cwd, pid=run.pid, engine=engine) == []


def test_a_plugin_that_allocates_or_forks_without_end_is_stopped_by_its_containers_limit(engine, tmp_path):
    """The memory limit (the engine's OOM kill) and the process limit (fork refused with EAGAIN),
    set small so that each is reached within seconds: each model an ERROR (exit 4: the model's
    doing, not the machine's) whose one line names the limit and the option that raises it.
    One run at a time: run A fails, so B and C never start (two containers in all)."""
    run = reproci(tmp_path, "run", "--image", IMAGE, "--steps", "4", "--resume-at", "2", "--memory", "512m",
                  "--pids-limit", "64", "-j", "1", "-m", f"{FAULTY}:allocate_forever", "-m", f"{FAULTY}:fork_forever")
    assert run.returncode == errors.EXIT_RUN_ERROR, run.stdout + run.stderr
    doc = run.latest()
    memory, pids = model_entry(doc, "faulty.allocate_forever"), model_entry(doc, "faulty.fork_forever")
    assert memory["verdict"] == pids["verdict"] == "ERROR"
    assert memory["error"]["kind"] == pids["error"]["kind"] == "limit"
    assert "the container hit its memory limit (512 MiB): raise it with --memory" in memory["message"], memory
    assert "the container hit its process limit (64 processes and threads): raise it with --pids-limit" in \
        pids["message"], pids
    assert "\n" not in memory["message"] + pids["message"]
    assert left_behind(run.cwd, pid=run.pid, engine=engine) == []


def test_a_fork_bomb_that_tries_again_is_named_by_the_process_limit_not_the_timeout(engine, tmp_path):
    """A plugin that, refused a process, tries again never ends: its run times out with every process
    slot of its container taken. The ERROR names the process limit and the option that raises it,
    not the timeout alone (the engine's count of the container's processes, asked before the kill)."""
    run = reproci(tmp_path, "run", "--image", IMAGE, *SHORT, "--pids-limit", "64", "--timeout", "20", "-j", "1",
                  "-m", f"{FAULTY}:fork_forever_retrying")
    assert run.returncode == errors.EXIT_RUN_ERROR, run.stdout + run.stderr
    entry = model_entry(run.latest(), "faulty.fork_forever_retrying")
    assert entry["verdict"] == "ERROR" and entry["error"]["kind"] == "limit", entry
    assert "the container hit its process limit (64 processes and threads): raise it with --pids-limit" in \
        entry["message"] and "\n" not in entry["message"], entry
    assert left_behind(run.cwd, pid=run.pid, engine=engine) == []


def test_two_ranks_and_the_op_audit_run_inside_a_container_without_network(engine, tmp_path):
    """torchrun inside one container meets its ranks on the loopback interface (the container
    cannot resolve its own host name); the audit's file comes back through the run mount."""
    run = reproci(tmp_path, "run", "--image", IMAGE, "--world-size", "2", "-m", f"{PLUGINS / 'ddp.py'}:sharded",
                  "--steps", "4", "--resume-at", "2", "--stage", "determinism", "--stage", "audit", timeout=400)
    assert run.returncode == 0, run.stdout + run.stderr
    entry = model_entry(run.latest(), "ddp.sharded")
    assert entry["verdict"] == "NEW" and entry["world_size"] == 2
    assert entry["audit"]["ops_executed"] > 0 and not entry["audit"].get("error")
    assert left_behind(run.cwd, pid=run.pid, engine=engine) == []


def test_a_hanging_run_times_out_and_its_container_is_removed(engine, tmp_path):
    run = reproci(tmp_path, "run", "--image", IMAGE, *SHORT, "--timeout", "10", "-m", f"{FAULTY}:hang")
    assert run.returncode == errors.EXIT_RUN_ERROR, run.stdout + run.stderr
    m = run.latest()["models"][0]
    assert m["error"]["kind"] == "timeout" and "timed out after 10 s" in m["message"]
    assert m["seconds"] >= 10  # it waited for the timeout (how much longer is the machine's, not the test's)
    assert left_behind(run.cwd, pid=run.pid, engine=engine) == []


def test_fork_server_runs_fork_in_a_server_container_with_the_hashes_of_a_container_per_run(engine, matrix, tmp_path):
    run = reproci(tmp_path, "run", "--image", IMAGE, "-m", "embedding", "-m", "conv", *SHORT, "--fork-server")
    assert run.returncode == 0, run.stdout + run.stderr
    doc, per_run = run.latest(), matrix[1]
    assert doc["options"]["fork_server"] is True and per_run["options"]["fork_server"] is False
    for name in ("embedding", "conv"):
        entry = model_entry(doc, name)
        assert [r["launch"] for r in entry["runs"].values()] == [{"mode": "forked", "in": "container"}] * 3
        assert [r["launch"] for r in model_entry(per_run, name)["runs"].values()] == [{"mode": "container"}] * 3
        assert entry["final_sha256"] == model_entry(per_run, name)["final_sha256"], name
    assert left_behind(run.cwd, pid=run.pid, engine=engine) == []  # the server containers too


def test_a_hanging_forked_run_is_killed_through_its_server_and_no_container_is_left(engine, tmp_path):
    run = reproci(tmp_path, "run", "--image", IMAGE, *SHORT, "--timeout", "10", "-m", f"{FAULTY}:hang", "--fork-server")
    assert run.returncode == errors.EXIT_RUN_ERROR, run.stdout + run.stderr
    m = run.latest()["models"][0]
    assert m["error"]["kind"] == "timeout" and "timed out after 10 s" in m["message"]
    assert left_behind(run.cwd, pid=run.pid, engine=engine) == []


def test_the_containers_of_a_killed_reproci_are_removed_by_the_next_run(engine, tmp_path):
    """SIGKILL gives reproci no chance to remove its container; the next run on this host does, and says so."""
    proc = start(tmp_path, "run", "--image", IMAGE, *SHORT, "-m", f"{FAULTY}:hang")
    deadline = time.monotonic() + 60
    while not [c for c in containers_of(engine, proc.pid) if c.labels.get("reproci") == "worker"]:
        assert time.monotonic() < deadline, "no worker container started"
        time.sleep(0.2)
    proc.kill()
    proc.communicate()
    left = containers_of(engine, proc.pid)
    assert left, "the killed run left its container (nothing could remove it)"
    run = reproci(tmp_path, "run", "--image", IMAGE, "-m", "embedding", "--steps", "2")
    assert run.returncode == 0, run.stdout + run.stderr
    assert left_behind(tmp_path, pid=proc.pid, engine=engine) == []
    assert f"notice: removed container {left[0].id[:12]} (faulty.hang run" in run.stderr
    assert f"its reproci process {proc.pid} is gone" in run.stderr


def test_ctrl_c_removes_the_running_container_and_the_run_directory(engine, tmp_path):
    """Ctrl-C as soon as the first worker container runs (the other run's container may still be
    in the making): once the CLI has exited, no container of its pid is left, in any state."""
    proc = start(tmp_path, "run", "--image", IMAGE, "-m", "conv", "--steps", "400", "--memory", "3g",
                 "--pids-limit", "300", preexec_fn=interruptible)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            running = [c for c in containers_of(engine, proc.pid)
                       if c.labels.get("reproci") == "worker" and c.status == "running"]
            if running or proc.poll() is not None:
                break
            time.sleep(0.2)
        assert running, "no worker container started"
        # Hygiene, read back from the live container: user, network, privileges, read-only root and code,
        # the limits asked for, explicit environment.
        attrs = engine.api.inspect_container(running[0].id)
        host = attrs["HostConfig"]
        assert attrs["Config"]["User"] == f"{os.getuid()}:{os.getgid()}"
        assert host["NetworkMode"] == "none" and host["CapDrop"] == ["ALL"]
        assert host["SecurityOpt"] == ["no-new-privileges"]
        assert host["ReadonlyRootfs"] is True and set(host["Tmpfs"]) == {"/tmp"}
        assert host["Memory"] == host["MemorySwap"] == 3 * 1024**3 and host["PidsLimit"] == 300
        mounts = {m["Destination"]: m for m in attrs["Mounts"]}
        assert not mounts["/reproci/code/reproci"]["RW"]
        assert mounts["/reproci/run"]["RW"] and set(mounts) == {"/reproci/code/reproci", "/reproci/run"}
        image_env = set(engine.api.inspect_image(IMAGE)["Config"]["Env"])
        env = dict(e.split("=", 1) for e in set(attrs["Config"]["Env"]) - image_env)
        assert set(env) == {"PYTHONHASHSEED", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                            "PYTHONUNBUFFERED", "CUBLAS_WORKSPACE_CONFIG", "PYTHONPATH", "HOME",
                            "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS"}  # the manifest's avx2 cap
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)  # the CLI has exited: whatever it removes is removed by now
        assert proc.returncode == errors.EXIT_INTERRUPTED, err
        assert "interrupted" in err
        assert left_behind(tmp_path, pid=proc.pid, engine=engine) == []  # polls a while for the engine to settle
        assert not list((tmp_path / "results").glob("*/"))
    finally:  # one failure here must not leave containers for the tests after it to count
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        import docker.errors

        for c in containers_of(engine, proc.pid):
            try:
                c.remove(force=True)
            except docker.errors.NotFound:
                pass


def one_line_error(run: Run, code: int, fragment: str) -> None:
    assert run.returncode == code, run.stdout + run.stderr
    assert fragment in run.stderr and len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert not (run.cwd / "results").exists()  # nor the folder this run would have made


def test_an_unreachable_engine_is_an_infrastructure_error(tmp_path):
    run = reproci(tmp_path, "run", "--image", IMAGE, "-m", "embedding",
                  env={"DOCKER_HOST": "unix:///nonexistent.sock"}, timeout=60)
    one_line_error(run, errors.EXIT_INFRA, "cannot reach the Docker engine at unix:///nonexistent.sock")


def test_a_missing_image_is_an_infrastructure_error(engine, tmp_path):
    run = reproci(tmp_path, "run", "--image", "reproci/no-such-image:0", "-m", "embedding", timeout=60)
    one_line_error(run, errors.EXIT_INFRA, "image reproci/no-such-image:0 not found locally")


@pytest.fixture(scope="module")
def broken_images(engine):
    """Two tiny local images: one with python3 but no torch, one with no python3 at all."""
    no_torch = "reproci-test/no-torch:1"
    engine.images.build(fileobj=io.BytesIO(f"FROM {BASE}\nLABEL reproci.test=no-torch\n".encode()), tag=no_torch,
                        rm=True)
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as tar:
        info = tarfile.TarInfo("etc/os-release")
        body = b"NAME=empty\n"
        info.size, info.mode = len(body), stat.S_IFREG | 0o644
        tar.addfile(info, io.BytesIO(body))
    no_python = "reproci-test/no-python:1"
    engine.api.import_image_from_data(data.getvalue(), repository=no_python.split(":")[0], tag="1")
    yield no_torch, no_python
    for ref in (no_torch, no_python):
        engine.images.remove(ref, force=True)


def test_an_image_without_torch_is_an_infrastructure_error(engine, broken_images, tmp_path):
    run = reproci(tmp_path, "run", "--image", broken_images[0], "-m", "embedding", timeout=60)
    one_line_error(run, errors.EXIT_INFRA, f"image {broken_images[0]} has python3 but no torch")
    assert left_behind(run.cwd, pid=run.pid, engine=engine) == []


def test_an_image_without_python3_is_an_infrastructure_error(engine, broken_images, tmp_path):
    run = reproci(tmp_path, "run", "--image", broken_images[1], "-m", "embedding", timeout=60)
    one_line_error(run, errors.EXIT_INFRA, f"image {broken_images[1]} has no python3")
    assert left_behind(run.cwd, pid=run.pid, engine=engine) == []


def test_gpus_on_an_engine_without_gpus_are_an_infrastructure_error(engine, tmp_path):
    if "nvidia" in (engine.info().get("Runtimes") or {}):
        pytest.skip("this engine has the NVIDIA runtime: GPUs may well be there")
    run = reproci(tmp_path, "run", "--image", IMAGE, "--gpus", "all", "-m", "embedding", timeout=60)
    one_line_error(run, errors.EXIT_INFRA, "GPUs were requested (--gpus all)")
    assert left_behind(run.cwd, pid=run.pid, engine=engine) == []


def test_images_list_shows_the_built_image_with_its_digest_and_torch(engine, tmp_path):
    run = reproci(tmp_path, "images", "list", timeout=60)
    assert run.returncode == 0, run.stderr
    line = next(x for x in run.stdout.splitlines() if x.startswith("cpu-torch2.13 "))
    assert IMAGE in line and engine.images.get(IMAGE).id[:19] in line
    assert "torch 2.13.0+cpu" in run.stdout


def test_a_container_removed_while_listing_does_not_stop_the_sweep(engine, monkeypatch):
    """The engine lists containers, then answers 404 for one that ended in between (a probe, another run's
    clean-up). Listing by label and the label sweep use the list alone, so they never ask about one that is gone."""
    import docker.errors

    from reproci.backends.docker_engine import Engine

    label = f"reproci.test-sweep={os.getpid()}"
    made = [engine.api.create_container(BASE, command=["true"], labels={"reproci.test-sweep": str(os.getpid())})["Id"]
            for _ in range(2)]
    ours = Engine(engine)

    def gone(*_a, **_k):
        raise docker.errors.NotFound("No such container")

    try:
        monkeypatch.setattr(engine.api, "inspect_container", gone)
        assert sorted(cid for cid, labels in ours.labels_of(label) if labels) == sorted(made)
        ours.remove_labelled(label)
        monkeypatch.undo()
        assert engine.api.containers(all=True, filters={"label": label}) == []
    finally:
        monkeypatch.undo()
        for cid in made:
            try:
                engine.api.remove_container(cid, force=True)
            except docker.errors.NotFound:
                pass
