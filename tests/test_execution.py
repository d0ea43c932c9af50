"""torch.compile and autocast as checked configurations (``reproci/worker/execution.py``):
the transformer and a plugin compiled, the reference models under autocast, the settings
recorded, a compiled golden compared only with compiled runs, a warm-cache run with a cold one.
Inductor compiles with the host's C++ compiler here (CPU)."""

from __future__ import annotations

import json

from reproci import verdicts
from reproci.golden.drift import execution_change
from reproci.stages.determinism import _decide
from reproci.stages.determinism.explain import describe
from reproci.worker.run_record import RunRecord
from tests.helpers import PLUGINS, model_entry, run_record

CULPRITS = f"{PLUGINS / 'culprits.py'}"


def _record(reproci, entry: dict, role: str) -> dict:
    run_dir = reproci.cwd / "results" / reproci.latest()["run_id"]
    return json.loads((run_dir / entry["records"][role]).read_text())


def test_a_compiled_golden_records_its_settings_and_caches_and_is_compared_only_with_compiled_runs(reproci, tmp_path):
    """One compiled golden update of the smallest model that shows every behaviour here (the
    reference models compile through the same harness path; benchmarks/compile_cost.py compiles
    them). It records inductor's settings, W (A again, on A's warm caches) equals A (compiled
    cold: coldness is the point, so A and B compile cold), and every cache stays in the run's own directory:
    torch puts inductor's precompiled headers in /tmp/torchinductor_<user> whatever
    TORCHINDUCTOR_CACHE_DIR says, and a run moves them into its own cache, deleted with it. The
    golden then refuses an eager run (re-record, not an alert) and matches a compiled one."""
    tiny, short = f"{CULPRITS}:tiny", ("--steps", "4", "--resume-at", "2")
    tmp = tmp_path / "tmpdir"
    tmp.mkdir()
    r = reproci("golden", "update", "-m", tiny, "--compile", *short, env={"TMPDIR": str(tmp)})
    assert r.returncode == 0, r.stdout + r.stderr
    doc = reproci.latest()
    assert [m["model"] for m in doc["models"]] == ["culprits.tiny"]
    for entry in doc["models"]:
        assert entry["verdict"] == verdicts.NEW and set(entry["runs"]) == {"A", "B", "C", "W"}, entry["message"]
        compiled = entry["execution"]["compile"]
        assert compiled["source"] == "harness" and compiled["backend"] == "inductor"
        assert compiled["inductor"]["deterministic"] is True  # strict mode sets it where torch has it
        assert "W, on A's warm inductor caches, = A, compiled cold" in entry["message"]
        a, w = _record(reproci, entry, "A"), _record(reproci, entry, "W")
        assert a["compile_cache"]["warm"] is False and w["compile_cache"] == {**a["compile_cache"], "warm": True}
        assert a["compile_cache"]["precompiled_headers"] is True
        assert a["compile_attestation"] == {"deterministic": True, "ok": True}
        assert not any("_orig_mod" in n for n in a["tensor_names"])  # the model's own names
    assert doc["golden"]["updated"] is True and "--compile" in doc["golden"]["update_command"]
    assert not [p for p in tmp.rglob("*") if p.is_file()], sorted(tmp.rglob("*"))  # nothing left in the temp dir
    assert not list((reproci.cwd / "results").glob("*/*/inductor-cache-*"))  # compiled code is not kept

    r = reproci("run", "-m", tiny, *short)
    assert r.returncode == 0, r.stdout + r.stderr  # MODEL_CHANGED: re-record, not an alert
    entry = model_entry(reproci.latest(), "culprits.tiny")
    assert entry["verdict"] == verdicts.MODEL_CHANGED, entry["message"]
    assert ("the golden was recorded compiled (inductor, mode default), this run is eager fp32: compare compiled runs "
            "only with compiled runs") in entry["message"]
    r = reproci("run", "-m", tiny, *short, "--compile")
    assert r.returncode == 0 and model_entry(reproci.latest(), "culprits.tiny")["verdict"] == verdicts.PASS


def test_the_reference_models_and_a_plugin_pass_under_bf16_autocast(reproci) -> None:
    models = ("conv", "transformer", "embedding", f"{CULPRITS}:tiny")
    r = reproci("run", *[a for m in models for a in ("-m", m)], "--amp", "bf16", "--steps", "6")
    assert r.returncode == 0, r.stdout + r.stderr
    for entry in reproci.latest()["models"]:
        assert entry["verdict"] == verdicts.NEW and entry["execution"] == {"compile": None, "amp": "bf16"}


def test_fp16_steps_carry_a_grad_scaler_whose_state_is_checkpointed_and_compared(reproci) -> None:
    """The harness gives any model without a scaler of its own one: the smallest model shows it
    (fp16 convolutions on a CPU take seconds a step). Its scale backs off at step 2 here and C
    resumes at step 3: C's scaler state equals A's only where the checkpoint carried it."""
    r = reproci("run", "-m", f"{CULPRITS}:tiny", "--amp", "fp16", "--steps", "6")
    assert r.returncode == 0, r.stdout + r.stderr
    entry = model_entry(reproci.latest(), "culprits.tiny")
    assert entry["verdict"] == verdicts.NEW and entry["execution"] == {"compile": None, "amp": "fp16"}, entry["message"]
    a, c = _record(reproci, entry, "A"), _record(reproci, entry, "C")
    assert a["scaler_state"] is not None and a["scaler_state"] == c["scaler_state"]
    assert "scale" in a["scaler_state"]


