"""``reproci run --backend ray`` on a real Ray cluster: a head and labelled nodes started here, on
the loopback address of a network namespace this module makes (Ray otherwise binds the host's
own address), stopped by their process IDs. The cells run in the CPU test image through a real
Docker engine and compare with the committed golden.

Skipped, with the reason, where Ray is not installed or no Docker engine answers; required where
REPROCI_REQUIRE_RAY=1 (.ci/run sets it).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Iterator

import pytest

from reproci import errors, verdicts

from .helpers import ROOT, docker_client, interruptible

pytestmark = pytest.mark.docker
IMAGE = "cpu-torch2.13"
SKEWED = {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41"}  # kernels no host of AVX2 or AVX512 picks
TAG = "reproci/cpu-torch2.13:1"
SHORT = ("--steps", "4", "--resume-at", "2")  # runs A, B and C, where no golden of committed settings is compared
PORT = 6379
ENV_FOR_RAY = {  # a dead node is noticed within seconds, not the default half a minute
    "RAY_health_check_period_ms": "500", "RAY_health_check_failure_threshold": "3",
    "RAY_health_check_initial_delay_ms": "0", "RAY_USAGE_STATS_ENABLED": "0", "RAY_DEDUP_LOGS": "0",
    # token authentication, as a cluster should run, with a token of this module's own
    "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": uuid.uuid4().hex,
}


TWINS = "reproci.test/twins=yes"  # the worker's, and the node of another environment that --across-nodes adds to it


def _ray_bin() -> Path:
    return Path(sys.executable).with_name("ray")


class Cluster:
    """A local Ray cluster in a network namespace of its own: ``node(label)`` starts a node
    (``ray start --block``, its own process group), ``kill(node)`` takes one down at once."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.netns = f"reproci-{os.getpid()}"
        self.prefix: list[str] = []
        self.nodes: dict[str, subprocess.Popen] = {}
        self.address = f"127.0.0.1:{PORT}"
        self.temp_dir = Path(f"/tmp/rt{os.getpid()}")  # Ray's socket paths must stay short

    def open(self) -> None:
        made = subprocess.run(["ip", "netns", "add", self.netns], capture_output=True, text=True)
        if made.returncode != 0:
            pytest.fail(f"cannot make a network namespace for the Ray cluster ({made.stderr.strip()}): "
                        "these tests run as root, as CI does")
        subprocess.run(["ip", "netns", "exec", self.netns, "ip", "link", "set", "lo", "up"], check=True)
        self.prefix = ["ip", "netns", "exec", self.netns]
        self.node("head", head=True)

    def env(self) -> dict[str, str]:
        # Each node's reproci starts its own fork servers, which end with it: a node killed here
        # takes everything it started along, as a machine that goes down would.
        outside = {k: v for k, v in os.environ.items() if k not in ("REPROCI_FORK_SERVERS", "PYTEST_CURRENT_TEST")}
        return {**outside, **ENV_FOR_RAY, "PYTHONPATH": str(ROOT), "CI": ""}

    def node(self, role: str, *, head: bool = False, pool: str | None = None, ip: str = "127.0.0.1",
             env: dict[str, str] | None = None, labels: str = "") -> subprocess.Popen:
        """A node labelled with its role (and ``reproci.test/pool`` if given, and ``labels``), at ``ip``
        (any loopback address: nodes are placed in address order), its tasks with ``env`` over the cluster's.
        Returns once the node shows in the cluster."""
        where = ["--head", f"--port={PORT}", "--include-dashboard=false", f"--temp-dir={self.temp_dir}"] if head else \
            [f"--address={self.address}"]
        labels = ",".join([f"reproci.test/role={role}", *([f"reproci.test/pool={pool}"] if pool else []),
                           *([labels] if labels else [])])
        log = open(self.tmp / f"ray-{role}.log", "w")
        proc = subprocess.Popen([*self.prefix, str(_ray_bin()), "start", "--block", *where, f"--node-ip-address={ip}",
                                 "--num-cpus=2", "--disable-usage-stats", f"--labels={labels}"],
                                env={**self.env(), **(env or {})}, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        self.nodes[role] = proc
        self.joined()
        return proc

    def joined(self) -> None:
        """Wait until every node started here shows in the cluster: first until each node's ``ray start``
        says it started (its log, read for free), then ``ray status`` (a Python process of its own, each
        poll) counts them."""
        what = f"node(s) {', '.join(self.nodes)} (logs: {self.tmp}/ray-*.log)"
        deadline = time.monotonic() + 90
        for role, proc in self.nodes.items():
            log = self.tmp / f"ray-{role}.log"
            while "Ray runtime started" not in log.read_text(errors="replace"):
                if proc.poll() is not None or time.monotonic() > deadline:
                    how = "not started in 90 s" if proc.returncode is None else f"exit {proc.returncode}"
                    self.kill(role)  # a node that failed to start is not waited for again by a later test
                    tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-15:])
                    pytest.fail(f"node {role} did not start ({how}): {what}; the end of its log:\n{tail}")
                time.sleep(0.2)
        self._wait_for(len(self.nodes), what)

    def _wait_for(self, count: int, what: str) -> None:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            out = subprocess.run([*self.prefix, str(_ray_bin()), "status", f"--address={self.address}"],
                                 capture_output=True, text=True, env=self.env())
            if out.returncode == 0 and len(re.findall(r"^\s*1 node_", out.stdout, re.M)) >= count:
                return
            time.sleep(1)
        pytest.fail(f"the Ray cluster did not show {count} node(s) in 90 s: {what}")

    def kill(self, role: str) -> None:
        """Take the node down at once; it no longer counts among the nodes a later start waits for."""
        proc = self.nodes.pop(role)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:  # it, and all it started, had already ended
            pass
        proc.wait()

    def close(self) -> None:
        for proc in reversed(list(self.nodes.values())):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.nodes.values():
            try:
                proc.wait(timeout=5)  # a node drains for up to 30 s; these have nothing left to drain
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        subprocess.run(["ip", "netns", "del", self.netns], capture_output=True)
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    def reproci(self, cwd: Path, *args: str, verb: tuple[str, ...] = ("run",), **popen) -> subprocess.Popen:
        """The real CLI, as the driver, inside the cluster's namespace."""
        return subprocess.Popen([*self.prefix, sys.executable, "-m", "reproci.cli", *verb, "--backend", "ray",
                                 "--address", self.address, *args], cwd=cwd, env={**self.env(), "COLUMNS": "200"},
                                text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen)


