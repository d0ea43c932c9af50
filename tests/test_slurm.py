"""``reproci run --backend slurm``: the option checks and the batch script (quick, no cluster), and
the backend on a real local Slurm cluster (tests/slurm_cluster.py: munged, slurmctld and two
slurmd, node1 and node2, on this one host; they stand in for two machines). The cells run on
the nodes' local backend (the host's Python: the nodes share this filesystem), quick profile,
8 steps. Skipped without slurm-wlm and munge, required where REPROCI_REQUIRE_SLURM=1 (.ci/run)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from reproci import errors, plugins
from reproci.cluster import slurm_driver, slurm_job
from reproci.commands.run import run_cmd
from reproci.plugins import build_options

from .helpers import ROOT, interruptible
from .slurm_cluster import Cluster, slurm  # noqa: F401  (the session fixture)

SHORT = ("--steps", "8", "--resume-at", "4")


# ---- quick: no cluster -----------------------------------------------------------------------

@pytest.mark.parametrize("argv,fragment", [
    (("--gres", "gpu:"), "--gres 'gpu:' is not NAME[:TYPE][:COUNT]"),
    (("--gres", "gpu=2"), "--gres 'gpu=2' is not NAME[:TYPE][:COUNT]"),
    (("--time", "1h"), "--time '1h' is not a Slurm time limit"),
    (("--gpus-per-task", "two"), "--gpus-per-task 'two' is not [TYPE:]COUNT"),
])
def test_a_malformed_slurm_request_is_one_usage_line_before_slurm_is_asked(cli, argv, fragment):
    code, out, err = cli("run", "--backend", "slurm", *argv)
    assert code == errors.EXIT_USAGE and err.startswith("error: ") and fragment in err, err
    assert err.count("error:") == 1


def test_a_script_cell_that_could_not_run_its_commands_is_refused_before_slurm_is_asked(cli, tmp_path, monkeypatch):
    """A cell runs a script's commands from a copy of the folder reproci is started in, on the
    node's Python: a script of reproci.yaml in a folder above, or one asked for in --image, is one
    line (exit 2) before any job."""
    from .test_script_models import SCRIPTS

    shutil.copy(SCRIPTS / "loop_train.py", tmp_path / "train.py")
    (tmp_path / "reproci.yaml").write_text('script: "python train.py {steps} {out}"\n'
                                            'resume_script: "python train.py {steps} {out} --resume"\n')
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")
    code, out, err = cli("run", "--backend", "slurm")
    assert code == errors.EXIT_USAGE and f"its commands run from {tmp_path}, where reproci.yaml is" in err, err
    monkeypatch.chdir(tmp_path)
    code, out, err = cli("run", "--backend", "slurm", "--image", "cpu-torch2.13")
    assert code == errors.EXIT_USAGE and "runs each cell's script on its node's own Python, not in --image" in err, err


@pytest.mark.parametrize("argv,flag", [(("--partition", "gpu"), "--partition"), (("--time", "10"), "--time"),
                                       (("--sbatch-arg=--exclusive",), "--sbatch-arg"), (("--qos", "high"), "--qos")])
def test_a_slurm_option_without_backend_slurm_is_a_usage_error(cli, argv, flag):
    code, out, err = cli("run", *argv)
    assert code == errors.EXIT_USAGE and f"error: {flag} asks Slurm for the cells: add --backend slurm" in err, err


def test_a_cell_is_given_none_of_the_drivers_slurm_options():
    given = run_cmd.make_context("run", ["--backend", "slurm", "--partition", "p", "--time", "5", "--gres", "gpu:1",
                                         "--sbatch-arg=--exclusive", "--launcher", "node", "--slurm-spool", "s",
                                         "-m", "conv", "--steps", "8"], obj=plugins.stages()).params
    assert plugins.catalog().for_cell(given) == {"steps": 8}  # the cell runs on its node, not on Slurm


def _options(**given):
    return build_options({"models": ("conv", "embedding"), **given})


def test_the_batch_script_asks_for_one_task_per_cell_with_the_users_slurm_options(tmp_path):
    opts = slurm_job.slurm_options(partition="gpu", account="lab", qos="high", time="0:30:00", gres="gpu:a100:2")
    text = slurm_job.script(_options(), opts, tmp_path, 2, 3)
    head = re.findall(r"^#SBATCH (\S+)$", text, re.M)
    assert head == ["--job-name=reproci-local", "--array=0-1", f"--output={tmp_path}/cell-%a/slurm.log", "--ntasks=1",
                    "--cpus-per-task=3", "--partition=gpu", "--account=lab", "--qos=high", "--time=0:30:00",
                    "--gres=gpu:a100:2"]
    assert text.splitlines()[-1] == f'exec {sys.executable} -m reproci.cluster.slurm_job {tmp_path} "$SLURM_ARRAY_TASK_ID"'
    cuda = slurm_job.script(_options(device="cuda", world_size=2), slurm_job.slurm_options(), tmp_path, 1, 1)
    assert "#SBATCH --gres=gpu:2" in cuda  # a CUDA cell asks for its ranks' GPUs when the user named none


def test_the_pyxis_script_runs_the_cell_inside_the_image_with_srun(tmp_path):
    """pyxis (srun --container-image) is not installed here and cannot run: the script's text is
    what this checks, and the cell's arguments inside the container."""
    opts = _options(image="nvcr.io#nvidia/pytorch:25.01-py3")
    text = slurm_job.script(opts, slurm_job.slurm_options(launcher="pyxis"), tmp_path / "spool", 2, 4)
    root = opts.project_root
    assert text.splitlines()[-1] == (
        "exec srun --ntasks=1 --container-image='nvcr.io#nvidia/pytorch:25.01-py3' "
        f"--container-mounts={root}:{root},{tmp_path}/spool:{tmp_path}/spool --container-workdir={root} "
        f'python3 -m reproci.cluster.slurm_job {tmp_path}/spool "$SLURM_ARRAY_TASK_ID"')
    assert slurm_job.pyxis_options({"image": "x", "steps": 8, "memory": "4g"}, "pytorch-25.01") == \
        {"steps": 8, "image_name": "pytorch-25.01"}  # the local backend inside, goldens named after the image


