"""``reproci run --script``: a team's own training script, unchanged, checked by its own processes.

Each real script (nanoGPT-style, transformers.Trainer, accelerate, Lightning, a loop seeded from
the clock) gets the verdict its own resume deserves, and that verdict is proven by a plain
three-process check that knows nothing of reproci: the script run twice from scratch and once
resumed from a copy of the first run's output folder, their final states (each script saves
``final.pt``) compared bit for bit.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from reproci.worker.script import fill
from tests.helpers import ROOT, docker_client

SCRIPTS = ROOT / "tests" / "scripts"
PY = "python"

# name: (script, train command, resume command, N, k, what the script's own resume deserves)
CASES: dict[str, tuple[str, str, str, int, int, str]] = {
    "nanogpt": ("nanogpt_train.py", "{script} --max_iters={steps} --out_dir={out} --eval_interval={resume_at}",
                "{script} --max_iters={steps} --out_dir={out} --eval_interval={resume_at} --init_from=resume",
                6, 3, "RESUME_BROKEN"),
    "nanogpt_rng": ("nanogpt_train.py",
                    "{script} --max_iters={steps} --out_dir={out} --eval_interval={resume_at} --save_rng=True",
                    "{script} --max_iters={steps} --out_dir={out} --eval_interval={resume_at} --save_rng=True "
                    "--init_from=resume", 6, 3, "PASS"),
    "hf_trainer": ("hf_trainer_train.py", "{script} --output_dir {out} --max_steps {steps} --save_steps {resume_at}",
                   "{script} --output_dir {out} --max_steps {steps} --save_steps {resume_at} "
                   "--resume_from_checkpoint {out}/checkpoint-{resume_at}", 6, 3, "PASS"),
    "hf_trainer_seed_late": ("hf_trainer_train.py",
                             "{script} --output_dir {out} --max_steps {steps} --save_steps {resume_at} --seed_late",
                             "{script} --output_dir {out} --max_steps {steps} --save_steps {resume_at} --seed_late "
                             "--resume_from_checkpoint {out}/checkpoint-{resume_at}", 4, 2, "NONDETERMINISTIC"),
    "accelerate": ("accelerate_train.py", "{script} --out {out} --max_steps {steps} --save_every {resume_at}",
                   "{script} --out {out} --max_steps {steps} --save_every {resume_at} --resume", 5, 3, "PASS"),
    "accelerate_no_skip": ("accelerate_train.py", "{script} --out {out} --max_steps {steps} --save_every {resume_at}",
                           "{script} --out {out} --max_steps {steps} --save_every {resume_at} --resume --no_skip",
                           5, 3, "RESUME_BROKEN"),
    "lightning": ("lightning_train.py", "{script} --out {out} --max_steps {steps} --every {resume_at}",
                  "{script} --out {out} --max_steps {steps} --every {resume_at} --ckpt_path {out}/epoch=0-step={resume_at}.ckpt",
                  6, 3, "RESUME_BROKEN"),
    "clock": ("loop_train.py", "{script} {steps} {out} --clock", "{script} {steps} {out} --clock --resume", 4, 2,
              "NONDETERMINISTIC"),
}
NEEDS = {"hf_trainer": "transformers", "hf_trainer_seed_late": "transformers", "accelerate": "accelerate",
         "accelerate_no_skip": "accelerate", "lightning": "pytorch_lightning"}


def commands(case: str) -> tuple[str, str]:
    script, train, resume, *_ = CASES[case]
    where = f"{PY} {SCRIPTS / script}"
    return train.replace("{script}", where), resume.replace("{script}", where)


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    return a == b


def plain_check(case: str, work: Path) -> str:
    """The ground truth, without reproci: A and B from scratch, C resumed from a copy of A's folder."""
    train, resume = commands(case)
    *_, n, k, _ = CASES[case]
    env = {**os.environ, "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    env.pop("REPROCI_SCRIPT_SPEC", None)

    def run(command: str, out: Path) -> Any:
        words = fill(command, steps=n, resume_at=k, out=str(out)).split()
        subprocess.run([sys.executable, *words[1:]], check=True, cwd=work, env=env, capture_output=True)
        return torch.load(out / "final.pt", weights_only=False)

    finals = {}
    for role in "AB":
        (work / role).mkdir()
        finals[role] = run(train, work / role)
    if not _equal(finals["A"], finals["B"]):
        return "NONDETERMINISTIC"
    shutil.copytree(work / "A", work / "C")
    return "PASS" if _equal(finals["A"], run(resume, work / "C")) else "RESUME_BROKEN"


@pytest.mark.parametrize("case", list(CASES))
def test_a_real_script_unchanged_gets_the_verdict_its_own_resume_deserves(case: str, reproci, tmp_path: Path) -> None:
    if case in NEEDS:
        pytest.importorskip(NEEDS[case])
    *_, n, k, expected = CASES[case]
    (tmp_path / "plain").mkdir()
    truth = plain_check(case, tmp_path / "plain")
    assert truth == expected, f"the plain three-process check says {truth}"
    train, resume = commands(case)
    run = reproci("run", "--script", train, "--resume-script", resume, "--name", case, "--steps", str(n),
                  "--resume-at", str(k), timeout=300)
    entry = reproci.latest()["models"][0]
    verdict = "PASS" if entry["verdict"] == "NEW" and entry["message"].startswith("A = B = C") else entry["verdict"]
    assert verdict == expected, run.stdout + run.stderr
    assert run.returncode == {"PASS": 0, "RESUME_BROKEN": 1, "NONDETERMINISTIC": 1}[expected]
    if expected == "RESUME_BROKEN":  # the tensor and the cause named
        evidence = entry["evidence"]
        assert evidence["step"] == k + 1 and evidence["tensor"], evidence
        assert "different batch" in entry["message"], entry["message"]
        assert evidence["max_abs"] and "first differing op: aten::" in entry["message"], entry["message"]
    if expected == "NONDETERMINISTIC":  # B under other seeds than A: what the script leaves unseeded shows
        assert "not seeded" in entry["message"] and "run B drew its seeds from --seed + 1" in entry["message"]
    assert not list((tmp_path / "results").glob("*/*/out-*")), "the script's output folders are left behind"
    record_a = json.loads(next((tmp_path / "results").glob(f"*/{case}/record-A.json")).read_text())
    assert len(record_a["batch_fingerprints"]) == n and all(record_a["batch_fingerprints"]), \
        "a step without its batch (a step's forward inside its optimizer step, as Lightning's closure runs it)"


def test_a_golden_recorded_from_a_script_is_compared_like_a_factory_models(reproci, tmp_path: Path) -> None:
    """golden update records the script's hashes; the next run compares with them (PASS); the
    same script with another resume point is not the golden's run, and a changed script file is
    MODEL_CHANGED, never a silent pass."""
    shutil.copy(SCRIPTS / "loop_train.py", tmp_path / "train.py")
    args = ("--script", "python train.py {steps} {out}", "--resume-script", "python train.py {steps} {out} --resume",
            "--steps", "4", "--resume-at", "2")
    update = reproci("golden", "update", *args)
    assert update.returncode == 0, update.stderr
    assert (tmp_path / "goldens" / "local.yaml").is_file()
    run = reproci("run", *args, "--ci")
    assert run.returncode == 0, run.stdout + run.stderr
    assert reproci.latest()["models"][0]["verdict"] == "PASS"
    golden = tmp_path / "goldens" / "local.yaml"  # as if recorded in an image with another torch, other hashes
    header = "".join(line for line in golden.read_text().splitlines(True) if line.startswith("#"))
    data = yaml.safe_load(golden.read_text())
    data["packages"]["torch"] = data["environment"]["torch"] = "2.12.0+cpu"
    data["models"]["train"]["final_sha256"] = "0" * 64
    golden.write_text(header + yaml.safe_dump(data, sort_keys=False))
    upgraded = reproci("run", *args)
    entry = reproci.latest()["models"][0]
    assert upgraded.returncode == 3 and entry["verdict"] == "UPGRADE_CHANGED", upgraded.stdout
    assert "torch 2.12.0+cpu →" in entry["message"]
    (tmp_path / "train.py").write_text((tmp_path / "train.py").read_text().replace("lr=0.1", "lr=0.2"))
    changed = reproci("run", *args)
    assert reproci.latest()["models"][0]["verdict"] == "MODEL_CHANGED", changed.stdout


def test_strict_determinism_is_set_before_the_scripts_own_code_runs(reproci, tmp_path: Path) -> None:
    shutil.copy(SCRIPTS / "loop_train.py", tmp_path / "train.py")
    run = reproci("run", "--script", "python train.py {steps} {out}", "--resume-script",
                  "python train.py {steps} {out} --resume", "--steps", "4", "--resume-at", "2", "--seed", "7",
                  "--keep-checkpoints")
    assert run.returncode == 0, run.stdout + run.stderr
    for role, seeds in (("A", "7 7"), ("B", "7 8"), ("C", "7 7")):  # B's RNGs from --seed + 1, its hash seed kept
        assert next((tmp_path / "results").glob(f"*/train/out-{role}/controls.txt")).read_text() == f"True {seeds}"
    assert reproci.latest()["models"][0]["attestation"]["ok"] is True


def test_a_script_that_switches_a_control_off_is_named_at_file_and_line(reproci, tmp_path: Path) -> None:
    shutil.copy(SCRIPTS / "loop_train.py", tmp_path / "train.py")
    run = reproci("run", "--script", "python train.py {steps} {out} --fast-kernels", "--resume-script",
                  "python train.py {steps} {out} --resume --fast-kernels", "--steps", "4", "--resume-at", "2")
    entry = reproci.latest()["models"][0]
    assert run.returncode == 1 and entry["verdict"] == "NONDETERMINISTIC"
    line = next(i for i, text in enumerate((SCRIPTS / "loop_train.py").read_text().splitlines(), 1)
                if "use_deterministic_algorithms(False)" in text)
    assert f"deterministic_algorithms set to False at train.py:{line}" in entry["message"], entry["message"]


@pytest.mark.parametrize("flags, said", [
    (("--stop-at", "2"), "took 2 optimizer steps and ended, fewer than N = 4"),
    (("--crash",), "died with exit code 1: "),
    (("--no-train",), "ended without an optimizer step"),
])
def test_a_script_that_does_not_train_n_steps_is_an_error_that_says_why(flags, said, reproci) -> None:
    train = f"{PY} {SCRIPTS / 'loop_train.py'} {{steps}} {{out}} {' '.join(flags)}"
    run = reproci("run", "--script", train, "--resume-script", train + " --resume", "--steps", "4", "--resume-at", "2")
    assert run.returncode == 4
    entry = reproci.latest()["models"][0]
    assert entry["verdict"] == "ERROR" and said in entry["message"], entry["message"]
    if "--crash" in flags:
        assert "RuntimeError: the loss went the wrong way" in entry["message"]


def test_a_script_launched_by_torchrun_is_recorded_in_its_rank_0(reproci, tmp_path: Path) -> None:
    """torchrun starts the training process: the hooks load there too (the sitecustomize), only
    rank 0 records, and the launcher's own process, which never steps, leaves its record alone."""
    shutil.copy(SCRIPTS / "loop_train.py", tmp_path / "train.py")
    launch = "torchrun --standalone --nproc-per-node 1 train.py {steps} {out}"
    run = reproci("run", "--script", launch, "--resume-script", launch + " --resume", "--steps", "4", "--resume-at", "2",
                  "--name", "loop")
    entry = reproci.latest()["models"][0]
    assert run.returncode == 0 and entry["verdict"] == "NEW", entry["message"]
    assert entry["message"].startswith("A = B = C") and entry["runs"]["C"]["start_step"] == 2


def test_a_resume_command_that_starts_from_step_0_is_told_so(reproci) -> None:
    train = f"{PY} {SCRIPTS / 'loop_train.py'} {{steps}} {{out}}"
    run = reproci("run", "--script", train, "--resume-script", train, "--steps", "4", "--resume-at", "2")
    assert run.returncode == 4
    message = reproci.latest()["models"][0]["message"]
    assert "the resume command started from step 0, not from the checkpoint in {out}" in message


@pytest.mark.parametrize("args, said", [
    (("--script", "python t.py {stpes} {out}", "--resume-script", "python t.py {out}"),
     "--script: unknown placeholder {stpes}; the placeholders are {steps}, {resume_at}, {out}"),
    (("--script", "python t.py {steps}", "--resume-script", "python t.py {out}"), "--script has no {out}"),
    (("--script", "python t.py {out}", "--resume-script", "python t.py"), "--resume-script has no {out}"),
    (("--script", "python t.py {out}"), "--script needs --resume-script"),
    (("--resume-script", "python t.py {out}"), "--resume-script goes with --script"),
    (("--script", "python missing.py {out}", "--resume-script", "python missing.py {out}"),
     "--script: the script missing.py does not exist"),
    (("--script", "python t.py {out", "--resume-script", "python t.py {out}"), "cannot be read"),
    (("--script", "python t.py {out}", "--resume-script", "python t.py {out}", "--stage", "throughput"),
     "the throughput stage does not run a script model"),
    (("--script", "python t.py {out}", "--resume-script", "python t.py {out}", "--compile"),
     "--compile with --script: your script decides whether it compiles"),
    (("--script", "python t.py {out}", "--resume-script", "python t.py {out}", "--name", ".."), "cannot name a folder"),
])
def test_bad_script_input_is_one_line_and_exit_2(args, said, cli, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.py").write_text("print('never run')\n")
    code, out, err = cli("run", *args)
    assert code == 2 and said in err and err.count("error:") == 1, err
    assert not (tmp_path / "results").exists()


def test_reproci_yaml_declares_a_script_and_its_commands_run_beside_it(reproci, tmp_path: Path) -> None:
    """``script:`` in reproci.yaml, run from a folder below it: the commands run from the yaml's folder."""
    shutil.copy(SCRIPTS / "loop_train.py", tmp_path / "train.py")
    (tmp_path / "reproci.yaml").write_text("script: python train.py {steps} {out}\n"
                                           "resume_script: python train.py {steps} {out} --resume\n"
                                           "script_name: loop\nsteps: 4\nresume_at: 2\n")
    (tmp_path / "sub").mkdir()
    reproci.cwd = tmp_path / "sub"
    run = reproci("run")
    assert run.returncode == 0, run.stdout + run.stderr
    doc = reproci.latest() if (tmp_path / "sub" / "results").exists() else \
        __import__("json").loads((tmp_path / "results" / "latest.json").read_text())
    assert [m["model"] for m in doc["models"]] == ["loop"] and doc["models"][0]["verdict"] == "NEW"


@pytest.mark.docker
def test_a_script_gets_the_same_verdict_in_a_container_as_here(reproci, tmp_path: Path) -> None:
    """--image: the repository is mounted where the command runs; the image's python3 runs it."""
    docker_client("reproci/cpu-torch2.13:1").close()
    shutil.copy(SCRIPTS / "nanogpt_train.py", tmp_path / "train.py")
    train = "python train.py --max_iters={steps} --out_dir={out} --eval_interval={resume_at}"
    args = ("--script", train, "--resume-script", train + " --init_from=resume", "--steps", "6", "--resume-at", "3")
    here = reproci("run", *args)
    local = reproci.latest()["models"][0]
    there = reproci("run", *args, "--image", "cpu-torch2.13")
    inside = reproci.latest()["models"][0]
    assert here.returncode == there.returncode == 1, there.stdout + there.stderr
    assert local["verdict"] == inside["verdict"] == "RESUME_BROKEN"
    assert local["evidence"]["step"] == inside["evidence"]["step"] == 4
    assert local["evidence"]["tensor"] == inside["evidence"]["tensor"]