@pytest.fixture(scope="module")
def engine():
    client = docker_client(TAG)
    yield client
    client.close()


@pytest.fixture(scope="module")
def cluster(engine, tmp_path_factory) -> Iterator[Cluster]:
    try:
        import ray  # noqa: F401
    except ImportError as e:
        if os.environ.get("REPROCI_REQUIRE_RAY") == "1":
            pytest.fail(f"REPROCI_REQUIRE_RAY=1 but Ray does not import ({e}); `pip install -e '.[test]'` installs it")
        pytest.skip(f"Ray is not installed ({e}): `pip install 'reproci[ray]'`")
    c = Cluster(tmp_path_factory.mktemp("ray"))
    try:
        c.open()
        c.node("worker", pool="mixed", labels=TWINS)
        yield c
    finally:
        c.close()
    assert not _ray_processes(c.temp_dir), "a Ray process of the test cluster outlived it"


def _ray_processes(temp_dir: Path) -> list[str]:
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if str(temp_dir) in line and "ps -eo" not in line]


def project(tmp_path: Path) -> Path:
    """A project holding the committed golden of the CPU image, and nothing else."""
    (tmp_path / "goldens").mkdir(parents=True)
    for f in (ROOT / "goldens").glob(f"{IMAGE}.*"):
        shutil.copy(f, tmp_path / "goldens" / f.name)
    return tmp_path