def test_pending_tasks_that_share_one_record_are_each_counted():
    assert slurm_driver._indices("1,3-5%2") == [1, 3, 4, 5]
    assert slurm_driver._indices("7") == [7] and slurm_driver._indices("") == []


def test_across_nodes_asks_each_task_for_two_nodes_and_starts_the_cell_and_its_twin_on_one_each(tmp_path):
    """The twin's node differs from its cell's because the allocation is two nodes with one task
    on each (what any scheduler honours), not by naming nodes."""
    across = slurm_job.slurm_options(across_nodes=True)
    text = slurm_job.script(_options(), across, tmp_path, 2, 3)
    assert re.findall(r"^#SBATCH (\S+)$", text, re.M)[3:7] == ["--nodes=2", "--ntasks=2", "--ntasks-per-node=1",
                                                             "--cpus-per-task=3"]
    assert text.splitlines()[-1] == (f"exec srun --ntasks=2 --ntasks-per-node=1 --cpus-per-task=3 --label {sys.executable} "
                                     f'-m reproci.cluster.slurm_job {tmp_path} "$SLURM_ARRAY_TASK_ID"')
    pyxis = slurm_job.script(_options(image="nvcr.io#nvidia/pytorch:25.01-py3"),
                             slurm_job.slurm_options(launcher="pyxis", across_nodes=True), tmp_path, 1, 3)
    assert pyxis.splitlines()[-1].startswith("exec srun --ntasks=2 --ntasks-per-node=1 --cpus-per-task=3 --label "
                                             "--container-image=")
    (tmp_path / "spool").mkdir()
    pairs = slurm_job.write(_options(), tmp_path / "spool", {}, across_nodes=True)
    assert [[s.name for s in pair] for pair in pairs] == [["conv@local", "conv@local~twin"],
                                                         ["embedding@local", "embedding@local~twin"]]
    twin = json.loads((tmp_path / "spool" / "cell-1" / "twin" / "spec.json").read_text())  # srun rank 1 reads it
    assert twin["name"] == "embedding@local~twin" and not twin["update_golden"] and twin["keep_checkpoints"]


@pytest.mark.parametrize("sinfo,usable", [("node1 2 idle\nnode2 2 down*\n", "1 node in partition gpu can take jobs "
                                                                         "(node1 idle, node2 down*)"),
                                          ("node1 2 mix\nnode2 2 idle*\n", "1 node in partition gpu"),
                                          ("node1 2 drain\nnode1 2 drain\n", "0 nodes in partition gpu")],
                         ids=["down", "unresponsive", "drained"])
def test_across_nodes_with_fewer_than_two_nodes_is_one_usage_line_before_any_job(cli, tmp_path, monkeypatch,
                                                                                 sinfo, usable):
    asked: list[str] = []

    def fake(*argv, check=True):
        asked.append(argv[0])
        return subprocess.CompletedProcess(argv, 0, sinfo if argv[0] == "sinfo" else "7\n", "")

    monkeypatch.setattr(slurm_driver, "_slurm", fake)
    monkeypatch.chdir(tmp_path)
    code, out, err = cli("run", "--backend", "slurm", "--across-nodes", "--partition", "gpu", "-m", "conv")
    assert code == errors.EXIT_USAGE and err.count("error:") == 1, err
    assert f"error: --across-nodes runs each model's cell on two nodes, and {usable}" in err, err
    assert asked == ["sinfo"] and not (tmp_path / "results").exists()  # nothing submitted, no spool left


