"""What several test modules share: the real CLI in a subprocess, real results files made
once per session, and the workflow files with a runner for their steps."""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline import verdicts

ROOT = Path(__file__).resolve().parents[1]
PLUGINS = ROOT / "tests" / "plugins"
WORKFLOWS = ROOT / ".github" / "workflows"
FILES = {name: WORKFLOWS / f"{name}.yml" for name in ("reproci", "golden-update", "ci")}


class Cli:
    """Drives the real ``reproci`` command in a subprocess, in a scratch directory."""

    def __init__(self, cwd: Path) -> None:
        self.cwd = cwd

    def __call__(self, *args: str, env: dict[str, str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        full_env = {k: v for k, v in os.environ.items() if k not in ("GITHUB_STEP_SUMMARY", "GITHUB_ACTIONS")}
        full_env.update({"CI": "", "PYTHONPATH": str(ROOT), "COLUMNS": "200", **(env or {})})
        return subprocess.run([sys.executable, "-m", "pipeline.cli", *args], cwd=self.cwd, env=full_env,
                              capture_output=True, text=True, timeout=timeout)

    def latest(self) -> dict:
        return json.loads((self.cwd / "results" / "latest.json").read_text())


def said(stderr: str) -> list[str]:
    """What reproci said on stderr, its progress lines (``[  12.3 s] conv: run A ...``) aside."""
    return [line for line in stderr.strip().splitlines() if not re.match(r"^\[\s*\d+\.\d s\] ", line)]


def model_entry(doc: dict, name: str) -> dict:
    return next(m for m in doc["models"] if m["model"] == name)


def interruptible() -> None:
    """``preexec_fn`` for a CLI that a test will interrupt: Ctrl-C as at a terminal, even when
    the test run itself was started in the background (which ignores SIGINT, and children
    inherit that)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


# --- real results files ---

RUN = ("run", "-m", "embedding", "--steps", "8", "--resume-at", "4", "--image-name", "cpu-torch2.13")
_CACHE: dict[str, dict[str, Path]] = {}


def real_results(factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Real results files, made once per test session (shared with tests/test_prbody.py).

    recorded: a run that recorded the golden (--update-golden); compared: a later run of the
    same image compared against that golden; drifted / failed: copies edited to stand for a
    CUDA image whose golden changed and one whose runs disagreed.
    """
    if "files" in _CACHE:
        return _CACHE["files"]
    work = factory.mktemp("real-results")
    cli = Cli(work)
    first = cli(*RUN, "--results-dir", "recorded", "--goldens-dir", "goldens", "--update-golden")
    assert first.returncode == 0, first.stderr
    second = cli(*RUN, "--results-dir", "compared", "--goldens-dir", "goldens")
    assert second.returncode == 0, second.stderr
    recorded = next((work / "recorded").glob("*/results.json"))
    compared = next((work / "compared").glob("*/results.json"))
    base = json.loads(compared.read_text())

    drifted = edit(base, image={"name": "cuda12.6-torch2.7", "reference": "reproci/cuda12.6-torch2.7:1",
                                "digest": "sha256:" + "b" * 64, "backend": "docker"})
    model = drifted["models"][0]
    model["verdict"] = verdicts.UPGRADE_CHANGED
    model["message"] = "runs agree, golden differs: torch 2.7.0 -> 2.7.1"
    model["golden"] = {
        "verdict": verdicts.UPGRADE_CHANGED, "message": "final hash differs from the golden; torch changed",
        "file": "goldens/cuda12.6-torch2.7.yaml", "golden_final_sha256": "c" * 64,
        "golden_image": {"name": "cuda12.6-torch2.7", "reference": "reproci/cuda12.6-torch2.7:0",
                         "digest": "sha256:" + "a" * 64},
        "package_diff": {"torch": ["2.7.0", "2.7.1"], "nvidia-cudnn-cu12": ["9.5.1.17", "9.7.0.66"],
                         "triton": [None, "3.3.1"]},
        "env_diff": {"gpu.driver": ["550.54", "570.86"]},
        "evidence": {"step": 3, "tensor": "param:tables.0.weight", "kind": "param", "max_abs": 2.384e-07,
                     "max_ulp": 2, "losses_agree_digits": 6},
    }
    model["throughput"] = {
        "modes": {"strict": {"steps_per_s": 41.5}, "default": {"steps_per_s": 51.2}},
        "slowdown": {"median": 1.234, "ci_low": 1.2, "ci_high": 1.26, "noisy": False},
        "top_ops": [{"op": "aten::index_add_", "strict_ms": 3.1, "default_ms": 1.2, "share": 0.61}],
    }
    summarise(drifted)

    failed = edit(base, image={"name": "cuda12.4-torch2.5", "reference": "reproci/cuda12.4-torch2.5:1",
                               "digest": "sha256:" + "d" * 64, "backend": "docker"})
    model = failed["models"][0]
    model["verdict"] = verdicts.NONDETERMINISTIC
    model["message"] = "A ≠ B from step 2, first at grad:mlp.0.weight\nmax |Δ| 1.19e-07: 100% sure"
    model["evidence"] = {"comparison": "A vs B", "step": 2, "tensor": "grad:mlp.0.weight", "kind": "grad",
                         "cause": "compute", "max_abs": 1.19e-07, "max_ulp": 1}
    model["runs"]["B"]["final_sha256"] = "e" * 64
    model.pop("golden", None)
    summarise(failed)

    files = {"recorded": recorded, "compared": compared,
             "drifted": write_shard(work / "edited", "cuda12.6-torch2.7", drifted),
             "failed": write_shard(work / "edited", "cuda12.4-torch2.5", failed)}
    _CACHE["files"] = files
    return files


def edit(doc: dict[str, Any], **changes: Any) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    out.update(changes)
    out["run_id"] = f"{out['run_id']}-{changes.get('image', {}).get('name', 'edited')}"
    return out


def summarise(doc: dict[str, Any]) -> None:
    """Count an edited shard's verdicts. Its exit code is left out on purpose: ``merge``
    must compute it from the verdicts, as ``run`` did."""
    vs = [m["verdict"] for m in doc["models"]]
    doc["summary"] = {**doc["summary"], "verdicts": {v: vs.count(v) for v in sorted(set(vs))}, "exit_code": None}


def write_shard(root: Path, name: str, doc: dict[str, Any]) -> Path:
    path = root / name / doc["run_id"] / "results.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(doc, indent=2))
    return path


def artifact_layout(dest: Path, files: dict[str, Path], *names: str) -> Path:
    """Lay shards out as actions/download-artifact does: shards/<artifact>/<run_id>/results.json."""
    for name in names:
        src = files[name]
        doc = json.loads(src.read_text())
        target = dest / f"reproci-shard-{doc['image']['name']}" / src.parent.name
        shutil.copytree(src.parent, target)
        shutil.copy(src, target.parent / "latest.json")
    return dest


# --- workflows ---

def load(name: str) -> dict[str, Any]:
    return yaml.safe_load(FILES[name].read_text())


def triggers(doc: dict[str, Any]) -> dict[str, Any]:
    return doc.get("on", doc.get(True))  # PyYAML reads the bare key `on` as True


def steps(doc: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(job_id, step) for job_id, job in doc["jobs"].items() for step in job.get("steps", [])]


def step_named(doc: dict[str, Any], job: str, name: str) -> dict[str, Any]:
    return next(s for s in doc["jobs"][job]["steps"] if s.get("name") == name)


def run_step(step: dict[str, Any], env: dict[str, str], cwd: Path, bin_dir: Path,
             scratch: Path) -> tuple[subprocess.CompletedProcess[str], dict[str, str]]:
    """Run a step's script the way GitHub's bash shell does, in ``cwd``, with the runner's
    files ($GITHUB_OUTPUT, $RUNNER_TEMP, $HOME) in ``scratch``; return it and its outputs."""
    output = scratch / "github_output"
    output.write_text("")
    full_env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT), "HOME": str(scratch),
                "GITHUB_OUTPUT": str(output), "RUNNER_TEMP": str(scratch), "COLUMNS": "200", **env}
    out = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", step["run"]], cwd=cwd,
                         env=full_env, capture_output=True, text=True, timeout=300)
    values = dict(line.split("=", 1) for line in output.read_text().splitlines() if "=" in line)
    return out, values