def finish(proc: subprocess.Popen, timeout: float = 600) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def cells(cwd: Path) -> dict:
    run = json.loads((cwd / "results" / "latest.json").read_text())["run_id"]
    return json.loads((cwd / "results" / run / "cells.json").read_text())


def _against_the_committed_golden(doc: dict) -> tuple[int, str, str]:
    """The exit code and verdict a run of the committed CPU golden's settings gets on this host, and
    the words its messages carry. The golden was recorded under the image's CPU cap (avx2, from the
    manifest), as every cell must run: then a host of the golden's CPU vendor passes, and another
    vendor's is ENV_CHANGED naming the vendor (MKL's kernels differ by vendor at one ISA), as
    tests/test_docker_integration.py::test_the_committed_golden_holds_on_this_host says."""
    import yaml

    assert doc["options"]["cpu_isa"] == "avx2" and doc["environment"]["cpu_capability"] == "AVX2", doc["environment"]
    golden = yaml.safe_load((ROOT / "goldens" / f"{IMAGE}.yaml").read_text())["environment"]["cpu_id"]["vendor"]
    host = doc["environment"]["cpu_id"]["vendor"]
    if host == golden:
        return errors.EXIT_PASS, "PASS", ""
    return errors.EXIT_DRIFT, "ENV_CHANGED", f"CPU vendor {golden} → {host}"


def test_two_cells_run_on_two_nodes_and_pass_against_the_committed_golden(cluster, tmp_path):
    cwd = project(tmp_path)
    code, out, err = finish(cluster.reproci(cwd, "--image", IMAGE, "-m", "conv", "-m", "embedding"))
    assert (cwd / "results" / "latest.json").is_file(), out + err
    doc = json.loads((cwd / "results" / "latest.json").read_text())
    expected, verdict, why = _against_the_committed_golden(doc)
    assert code == expected, out + err
    assert [(m["model"], m["verdict"]) for m in doc["models"]] == [("conv", verdict), ("embedding", verdict)]
    assert all(why in m["message"] for m in doc["models"]), [m["message"] for m in doc["models"]]
    assert doc["image"]["id"].startswith("sha256:") and doc["image"]["reference"] == TAG
    placed = cells(cwd)["cells"]
    assert {c["cell"] for c in placed} == {f"conv@{IMAGE}", f"embedding@{IMAGE}"}
    assert len({c["node_id"] for c in placed}) == 2, placed  # one cell a node
    assert re.search(r"cell conv@cpu-torch2.13: placed on node 127\.0\.0\.1 \(\w{8}\)", err), err
    assert "golden recorded" not in out  # the driver writes goldens, and only when asked


def _normalised(doc: dict) -> dict:
    """A results document without what differs between any two runs: times, run ids, hosts."""
    timing = re.compile(r"(^|_)(s|seconds|created|run_id|host|hostname|at)$|_s$")

    def strip(v):
        if isinstance(v, dict):
            return {k: strip(x) for k, x in v.items() if not timing.search(k)}
        if isinstance(v, list):
            return [strip(x) for x in v]
        return v

    return strip(doc)


def test_a_cell_placed_by_label_gives_the_results_file_of_one_machine(cluster, tmp_path):
    """No golden here (the committed one is compared above, at its own settings): a short run whose
    results file, NEW and its golden section included, is the one one machine writes."""
    ray_cwd, one_cwd = tmp_path / "ray", tmp_path / "one"
    ray_cwd.mkdir()
    one_cwd.mkdir()
    code, out, err = finish(cluster.reproci(ray_cwd, "--image", IMAGE, "-m", "embedding", *SHORT,
                                            "--node-label", "reproci.test/role=worker"))
    assert code == 0, out + err
    assert [c["labels"]["reproci.test/role"] for c in cells(ray_cwd)["cells"]] == ["worker"]
    one = subprocess.run([sys.executable, "-m", "reproci.cli", "run", "--image", IMAGE, "-m", "embedding", *SHORT],
                         cwd=one_cwd, env={**cluster.env(), "COLUMNS": "200"}, capture_output=True, text=True,
                         timeout=600)
    assert one.returncode == 0, one.stdout + one.stderr
    on_ray = json.loads((ray_cwd / "results" / "latest.json").read_text())
    on_one = json.loads((one_cwd / "results" / "latest.json").read_text())
    assert on_ray["models"][0]["verdict"] == "NEW"
    assert _normalised(on_ray) == _normalised(on_one)
    assert list(on_ray) == list(on_one)  # the same keys in the same order: the same file, times aside