# ---- on the cluster --------------------------------------------------------------------------

def reproci(cluster: Cluster, cwd: Path, *args: str, **popen) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "reproci.cli", "run", "--backend", "slurm", *args], cwd=cwd,
                            env=cluster.env(), text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen)


@pytest.fixture(scope="module")
def golden(slurm, tmp_path_factory):  # noqa: F811
    """A project whose golden for conv and embedding was recorded by one machine (the local backend,
    through the session's standing fork servers)."""
    cwd = tmp_path_factory.mktemp("project")
    one = subprocess.run([sys.executable, "-m", "reproci.cli", "golden", "update", "-m", "conv", "-m", "embedding",
                          *SHORT], cwd=cwd, env={**os.environ, "CI": ""}, capture_output=True, text=True, timeout=300)
    assert one.returncode == 0, one.stdout + one.stderr
    return cwd


def copy(golden_project: Path, to: Path) -> Path:
    shutil.copytree(golden_project / "goldens", to / "goldens")
    return to


def latest(cwd: Path) -> dict:
    return json.loads((cwd / "results" / "latest.json").read_text())


def cells(cwd: Path) -> dict:
    return json.loads((cwd / "results" / latest(cwd)["run_id"] / "cells.json").read_text())


@pytest.mark.slow
def test_two_cells_on_two_nodes_give_the_hashes_of_one_machine(slurm, golden, tmp_path):  # noqa: F811
    cwd = copy(golden, tmp_path)
    proc = reproci(slurm, cwd, "-m", "conv", "-m", "embedding", *SHORT)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, out + err
    doc, one = latest(cwd), json.loads((golden / "results" / "latest.json").read_text())
    assert [(m["model"], m["verdict"]) for m in doc["models"]] == [("conv", "PASS"), ("embedding", "PASS")]
    assert [m["final_sha256"] for m in doc["models"]] == \
        [m["final_sha256"] for m in one["models"]]
    placed = cells(cwd)["cells"]
    assert {(c["cell"], c["array_index"], c["state"]) for c in placed} == {("conv@local", 0, "COMPLETED"),
                                                                          ("embedding@local", 1, "COMPLETED")}
    assert {c["node"] for c in placed} == {"node1", "node2"}  # each cell takes a node's two CPUs
    for word in ("pending \\(job \\d+_0\\)", "running on node node\\d \\(job \\d+_0\\)", "finished on node node\\d in"):
        assert re.search(f"cell conv@local: {word}", err), err
    assert not (cwd / "results" / ".slurm").exists()  # the spool goes with the run


@pytest.mark.slow
def test_a_script_model_is_a_cell_with_the_hashes_of_one_machine(slurm, tmp_path):  # noqa: F811
    """A training script (``--script``) is an array task like a factory model: its commands run from
    the project's copy on a node, and give the final hash one machine's run gives."""
    from .test_script_models import SCRIPTS

    shutil.copy(SCRIPTS / "loop_train.py", tmp_path / "train.py")
    args = ("--script", "python train.py {steps} {out}", "--resume-script", "python train.py {steps} {out} --resume",
            "--name", "loop", *SHORT)
    one = subprocess.run([sys.executable, "-m", "reproci.cli", "run", *args], cwd=tmp_path, capture_output=True,
                         text=True, env={**os.environ, "CI": ""}, timeout=300)
    assert one.returncode == 0, one.stdout + one.stderr
    expected = latest(tmp_path)["models"][0]["final_sha256"]
    proc = reproci(slurm, tmp_path, *args)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, out + err
    doc = latest(tmp_path)
    assert [(m["model"], m["verdict"], m["final_sha256"]) for m in doc["models"]] == [("loop", "NEW", expected)]
    assert {(c["cell"], c["state"]) for c in cells(tmp_path)["cells"]} == {("loop@local", "COMPLETED")}


@pytest.mark.slow
def test_across_nodes_a_clean_model_agrees_on_node1_and_node2_and_the_report_says_so(slurm, golden, tmp_path):  # noqa: F811
    """One array task holds embedding's cell and its twin, one on each node (node1 and node2 stand
    in for two machines); their runs A agree step by step, and the verdict against one machine's
    golden stands."""
    cwd = copy(golden, tmp_path)
    proc = reproci(slurm, cwd, "--across-nodes", "-m", "embedding", *SHORT)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, out + err
    m = latest(cwd)["models"][0]
    assert (m["model"], m["verdict"], m["across_nodes"]["agree"]) == ("embedding", "PASS", True)
    assert sorted(m["across_nodes"]["nodes"]) == ["node1", "node2"]
    first, second = m["across_nodes"]["nodes"]
    assert f"embedding: agreed across nodes {first} and {second} (run A: every step and the final hash)" in out, out
    rows = {c["cell"]: c for c in cells(cwd)["cells"]}
    assert {(c, r["node"], r["array_index"]) for c, r in rows.items()} == {("embedding@local", first, 0),
                                                                           ("embedding@local~twin", second, 0)}
    assert f"cell embedding@local~twin: finished on node {second} in" in err, err
    job = slurm.run("scontrol", "-o", "show", "job", str(cells(cwd)["job_id"])).stdout.splitlines()
    assert len(job) == 1 and "NumNodes=2 " in job[0], job  # one array task: the pair, on a two-node allocation


