"""The strict-determinism stage, end to end through the real CLI and real training processes."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from reproci import errors

from .helpers import PLUGINS, ROOT, Cli, interruptible, left_behind, model_entry, said

pytestmark = pytest.mark.slow
FAULTY = PLUGINS / "faulty.py"
SHORT = ("--steps", "12", "--resume-at", "5", "--jobs", "2")


def test_reference_matrix_passes_and_writes_complete_results(reproci):
    p = reproci("run", "--jobs", "2")
    assert p.returncode == 0, p.stdout + p.stderr
    doc = reproci.latest()
    assert doc["schema"] == "reproci.results" and doc["version"] == 1 and doc["complete"]
    # Own checks pass (A = B = C); with no golden recorded yet for "local" the verdict is NEW.
    assert [m["verdict"] for m in doc["models"]] == ["NEW"] * 3
    assert all(m["message"].startswith("A = B = C") and "no golden file for image local" in m["message"]
               for m in doc["models"])
    for m in doc["models"]:
        assert set(m["runs"]) == {"A", "B", "C"}
        assert len({r["final_sha256"] for r in m["runs"].values()}) == 1
        # k = N/2 = 15, past the first epoch; the transformer's epoch is 19 batches, so run A moves k past it
        assert m["attestation"]["ok"] and m["runs"]["C"]["start_step"] == m["resume_at"] == m["coverage"]["resume_at"]
        assert m["resume_at"] == (24 if m["model"] == "transformer" else 15) and m["coverage"]["resume_epoch"] == 1
        assert m["final_sha256"][:12] in p.stdout
    env = doc["environment"]
    assert env["torch"].startswith("2.") and env["threads"]["intra_op"] == 1
    assert env["env"]["PYTHONHASHSEED"] == "0" and env["env"]["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert "hostname" not in str(env).lower()
    assert doc["packages"]["torch"] == env["torch"]
    # Checkpoints are removed once compared; the per-run records stay.
    run_dir = reproci.cwd / "results" / doc["run_id"]
    assert not list(run_dir.rglob("*.pt"))
    assert (run_dir / "conv" / "record-C.json").is_file()


def test_clean_runs_repeat_bit_for_bit(files):
    """Two invocations of ``reproci run`` (the session's real runs): A = B = C within each, and
    the same hash from both."""
    hashes = []
    for name in ("recorded", "compared"):
        entry = model_entry(json.loads(files[name].read_text()), "embedding")
        assert {r["final_sha256"] for r in entry["runs"].values()} == {entry["final_sha256"]}
        hashes.append(entry["final_sha256"])
    assert hashes[0] == hashes[1]


def test_drifting_buffer_with_equal_losses_is_nondeterministic(reproci):
    p = reproci("run", "-m", "conv", "--fault", "buffer-drift", *SHORT)
    assert p.returncode == errors.EXIT_REPRO_FAILURE, p.stdout + p.stderr
    m = model_entry(reproci.latest(), "conv")
    ev = m["evidence"]
    assert m["verdict"] == "NONDETERMINISTIC" and ev["comparison"] == "A vs B"
    assert ev["step"] == 6 and ev["tensor"] == "buffer:stem.1.running_mean"
    assert ev["losses_equal"] is True and ev["cause"] == "compute"
    assert ev["max_ulp"] == 1 and ev["elements_differing"] == 1 and ev["magnitude_source"] == "probe"


def test_unrestored_loader_position_is_resume_broken_from_data(reproci):
    p = reproci("run", "-m", "conv", "--fault", "resume-skip-loader-position", *SHORT)
    assert p.returncode == errors.EXIT_REPRO_FAILURE
    m = model_entry(reproci.latest(), "conv")
    assert m["verdict"] == "RESUME_BROKEN"
    assert m["evidence"]["comparison"] == "A vs C" and m["evidence"]["step"] == 6
    assert m["evidence"]["cause"] == "data"


def test_unrestored_rng_is_resume_broken_from_compute(reproci):
    p = reproci("run", "-m", "transformer", "--fault", "resume-drop-rng", *SHORT)
    assert p.returncode == errors.EXIT_REPRO_FAILURE
    ev = model_entry(reproci.latest(), "transformer")["evidence"]
    assert ev["step"] == 6 and ev["cause"] == "compute" and ev["kind"] == "grad"
    assert ev["max_abs"] > 0 and ev["max_ulp"] > 0


def test_clock_seed_fault_is_nondeterministic_from_step_one(reproci):
    p = reproci("run", "-m", "transformer", "--fault", "clock-seed", *SHORT)
    assert p.returncode == errors.EXIT_REPRO_FAILURE
    ev = model_entry(reproci.latest(), "transformer")["evidence"]
    assert ev["comparison"] == "A vs B" and ev["step"] == 1 and ev["kind"] == "grad"


def test_plugins_prove_each_verdict_names_its_cause(reproci):
    p = reproci("run", *SHORT, "-m", f"{FAULTY}:private_rng_hidden", "-m", f"{FAULTY}:private_rng_exposed",
                "-m", f"{FAULTY}:clock_seed", "-m", f"{FAULTY}:silent_buffer_drift",
                "-m", str(ROOT / "examples" / "mlp_plugin.py") + ":build")
    doc = reproci.latest()
    v = {m["model"]: m for m in doc["models"]}
    assert v["faulty.private_rng_hidden"]["verdict"] == "RESUME_BROKEN"
    assert v["faulty.private_rng_hidden"]["evidence"]["step"] == 6
    assert v["faulty.private_rng_exposed"]["verdict"] == "NEW"  # reproducible; no golden yet
    assert v["faulty.clock_seed"]["verdict"] == "NONDETERMINISTIC"
    drift = v["faulty.silent_buffer_drift"]
    assert drift["verdict"] == "NONDETERMINISTIC" and drift["evidence"]["tensor"] == "buffer:stat"
    assert drift["evidence"]["losses_equal"] is True
    assert v["mlp_plugin"]["verdict"] == "NEW"
    assert p.returncode == errors.EXIT_REPRO_FAILURE


BROKEN = {
    "not_a_setup": "breaks the plugin contract",
    "unseeded_loader": "nothing seeds its order",
    "crash_at_step_3": "illegal memory access",
    "nan_loss": "the loss is nan from step 3; at the end 8 state tensors hold non-finite values, first param:0.weight",
}


@pytest.fixture(scope="module")
def broken(tmp_path_factory):
    """One ``reproci run`` of every broken plugin: its output and results document."""
    cli = Cli(tmp_path_factory.mktemp("broken"))
    p = cli("run", *SHORT, *[a for f in BROKEN for a in ("-m", f"{FAULTY}:{f}")])
    return p, cli.latest()


@pytest.mark.parametrize("factory", list(BROKEN))
def test_broken_plugins_are_errors_with_one_line_messages(broken, factory):
    p, doc = broken
    assert p.returncode == errors.EXIT_RUN_ERROR, p.stdout + p.stderr
    m = model_entry(doc, f"faulty.{factory}")
    assert m["verdict"] == "ERROR" and BROKEN[factory] in m["message"] and "\n" not in m["message"]
    assert f"{m['model']}: ERROR: {m['message']}" in " ".join(p.stdout.split())  # what the user reads


def test_hanging_worker_times_out_and_leaves_no_process(reproci):
    p = reproci("run", "--timeout", "8", "-m", f"{FAULTY}:hang", *SHORT)
    assert p.returncode == errors.EXIT_RUN_ERROR
    m = reproci.latest()["models"][0]
    assert m["error"]["kind"] == "timeout" and "timed out after 8 s" in m["message"]
    assert left_behind(reproci.cwd, pid=reproci.pid) == []  # forked runs, their servers, fresh workers


def test_usage_errors_have_their_exit_code_and_one_line(reproci):
    for args, fragment in [(("-m", "resnet"), "unknown model"), (("--steps", "5", "--resume-at", "5"), "N must exceed k"),
                           (("--stage", "speed"), "unknown stage"), (("-m", "nope/x.py:build"), "does not exist")]:
        p = reproci("run", *args)
        assert p.returncode == errors.EXIT_USAGE, (args, p.stderr)
        assert fragment in p.stderr and len(p.stderr.strip().splitlines()) == 1
        assert not (reproci.cwd / "results").exists()
    p = reproci("run", "--no-such-flag")
    assert p.returncode == errors.EXIT_USAGE and "No such option" in p.stderr


@pytest.mark.parametrize("models", [("-m", "conv"), ("-m", "conv", "-m", "embedding", "--jobs", "2")],
                         ids=["one-model", "models-overlapping"])
def test_ctrl_c_stops_workers_and_leaves_nothing_half_written(tmp_path, models):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "reproci.cli", "run", *models, "--steps", "400"],
                            preexec_fn=interruptible,
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not list((tmp_path / "results").glob("*/conv/spec-A.json")):
        time.sleep(0.2)
    time.sleep(3)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == errors.EXIT_INTERRUPTED, err
    assert "interrupted" in err
    assert not list((tmp_path / "results").glob("*/results.json"))
    assert not list((tmp_path / "results").glob("*/"))  # the unfinished run directory is gone
    assert left_behind(tmp_path, pid=proc.pid) == []


def test_unusable_results_dir_is_a_one_line_usage_error(reproci):
    (reproci.cwd / "afile").write_text("")
    for target in ("afile", "afile/sub", "/proc/reproci-results"):
        p = reproci("run", "-m", "embedding", "--results-dir", target)
        assert p.returncode == errors.EXIT_USAGE, (target, p.stderr)
        assert f"--results-dir {target}: cannot write a run there" in p.stderr
        assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr
    assert (reproci.cwd / "afile").read_text() == ""


def test_cuda_without_a_gpu_is_an_infrastructure_error(reproci):
    """Here torch sees no GPU: asking for one is exit 5 with one line, not a plugin ERROR."""
    p = reproci("run", "--device", "cuda", "-m", "embedding", "--steps", "4", "--resume-at", "2")
    assert p.returncode == errors.EXIT_INFRA, p.stdout + p.stderr
    assert "--device cuda" in p.stderr and "sees no GPU" in p.stderr and "use --device cpu" in p.stderr
    lines = said(p.stderr)  # progress lines aside
    assert len(lines) == 1 and lines[0].startswith("error:")
    assert not list((reproci.cwd / "results").glob("*/results.json"))


def test_a_diverged_model_is_an_error_and_never_becomes_a_golden(reproci):
    """A NaN loss used to be NEW, recorded as `losses: [nan, ...]`, and PASS ever after."""
    p = reproci("run", *SHORT, "-m", f"{FAULTY}:nan_loss", "--update-golden", "--goldens-dir", "g")
    assert p.returncode == errors.EXIT_RUN_ERROR
    m = reproci.latest()["models"][0]
    assert m["verdict"] == "ERROR" and m["error"]["kind"] == "non-finite"
    assert not (reproci.cwd / "g").exists() or not any((reproci.cwd / "g").iterdir())