def _worker_containers(engine, since: float) -> list:
    return [c for c in engine.containers.list(all=True, filters={"label": "reproci=worker"}, ignore_removed=True)
            if c.attrs["Created"] and time.mktime(time.strptime(c.attrs["Created"][:19], "%Y-%m-%dT%H:%M:%S")) >= since - 5]


def _wait_for_container(engine, since: float, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if any(c.status == "running" for c in _worker_containers(engine, since)):
            return
        time.sleep(0.5)
    out, err = proc.communicate(timeout=60) if proc.poll() is not None else ("", "")
    pytest.fail(f"no cell container started: {out}{err}")


def _gone(engine, since: float, within: float = 90) -> list:
    deadline = time.monotonic() + within
    while True:
        left = [c.name for c in _worker_containers(engine, since)]
        cells_left = [line for line in _ps() if "reproci-cell-" in line or "--results-dir results --goldens-dir" in line]
        if not left and not cells_left or time.monotonic() > deadline:
            return left + cells_left
        time.sleep(0.5)


def _ps() -> list[str]:
    return subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout.splitlines()


def test_ctrl_c_cancels_every_cell_and_leaves_no_container_or_process(cluster, engine, tmp_path):
    cwd = project(tmp_path)
    since = time.time()
    proc = cluster.reproci(cwd, "--image", IMAGE, "-m", "conv", "-m", "embedding", "--steps", "400",
                           preexec_fn=interruptible)
    _wait_for_container(engine, since, proc)
    time.sleep(1)
    proc.send_signal(signal.SIGINT)
    code, out, err = finish(proc, timeout=120)
    assert code == errors.EXIT_INTERRUPTED, out + err
    assert "interrupted" in err
    assert _gone(engine, since) == []
    assert not [d for d in (cwd / "results").glob("*/")] if (cwd / "results").is_dir() else True, "a run folder stayed"


def test_a_node_without_docker_gets_no_cell_and_a_node_killed_mid_cell_loses_that_cell_alone(cluster, engine, tmp_path):
    """--image over the pool of three nodes: one where no Docker engine answers (its DOCKER_HOST
    points nowhere) is left out, and says so; nodes are placed in address order, so were it kept it
    would get a cell. The hanging cell's node (victim) is killed mid-cell: that cell is an
    infrastructure error (exit 5) naming the node, never a verdict, and the other cell's verdict is kept."""
    # One after the other: two `ray start`s side by side on one host can draw the same free port.
    cluster.node("nodocker", pool="mixed", env={"DOCKER_HOST": "unix:///nonexistent.sock"})
    cluster.node("victim", pool="mixed", ip="127.0.0.2")
    shutil.copy(ROOT / "tests" / "plugins" / "faulty.py", tmp_path / "faulty.py")  # a plugin of the project
    since = time.time()
    proc = cluster.reproci(tmp_path, "--image", IMAGE, "-m", "embedding", "-m", "faulty.py:hang", "--steps", "4",
                           "--resume-at", "2", "--timeout", "120", "--node-label", "reproci.test/pool=mixed")
    try:
        deadline = time.monotonic() + 120
        while not [c for c in _worker_containers(engine, since)
                   if c.labels.get("reproci.model") == "faulty.hang" and c.status == "running"]:
            assert time.monotonic() < deadline and proc.poll() is None, "the hanging cell's container did not start"
            time.sleep(0.5)
        cluster.kill("victim")
        code, out, err = finish(proc, timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert code == errors.EXIT_INFRA, out + err
    left_out = re.findall(r"node 127\.0\.0\.1 \((\w{8})\) left out: no Docker engine answers there \(cannot reach", err)
    assert len(left_out) == 1, err
    placed = dict(re.findall(r"cell (\S+)@cpu-torch2\.13: placed on node (127\.0\.0\.\d \(\w{8}\))", err))
    assert placed["faulty.hang"].startswith("127.0.0.2") and left_out[0] not in placed["embedding"], err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "cell faulty.hang@cpu-torch2.13" in lines[0], err
    assert placed["faulty.hang"] in lines[0] and "died" in lines[0], err
    doc = json.loads((tmp_path / "results" / "latest.json").read_text())
    assert [(m["model"], m["verdict"]) for m in doc["models"]] == [("embedding", "NEW")]  # the other cell, kept
    assert len(doc["lost_cells"]) == 1 and doc["summary"]["exit_code"] == errors.EXIT_INFRA
    assert _gone(engine, since) == []  # the lost cell's run stopped its container when its task died


def test_the_driver_alone_records_one_golden_from_the_cells_and_one_machine_passes_against_it(cluster, tmp_path):
    """Local backend on the nodes (no image): each cell records its model's part in its own
    directory; the project's goldens folder gets one file, written by the driver."""
    short = ("-m", "embedding", "-m", "conv", *SHORT)
    code, out, err = finish(cluster.reproci(tmp_path, *short, verb=("golden", "update")))
    assert code == 0, out + err
    assert "golden recorded: goldens/local.yaml" in out
    import yaml

    golden = yaml.safe_load((tmp_path / "goldens" / "local.yaml").read_text())
    run_id = json.loads((tmp_path / "results" / "latest.json").read_text())["run_id"]
    assert sorted(golden["models"]) == ["conv", "embedding"]
    assert {m["run_id"] for m in golden["models"].values()} == {run_id} == {golden["recorded"]["run_id"]}
    assert len(list((tmp_path / "goldens").glob("local.*.npz"))) == 1
    one = subprocess.run([sys.executable, "-m", "reproci.cli", "run", *short], cwd=tmp_path,
                         env={**cluster.env(), "COLUMNS": "200"}, capture_output=True, text=True, timeout=600)
    assert one.returncode == 0, one.stdout + one.stderr
    doc = json.loads((tmp_path / "results" / "latest.json").read_text())
    assert [(m["model"], m["verdict"]) for m in doc["models"]] == [("embedding", "PASS"), ("conv", "PASS")]


# --across-nodes: the two nodes of this cluster, on one physical host, stand in for two machines of
# one image. Local backend on the nodes (no image), conv (its hashes move with the CPU kernels), 4 steps.
ACROSS = ("--across-nodes", "-m", "conv", *SHORT)


def test_a_model_run_on_two_nodes_agrees_across_them_and_says_so(cluster, tmp_path):
    """Every live node of this cluster has the same environment: the cell's run A and its twin's agree
    step by step, the verdict stands (NEW: no golden here) and the report names both nodes."""
    code, out, err = finish(cluster.reproci(tmp_path, *ACROSS))
    assert code == 0, out + err
    placed = {c["cell"]: f"{c['node_ip']} ({c['node_id'][:8]})" for c in cells(tmp_path)["cells"]}
    assert set(placed) == {"conv@local", "conv@local~twin"} and len(set(placed.values())) == 2, placed
    said = f"conv: agreed across nodes {placed['conv@local']} and {placed['conv@local~twin']} (run A: every step"
    assert said in out, out
    doc = json.loads((tmp_path / "results" / "latest.json").read_text())
    assert doc["options"]["across_nodes"] is True and doc["models"][0]["verdict"] == "NEW"
    run_dir = tmp_path / "results" / doc["run_id"]
    assert not list(run_dir.rglob("*.pt")), "a kept final state or checkpoint stayed"


def test_a_node_whose_cpu_kernels_differ_is_caught_and_named_as_the_environment(cluster, tmp_path):
    """Alone, the worker cannot hold a twin: one line, exit 2, no cell placed. Then a node whose tasks
    cap ATen's and oneDNN's kernels (as a machine of another CPU generation picks others) joins it:
    conv's runs A differ across the two, and the report names both nodes, the step, the tensor and
    the factor that differs, as ENV_CHANGED (exit 3), not nondeterminism."""
    code, out, err = finish(cluster.reproci(tmp_path, *ACROSS, "--node-label", TWINS))
    assert code == errors.EXIT_USAGE and "--across-nodes runs each model's cell on two nodes, and 1 node" in err, err
    assert "placed on node" not in err and not (tmp_path / "results").exists()
    cluster.node("skewed", labels=TWINS, env=SKEWED)
    try:
        code, out, err = finish(cluster.reproci(tmp_path, *ACROSS, "--node-label", TWINS))
    finally:
        cluster.kill("skewed")
    assert code == errors.EXIT_DRIFT, out + err
    doc = json.loads((tmp_path / "results" / "latest.json").read_text())
    m = doc["models"][0]
    ev, nodes = m["across_nodes"]["evidence"], m["across_nodes"]["nodes"]
    placed = {c["cell"]: f"{c['node_ip']} ({c['node_id'][:8]})" for c in cells(tmp_path)["cells"]}
    assert nodes == [placed["conv@local"], placed["conv@local~twin"]] and nodes[0] != nodes[1]
    assert m["verdict"] == "ENV_CHANGED" and ev["step"] is not None and ev["max_abs"] is not None
    said = f"conv: ENV_CHANGED: runs on {nodes[0]} and {nodes[1]} differ {verdicts.where_text(ev)}"  # step and tensor
    flat = " ".join(out.split())
    assert said in flat and "max |Δ|" in flat and "the nodes differ: CPU capability (ATen)" in flat, out
    assert {"cpu_capability", "kernel_env.ATEN_CPU_CAPABILITY"} <= set(m["across_nodes"]["env_diff"]), m["across_nodes"]


def test_a_script_model_runs_as_a_cell_and_its_golden_holds_on_one_machine(cluster, tmp_path):
    """A training script (``--script``) is a cell like a factory model: run from the project's copy
    on a node, with its commands and name; the golden the driver records from the cell is the one
    one machine's run then passes against. With --image it is refused before any cell, in one line."""
    from .test_script_models import SCRIPTS

    cwd = tmp_path / "project"
    cwd.mkdir()
    shutil.copy(SCRIPTS / "loop_train.py", cwd / "train.py")
    args = ("--script", "python train.py {steps} {out}", "--resume-script", "python train.py {steps} {out} --resume",
            "--name", "loop", "--steps", "4", "--resume-at", "2")
    code, out, err = finish(cluster.reproci(cwd, *args, "--update-golden"))
    assert code == errors.EXIT_PASS, out + err
    doc = json.loads((cwd / "results" / "latest.json").read_text())
    assert [(m["model"], m["verdict"]) for m in doc["models"]] == [("loop", verdicts.NEW)], doc["models"]
    assert doc["models"][0]["message"].startswith("A = B = C")
    assert {c["cell"] for c in cells(cwd)["cells"]} == {"loop@local"}
    one = subprocess.run([sys.executable, "-m", "reproci.cli", "run", *args], cwd=cwd, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=600)
    assert one.returncode == errors.EXIT_PASS, one.stdout + one.stderr
    assert json.loads((cwd / "results" / "latest.json").read_text())["models"][0]["verdict"] == verdicts.PASS
    code, out, err = finish(cluster.reproci(cwd, *args, "--image", IMAGE))
    assert code == errors.EXIT_USAGE and "runs each cell's script on its node's own Python" in err, err