@pytest.mark.slow
def test_a_cell_slurm_ends_is_named_with_its_state_and_a_requeued_cell_counts_once(slurm, golden, tmp_path):  # noqa: F811
    """The hanging cell is cancelled from outside (as an admin's scancel, a preemption or a
    time limit would end it): exit 5 naming Slurm's state and exit code, the other cell kept.
    That other cell is requeued once while it runs: one result, its restart recorded."""
    cwd = copy(golden, tmp_path)
    shutil.copy(ROOT / "tests" / "plugins" / "faulty.py", cwd / "faulty.py")
    proc = reproci(slurm, cwd, "-m", "embedding", "-m", "faulty.py:hang", *SHORT, "--timeout", "120")
    try:
        job = _running(slurm, proc, 2)
        assert slurm.run("scontrol", "requeue", f"{job}_0").returncode == 0
        assert slurm.run("scancel", f"{job}_1").returncode == 0
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == errors.EXIT_INFRA, out + err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and re.match(rf"error: cell faulty\.hang@local \(job {job}_1, node node\d\) was ended by "
                                        r"Slurm: CANCELLED, exit code \d+:\d+; run the cell again$", lines[0]), err
    assert "cell embedding@local: requeued by Slurm (restart 1); counted once" in err
    doc = latest(cwd)
    assert [(m["model"], m["verdict"]) for m in doc["models"]] == [("embedding", "PASS")]
    assert doc["lost_cells"] == [lines[0].removeprefix("error: ")]
    rows = {c["cell"]: c for c in cells(cwd)["cells"]}
    assert rows["embedding@local"]["restarts"] == 1 and rows["faulty.hang@local"]["state"] == "CANCELLED"


def _running(cluster: Cluster, proc: subprocess.Popen, count: int) -> str:
    """The array job's id once ``count`` of its tasks run."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        out = cluster.run("squeue", "-h", "-t", "RUNNING", "-o", "%A %K").stdout.split("\n")
        running = [line.split() for line in out if line.strip()]
        if len(running) >= count:
            return running[0][0].split("_")[0] if "_" in running[0][0] else _array_of(cluster, running[0][0])
        time.sleep(0.3)
    pytest.fail(f"{count} task(s) did not start: {proc.communicate(timeout=60) if proc.poll() is not None else ''}")


def _array_of(cluster: Cluster, job: str) -> str:
    fields = dict(re.findall(r"(\w+)=(\S*)", cluster.run("scontrol", "-o", "show", "job", job).stdout))
    return fields["ArrayJobId"]


@pytest.mark.slow
def test_ctrl_c_cancels_the_array_and_leaves_no_job_or_file(slurm, tmp_path):  # noqa: F811
    proc = reproci(slurm, tmp_path, "-m", "embedding", "--steps", "400", preexec_fn=interruptible)
    _running(slurm, proc, 1)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == errors.EXIT_INTERRUPTED, out + err
    assert slurm.run("squeue", "-h").stdout.strip() == ""
    assert not list((tmp_path / "results").glob("*")) if (tmp_path / "results").is_dir() else True
    left = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert "reproci-cell-embedding" not in left and "slurm_job" not in left


@pytest.mark.slow
def test_an_unreachable_controller_is_one_infrastructure_line(slurm, tmp_path):  # noqa: F811
    conf = tmp_path / "slurm.conf"
    # nothing listens on port 1; Slurm retries for about MessageTimeout (10 s by default, 2 s here) before it says so
    conf.write_text(re.sub(r"SlurmctldPort=\d+", "SlurmctldPort=1", slurm.conf.read_text()) + "MessageTimeout=2\n")
    run = subprocess.run([sys.executable, "-m", "reproci.cli", "run", "--backend", "slurm", "-m", "conv"], cwd=tmp_path,
                         env={**slurm.env(), "SLURM_CONF": str(conf)}, capture_output=True, text=True, timeout=120)
    assert run.returncode == errors.EXIT_INFRA, run.stdout + run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: cannot reach the Slurm controller ("), run.stderr
