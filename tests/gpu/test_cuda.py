"""Every stage on a GPU through the real CLI (local backend): the reference models, every
optimizer state layout, AMP, real CUDA nondeterminism caught, an op without a deterministic
kernel reported in one line, the throughput stage with the allocator's peak memory, and
DDP: more ranks than GPUs refused, two ranks over NCCL (where two GPUs are visible); runs forked
from the fork server on CUDA, equal to fresh ones."""

from __future__ import annotations

import pytest

from tests.helpers import ROOT, Cli, model_entry

from .conftest import DEVICE, SIZE

PLUGINS = ROOT / "tests" / "gpu" / "plugins.py"
SHORT = SIZE


@pytest.fixture
def reproci(tmp_path) -> Cli:
    return Cli(tmp_path)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """One run of the three reference models, -j 3: A, B and C of three models overlap on one
    device; (its CLI process, its results document)."""
    cli = Cli(tmp_path_factory.mktemp("reference"))
    return run(cli, DEVICE, "conv", "transformer", "embedding", extra=("-j", "3")), cli.latest()


def run(reproci: Cli, device: str, *models: str, extra: tuple[str, ...] = ()):
    args = ["run", "--device", device, *SHORT, *extra]
    for m in models:
        args += ["-m", m]
    return reproci(*args, timeout=900)


def test_the_reference_models_pass_the_strict_stage_three_runs_at_a_time(reference, device):
    """-j 3 on one GPU: A, B and C of three models overlap on the same device."""
    p, doc = reference
    assert p.returncode == 0, p.stdout + p.stderr
    for name in ("conv", "transformer", "embedding"):
        entry = model_entry(doc, name)
        assert entry["verdict"] == "NEW", entry["message"]
        assert len({entry["runs"][r]["final_sha256"] for r in "ABC"}) == 1
    assert doc["environment"]["device"] == device


@pytest.mark.parametrize("optimizers", [("sgd", "adam", "adamw", "adagrad")])
def test_every_optimizer_state_layout_resumes_exactly(reproci, device, optimizers):
    """Adam, AdamW and Adagrad keep state["step"] on the CPU beside CUDA parameters."""
    p = run(reproci, device, *(f"{PLUGINS}:{o}" for o in optimizers), extra=("-j", "3"))
    assert p.returncode == 0, p.stdout + p.stderr
    for o in optimizers:
        assert model_entry(reproci.latest(), f"plugins.{o}")["verdict"] == "NEW"


@pytest.mark.cuda_only
def test_fused_and_capturable_adam_resume_exactly(reproci, device):
    p = run(reproci, device, f"{PLUGINS}:adam_fused", f"{PLUGINS}:adam_capturable", extra=("-j", "2"))
    assert p.returncode == 0, p.stdout + p.stderr


def test_amp_bf16_and_fp16_with_a_grad_scaler_resume_exactly(reproci, device):
    p = run(reproci, device, f"{PLUGINS}:amp_bf16", f"{PLUGINS}:amp_fp16_scaler", extra=("-j", "2"))
    assert p.returncode == 0, p.stdout + p.stderr
    for name in ("plugins.amp_bf16", "plugins.amp_fp16_scaler"):
        assert model_entry(reproci.latest(), name)["verdict"] == "NEW"


@pytest.mark.cuda_only
def test_float_atomics_on_colliding_rows_are_caught_with_step_tensor_and_op(reproci, device):
    p = run(reproci, device, f"{PLUGINS}:cuda_atomics")
    assert p.returncode == 1, p.stdout + p.stderr
    entry = model_entry(reproci.latest(), "plugins.cuda_atomics")
    assert entry["verdict"] == "NONDETERMINISTIC"
    ev = entry["evidence"]
    assert "plugins.py" in entry["message"]  # the line that switched deterministic algorithms off
    if ev.get("step") is not None:  # the runs differed (they may also agree by chance: controls still fail it)
        assert ev["tensor"] and (ev.get("op") or {}).get("op") in ("aten::index_add", "aten::index_add_")


@pytest.mark.cuda_only
def test_an_op_without_a_deterministic_kernel_is_a_one_line_error(reproci, device):
    p = run(reproci, device, f"{PLUGINS}:no_deterministic_kernel")
    assert p.returncode == 4, p.stdout + p.stderr
    entry = model_entry(reproci.latest(), "plugins.no_deterministic_kernel")
    assert entry["verdict"] == "ERROR" and entry["error"]["kind"] == "no-deterministic-kernel"
    assert "has no deterministic kernel on this device" in entry["message"] and "\n" not in entry["message"]
    assert "Traceback" not in p.stdout


def test_the_throughput_stage_reports_the_allocator_peak(reproci, device):
    p = reproci("run", "--device", device, "--stage", "throughput", "-m", "embedding",
                *(("--steps", "40", "--repetitions", "2") if DEVICE == "cuda" else ("--steps", "8", "--repetitions", "1")),
                timeout=900)
    assert p.returncode == 0, p.stdout + p.stderr
    t = model_entry(reproci.latest(), "embedding")["throughput"]
    strict = t["modes"]["strict"]
    assert strict["steps_per_s"] > 0 and t["slowdown"]["median"] > 0
    kind = "cuda.max_memory_allocated" if device == "cuda" else "ru_maxrss"
    assert (strict.get("peak_memory_kind") or "").startswith(kind.split(".")[0])


@pytest.mark.cuda_only
def test_more_ranks_than_gpus_stop_the_run_with_one_line_and_exit_5(reproci, device):
    import torch

    n = torch.cuda.device_count() + 1
    p = run(reproci, device, "embedding", extra=("--world-size", str(n)))
    assert p.returncode == 5, p.stdout + p.stderr
    assert f"--world-size {n} needs {n} GPUs, one per rank" in p.stderr


@pytest.mark.cuda_only
def test_two_ranks_over_nccl_pass_with_the_nccl_settings_recorded(reproci, device):
    import json

    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("DDP over NCCL needs two GPUs, one per rank")
    p = run(reproci, device, "conv", "embedding", extra=("--world-size", "2"))
    assert p.returncode == 0, p.stdout + p.stderr
    doc = reproci.latest()
    for name in ("conv", "embedding"):
        entry = model_entry(doc, name)
        assert entry["verdict"] == "NEW", entry["message"]
        assert len({entry["runs"][r]["final_sha256"] for r in "ABC"}) == 1
    rank1 = json.loads((reproci.cwd / "results" / doc["run_id"] / "conv" / "record-A.rank1.json").read_text())
    assert rank1["distributed"]["backend"] == "nccl" and rank1["distributed"]["nccl"]["version"]
    assert {"NCCL_ALGO", "NCCL_PROTO"} <= set(rank1["distributed"]["nccl"])


def test_forked_runs_initialise_cuda_after_the_fork_and_match_fresh_ones(reproci, reference, device):
    """The fork server never touches the device: each forked run makes its own CUDA context,
    and its hashes are a fresh interpreter's, bit for bit (conv: cuDNN convolutions). The
    forked runs are the reference run's."""
    forked, doc = reference
    assert forked.returncode == 0, forked.stdout + forked.stderr
    f = model_entry(doc, "conv")
    fresh = run(reproci, device, "conv", extra=("--no-fork-server",))
    assert fresh.returncode == 0, fresh.stdout + fresh.stderr
    n = model_entry(reproci.latest(), "conv")
    assert [r["launch"]["mode"] for r in f["runs"].values()] == ["forked"] * 3
    assert [r["launch"]["mode"] for r in n["runs"].values()] == ["fresh"] * 3
    assert f["final_sha256"] == n["final_sha256"]