def test_a_plugin_that_compiles_its_own_model_is_recognised(reproci) -> None:
    r = reproci("run", "-m", f"{CULPRITS}:self_compiled", "--steps", "4")
    assert r.returncode == 0, r.stdout + r.stderr
    entry = model_entry(reproci.latest(), "culprits.self_compiled")
    assert entry["execution"]["compile"]["source"] == "plugin" and "W" in entry["runs"]
    assert not any("_orig_mod" in n for n in _record(reproci, entry, "A")["tensor_names"])


def test_a_warm_cache_run_that_differs_from_the_cold_one_is_cache_dependent_compilation() -> None:
    def rec(fp: int) -> RunRecord:
        return run_record(tensor_names=["param:w"], fingerprints=[[fp]], start_step=0, batch_fingerprints=[0],
                          losses=[1.0], final_sha256=str(fp), tensor_sha256={})

    verdict, pair, div = _decide({"A": rec(1), "B": rec(1), "C": rec(2), "W": rec(3)})
    assert verdict == verdicts.NONDETERMINISTIC and pair == ("A", "W")  # before the resume check: C reuses A's cache
    assert describe(verdict, div, pair).startswith(
        "cache-dependent compilation: A (cold inductor caches) ≠ W (A again, on A's warm caches) from step 1")


def test_the_execution_change_is_said_both_ways() -> None:
    compiled = {"compile": {"source": "harness", "backend": "inductor", "mode": "max-autotune"}, "amp": None}
    assert execution_change(None, compiled).startswith(
        "the golden was recorded eager fp32, this run is compiled (inductor, mode max-autotune)")
    assert "this run is eager, bf16 autocast" in execution_change(compiled, {"compile": None, "amp": "bf16"})


def test_compile_options_are_checked(cli, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    code, _, err = cli("run", "--compile-mode", "max-autotune")
    assert code == 2 and "--compile-mode sets how torch.compile compiles: add --compile" in err
    (tmp_path / "reproci.yaml").write_text("compile: [conv, nosuch]\n")
    code, _, err = cli("run", "-m", "conv")
    assert code == 2 and "compile: nosuch is not among the models run (conv)" in err
    (tmp_path / "reproci.yaml").write_text("amp: fp8\n")
    code, _, err = cli("run", "-m", "conv")
    assert code == 2 and "amp: expected bf16 or fp16, got 'fp8'" in err


def test_a_compiled_cpu_run_without_a_cxx_compiler_is_an_infrastructure_error(reproci) -> None:
    r = reproci("run", "-m", f"{CULPRITS}:tiny", "--compile", "--steps", "3", env={"CXX": "no-such-c++"})
    assert r.returncode == 5
    assert ("error: torch.compile on the CPU needs a C++ compiler (inductor builds C++ kernels) and this environment "
            "has none (no-such-c++ not found): install one (g++) where the runs execute, or drop --compile") in r.stderr
    assert not list((reproci.cwd / "results").glob("2*"))  # nothing half-written


FP16_RANGE = f"{PLUGINS / 'fp16_range.py'}:overflowing"


def test_an_fp16_overflow_names_the_first_tensor_past_float16s_range_and_bf16_runs(reproci) -> None:
    """A model finite in float32 whose activations pass 65504: under fp16 the message names the
    tensor and float16's range, not a divergence; its twin run, under bf16, is reproducible."""
    r = reproci("run", "-m", FP16_RANGE, "--amp", "fp16", "--steps", "4")
    assert r.returncode == 4, r.stdout + r.stderr
    entry = model_entry(reproci.latest(), "fp16_range.overflowing")
    assert entry["error"]["kind"] == "non-finite" and "diverged" not in entry["message"]
    assert entry["message"].startswith("run A: the loss is nan from step 1: under --amp fp16 the output of `1` "
                                       "(Scale) is the first tensor that is not finite (-inf in float16, at most ")
    assert ("in float32): it overflowed float16's range (max 65504); use --amp bf16 (float32's range in 16 bits), or "
            "keep that module in float32") in entry["message"]
    r = reproci("run", "-m", FP16_RANGE, "--amp", "bf16", "--steps", "4")
    assert r.returncode == 0 and model_entry(reproci.latest(), "fp16_range.overflowing")["verdict"] == verdicts.NEW


def test_a_non_finite_run_under_fp16_points_at_float16s_range_when_no_tensor_is_found() -> None:
    """The message's other branches, on a model made non-finite by hand (in-process)."""
    import pytest
    import torch

    from reproci.worker.contract import TrainSetup
    from reproci.worker.finite import NonFiniteError, check_finite

    model = torch.nn.Linear(2, 1)
    setup = TrainSetup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), loader=[(torch.ones(1, 2),)],
                       loss_fn=lambda m, b: m(b[0]).sum())
    losses = [torch.tensor(1.0), torch.tensor(float("inf"))]
    with pytest.raises(NonFiniteError, match=r"^the loss is inf from step 2: the training diverged \(a learning rate"):
        check_finite(setup, losses, 0)
    with pytest.raises(NonFiniteError) as fp16:
        check_finite(setup, losses, 0, "fp16")
    assert ("the loss is inf from step 2: under --amp fp16 this is most often a value that overflowed float16's range "
            "(max 65504); if the model is finite without --amp, use --amp bf16; a run") in str(fp16.value)
    setup.scaler = torch.amp.GradScaler("cpu", enabled=False)
    with pytest.raises(NonFiniteError, match=r"use --amp bf16, or enable the plugin's GradScaler \(it is disabled\)"):
        check_finite(setup, losses, 0, "fp16")
