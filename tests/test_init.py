"""``reproci init``: what it writes into a user's git repository, what it refuses, and that the
workflows it writes pass the three linters and call this repository's reusable workflows."""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import math
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from reproci import ModelContext, TrainSetup, __version__, atomic, errors, plugins, scaffold
from reproci.settings.config_file import load_config
from tests.helpers import ROOT, WORKFLOWS, triggers
from tests.workflow_helpers import actionlint, check_jsonschema, zizmor

WRITTEN = ["reproci.yaml", "reproci_{name}.py", "goldens/README.md", ".github/workflows/reproci.yml",
           ".github/workflows/golden-update.yml"]


def git_repo(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["git", "init", "-q", str(path)], check=True, timeout=30)
    return path


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh git repository named like a user's project, as the working directory."""
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))  # never the repository of a folder above
    path = git_repo(tmp_path / "Tiny-Net")
    monkeypatch.chdir(path)
    return path


def written(name: str = "tiny_net") -> list[str]:
    return [f.format(name=name) for f in WRITTEN]


def workflow(repo: Path, name: str) -> dict[str, Any]:
    return yaml.safe_load((repo / ".github" / "workflows" / f"{name}.yml").read_text())


def next_commands(out: str) -> list[str]:
    return [line.strip() for line in out.split("\nNext", 1)[1].splitlines()[1:] if not line.strip().startswith("#")]


# --- what it writes, and what it prints ------------------------------------------------------

def test_init_writes_its_files_and_ends_with_the_next_three_commands(cli, repo: Path) -> None:
    code, out, err = cli("init")
    assert code == 0, err
    assert [line.split(" ", 1)[1] for line in out.splitlines() if line.startswith("wrote ")] == written()
    assert all((repo / f).is_file() for f in written())
    assert next_commands(out) == [
        "reproci run",
        "reproci golden update --image local -m reproci_tiny_net.py:build",  # as the first run's notice will say
        "git add .gitignore reproci.yaml goldens .github reproci_tiny_net.py && git commit -m \"Check the model's "
        "reproducibility with reproci\""]
    assert "reproci_tiny_net.py trains a stand-in model until you answer its TODO(reproci) questions" in out


def test_reproci_yaml_loads_with_reproci_s_own_loader_and_names_the_plugin(cli, repo: Path) -> None:
    assert cli("init")[0] == 0
    config, path = load_config(repo / "reproci.yaml", plugins.catalog())
    assert config == {"models": ["reproci_tiny_net.py:build"]}
    run = plugins.build_options({"config": path}, env={})  # what `reproci run` makes of it: the plugin, resolved and compiled
    assert [(m.name, m.source) for m in run.models] == [("reproci_tiny_net", repo / "reproci_tiny_net.py")]
    assert run.image is None and run.image_name == "local"


def test_an_image_goes_into_reproci_yaml_and_the_workflows(cli, repo: Path) -> None:
    code, out, err = cli("init", "--image", "cpu-torch2.13", "--runner-labels", "self-hosted, linux,cpu")
    assert code == 0, err
    assert load_config(repo / "reproci.yaml", plugins.catalog())[0]["image"] == "cpu-torch2.13"
    (job,) = workflow(repo, "reproci")["jobs"].values()
    assert job["with"]["images"] == "${{ inputs.images || 'cpu-torch2.13' }}"
    assert job["with"]["runner-labels"] == '["self-hosted", "linux", "cpu"]'
    assert triggers(workflow(repo, "golden-update"))["workflow_dispatch"]["inputs"]["image"]["default"] == "cpu-torch2.13"
    assert next_commands(out)[:2] == ["reproci images build cpu-torch2.13 && reproci run",
                                      "reproci golden update --image cpu-torch2.13 -m reproci_tiny_net.py:build"]


def test_the_script_adapter_writes_a_script_entry_to_fill_in_and_no_plugin(cli, repo: Path) -> None:
    """--adapter script: reproci.yaml holds the two commands (TODO(reproci)), with every placeholder a
    command needs; no plugin file; the next commands need no flags, the file has the script."""
    code, out, err = cli("init", "--adapter", "script")
    assert code == 0, err
    assert not (repo / "reproci_tiny_net.py").exists() and (repo / "goldens" / "README.md").is_file()
    text = (repo / "reproci.yaml").read_text()
    assert text.count("TODO(reproci)") == 2
    config, _ = load_config(repo / "reproci.yaml", plugins.catalog())
    assert {"{steps}", "{out}", "{resume_at}"} <= set(re.findall(r"\{\w+\}", config["script"]))
    assert "{out}" in config["resume_script"] and config["script_name"] == "tiny_net" and "models" not in config
    assert next_commands(out) == ["reproci run", "reproci golden update --image local",
                                  "git add .gitignore reproci.yaml goldens .github && git commit -m "
                                  "\"Check the training script's reproducibility with reproci\""]
    (repo / "train.py").write_text("print('stand-in')\n")  # the file the template's command names
    built = plugins.build_options({}, settings=plugins.read_settings({"config": repo / "reproci.yaml"}))
    assert [m.name for m in built.models] == ["tiny_net"] and built.models[0].script is not None


def test_from_a_subfolder_it_sets_up_the_repository_and_says_where_to_run_the_commands(
        cli, repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (repo / "src" / "pkg").mkdir(parents=True)
    monkeypatch.chdir(repo / "src" / "pkg")
    code, out, err = cli("init", "--model-name", "ranker")
    assert code == 0, err
    assert all((repo / f).is_file() for f in written("ranker")) and not (repo / "src" / "pkg" / "reproci.yaml").exists()
    assert "Next, from ../.. (" in out


def test_the_nightly_checks_the_branch_the_repository_works_on(cli, repo: Path) -> None:
    subprocess.run(["git", "checkout", "-q", "-b", "trunk"], cwd=repo, check=True, timeout=30)
    assert cli("init")[0] == 0
    assert triggers(workflow(repo, "reproci"))["push"]["branches"] == ["trunk"]


# --- what it refuses -------------------------------------------------------------------------

def test_existing_files_are_refused_and_nothing_is_written(cli, repo: Path) -> None:
    (repo / "reproci.yaml").write_text("models: [conv]\n")
    code, out, err = cli("init")
    assert code == errors.EXIT_USAGE
    assert "reproci.yaml already exists" in err and "nothing was written: --force overwrites them" in err
    assert (repo / "reproci.yaml").read_text() == "models: [conv]\n"
    assert not [f for f in written()[1:] if (repo / f).exists()] and not (repo / "goldens").exists()


@pytest.mark.parametrize("theirs", written()[1:])
def test_an_existing_plugin_workflow_or_goldens_readme_is_refused_and_kept(cli, repo: Path, theirs: str) -> None:
    """Not reproci.yaml alone: any file init would write that is already there (a plugin of
    theirs, a workflow of that name) is refused by name, kept as it was, and nothing is written."""
    mine = "# the user's own file\n"
    (repo / theirs).parent.mkdir(parents=True, exist_ok=True)
    (repo / theirs).write_text(mine)
    code, out, err = cli("init")
    assert code == errors.EXIT_USAGE, out
    assert f"{theirs} already exists" in err and "nothing was written: --force overwrites them" in err
    assert (repo / theirs).read_text() == mine
    assert [f for f in written() if (repo / f).exists()] == [theirs] and not (repo / ".gitignore").exists()


def test_force_overwrites_them(cli, repo: Path) -> None:
    (repo / "reproci.yaml").write_text("models: [conv]\n")
    code, out, err = cli("init", "--force")
    assert code == 0, err
    assert "overwrote reproci.yaml" in out and "wrote reproci_tiny_net.py" in out
    assert load_config(repo / "reproci.yaml", plugins.catalog())[0]["models"] == ["reproci_tiny_net.py:build"]


def test_outside_a_git_repository_it_says_to_run_git_init_first(cli, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    folder = tmp_path / "project"
    folder.mkdir()
    monkeypatch.chdir(folder)
    code, out, err = cli("init")
    assert code == errors.EXIT_USAGE and "is not in a git repository" in err and "run `git init` first" in err
    assert list(folder.iterdir()) == []


def test_dir_must_be_the_top_level_of_a_repository(cli, repo: Path) -> None:
    (repo / "sub").mkdir()
    code, _, err = cli("init", "--dir", str(repo / "sub"))
    assert code == errors.EXIT_USAGE and f"pass --dir {repo}" in err
    assert not (repo / "sub" / "reproci.yaml").exists() and not (repo / "reproci.yaml").exists()


@pytest.mark.parametrize("args, said", [
    (("--image", "no-such-image"), "--image no-such-image is not in"),
    (("--model-name", "my model"), "--model-name 'my model' is not an identifier; try my_model"),
    (("--runner-labels", "self-hosted,g'pu"), "--runner-labels: g'pu"),
])
def test_what_the_workflows_could_not_use_is_refused_before_anything_is_written(cli, repo: Path, args: tuple[str, ...],
                                                                               said: str) -> None:
    code, _, err = cli("init", *args)
    assert code == errors.EXIT_USAGE and said in err
    assert [p.name for p in repo.iterdir()] == [".git"]


def test_workflows_already_there_are_left_alone(cli, repo: Path) -> None:
    theirs = {"ci.yml": "name: ci\non: push\n", "lint.yaml": "name: lint\non: pull_request\n"}
    for name, text in theirs.items():
        (repo / ".github" / "workflows").mkdir(parents=True, exist_ok=True)
        (repo / ".github" / "workflows" / name).write_text(text)
    assert cli("init")[0] == 0
    assert {name: (repo / ".github" / "workflows" / name).read_text() for name in theirs} == theirs
    assert sorted(p.name for p in (repo / ".github" / "workflows").iterdir()) == [
        "ci.yml", "golden-update.yml", "lint.yaml", "reproci.yml"]


def test_a_write_that_fails_leaves_none_of_the_new_files(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    opts = scaffold.InitOptions(directory=repo, model_name="tiny_net")
    real, calls = atomic.write_text, []

    def full_disk(path: Path, text: str, **kwargs: Any) -> None:
        calls.append(path)
        if len(calls) == 3:
            raise errors.InfrastructureError(f"disk full while writing {path}; free space and run again")
        real(path, text, **kwargs)

    monkeypatch.setattr(atomic, "write_text", full_disk)
    with pytest.raises(errors.InfrastructureError):
        scaffold.write(opts, scaffold.files(opts))
    assert len(calls) == 3 and not [f for f in written() if (repo / f).exists()]


@pytest.mark.parametrize("fault", [".github is a file", "the repository is read-only"])
def test_a_place_init_cannot_write_is_one_line_exit_2_and_nothing_is_created(cli, repo: Path, fault: str) -> None:
    from tests.test_outputs import read_only

    if fault == ".github is a file":
        (repo / ".github").write_text("not a folder\n")
    before = sorted(p.name for p in repo.iterdir())
    with read_only(repo) if fault == "the repository is read-only" else contextlib.nullcontext():
        code, out, err = cli("init")
    assert code == errors.EXIT_USAGE and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    said = {".github is a file": f"{repo / '.github'} is a file, not a folder",
            "the repository is read-only": f"{repo} is not writable here"}[fault]
    assert err.startswith("error: reproci init writes ") and said in err and "nothing was written" in err, err
    assert sorted(p.name for p in repo.iterdir()) == before  # no goldens/, no reproci.yaml: nothing


def test_git_ignores_the_results_and_the_golden_lock_and_the_printed_add_takes_what_belongs(cli, repo: Path) -> None:
    (repo / ".gitignore").write_text("*.pyc")  # the user's, without a final newline
    code, out, err = cli("init")
    assert code == 0, err
    assert "ignored /results/ in .gitignore" in out and "ignored .*.lock, .*.tmp in goldens/.gitignore" in out
    assert (repo / ".gitignore").read_text().startswith("*.pyc\n# reproci: ")  # kept, appended to
    assert cli("init", "--force")[0] == 0
    assert (repo / ".gitignore").read_text().count("/results/") == 1  # once, however often init runs
    for left in ("results/20260101-000000/results.json", "goldens/.local.lock", "goldens/.local.yaml.x1.tmp",
                 "goldens/local.yaml", "model.pyc"):
        (repo / left).parent.mkdir(parents=True, exist_ok=True)
        (repo / left).write_text("x\n")
    add = next_commands(out)[2].split(" && ")[0]
    subprocess.run(add, shell=True, cwd=repo, check=True, timeout=30)
    staged = subprocess.run(["git", "diff", "--cached", "--name-only"], cwd=repo, capture_output=True, text=True,
                            check=True, timeout=30).stdout.split()
    assert sorted(staged) == sorted([".gitignore", "goldens/.gitignore", "goldens/local.yaml", *written()])


def test_a_folder_name_becomes_a_model_name() -> None:
    assert [scaffold.identifier(t) for t in ("Tiny-Net", "my project 2", "2fast", "---", "ok_name")] == [
        "tiny_net", "my_project_2", "m_2fast", "model", "ok_name"]


# --- the workflows it writes -----------------------------------------------------------------

@pytest.fixture(params=["plain", "hf", "lightning"])
def adapter(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_the_workflows_pass_actionlint_the_workflow_schema_and_zizmor(cli, repo: Path, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Both kinds init writes (the local backend; an image), beside a workflow of the user's own."""
    (repo / ".github" / "workflows").mkdir(parents=True)
    (repo / ".github" / "workflows" / "theirs.yml").write_text("name: theirs\non: push\njobs:\n  x:\n    runs-on: "
                                                               "ubuntu-latest\n    steps:\n      - run: echo hi\n")
    assert cli("init")[0] == 0
    other = git_repo(tmp_path / "other")
    monkeypatch.chdir(other)
    assert cli("init", "--adapter", "hf", "--image", "cpu-torch2.13", "--runner-labels", "self-hosted,h100")[0] == 0
    ours = [r / ".github" / "workflows" / f for r in (repo, other) for f in ("reproci.yml", "golden-update.yml")]
    assert actionlint(*ours) == []
    out = check_jsonschema(*ours)
    assert out.returncode == 0, out.stdout + out.stderr
    assert [(f["ident"], f["determinations"]["severity"]) for f in zizmor(*ours)] == []


def test_the_workflows_call_reproci_s_reusable_ones_pinned_to_the_installed_release(cli, repo: Path,
                                                                                    adapter: str) -> None:
    """Each calls a workflow of this repository that takes calls, at the tag of this release,
    with inputs and secrets it declares; the runner installs the same release (with the
    adapter's extra)."""
    assert cli("init", "--adapter", adapter)[0] == 0
    extra = {"plain": "", "hf": "[hf]", "lightning": "[lightning]"}[adapter]
    for name, called in (("reproci", "reproci-check"), ("golden-update", "reproci-golden-update")):
        (job,) = workflow(repo, name)["jobs"].values()
        assert job["uses"] == f"{scaffold.REPOSITORY}/.github/workflows/{called}.yml@v{__version__}"
        declared = triggers(yaml.safe_load((WORKFLOWS / f"{called}.yml").read_text()))["workflow_call"]
        assert set(job["with"]) <= set(declared["inputs"]) and set(job["secrets"]) <= set(declared["secrets"])
        assert job["with"]["reproci-version"] == f"reproci{extra}=={__version__}"
        assert job["with"]["runner-labels"] == '["self-hosted", "linux", "x64", "gpu"]'
        assert job["with"].get("images", job["with"].get("image")) in ("${{ inputs.images || 'local' }}",
                                                                        "${{ inputs.image }}")
    text = (repo / ".github" / "workflows" / "reproci.yml").read_text()
    assert re.search(rf"uses: \S+@v{re.escape(__version__)} # zizmor: ignore\[unpinned-uses\]", text)  # a tag, said why
    for name in ("reproci", "golden-update"):  # and what to pin while no release has that tag
        text = " ".join((repo / ".github" / "workflows" / f"{name}.yml").read_text().replace("#", " ").split())
        assert f"Before reproci's first release the tag v{__version__} does not resolve" in text
        assert f"git+https://github.com/{scaffold.REPOSITORY}@SHA" in text


# --- the plugin it writes --------------------------------------------------------------------

LIBRARIES = {"plain": set(), "hf": {"transformers", "tokenizers"}, "lightning": {"pytorch_lightning"}}


def test_the_plugin_builds_a_working_model_and_marks_the_three_questions(cli, repo: Path, adapter: str) -> None:
    for library in LIBRARIES[adapter]:
        pytest.importorskip(library)
    assert cli("init", "--adapter", adapter)[0] == 0
    path = repo / "reproci_tiny_net.py"
    source = path.read_text()
    todos = re.findall(r"# TODO\(reproci\): (which [a-z ]+)\?", source)
    assert todos == ["which model", "which data", "which optimizer and schedule"], todos
    roots = {(n.module or "").split(".")[0] for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ImportFrom)}
    roots |= {a.name.split(".")[0] for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Import) for a in n.names}
    assert roots == {"__future__", "torch", "reproci"} | LIBRARIES[adapter] | ({"typing"} if adapter == "lightning" else set())
    spec = importlib.util.spec_from_file_location("reproci_tiny_net", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    setup = module.build(ModelContext(profile="quick", device=torch.device("cpu"), seed=0, steps=4))
    assert isinstance(setup, TrainSetup)
    loss = setup.loss_fn(setup.model, next(iter(setup.loader)))
    loss = loss.loss if hasattr(loss, "loss") else loss["loss"] if isinstance(loss, dict) else loss
    assert math.isfinite(float(loss.detach()))


@pytest.mark.slow
def test_init_then_the_first_run_is_new_the_printed_golden_update_records_it_and_ci_passes(reproci) -> None:
    """The whole flow of a new user, with the real CLI in a fresh repository: init, `reproci run`
    (NEW, and the notice names the command init printed), that command, `reproci run --ci` (PASS)."""
    git_repo(reproci.cwd)
    p = reproci("init", "--model-name", "tiny")
    assert p.returncode == 0, p.stderr
    first, update, _ = next_commands(p.stdout)
    short = ("--steps", "4", "--resume-at", "2")
    q = reproci(*first.split()[1:], *short)
    assert q.returncode == 0, q.stderr
    assert reproci.latest()["models"][0]["verdict"] == "NEW"
    assert f"Record with `{update} --steps 4 --resume-at 2`" in q.stderr
    assert reproci(*update.split()[1:], *short).returncode == 0
    r = reproci("run", "--ci", *short)
    assert r.returncode == 0, r.stderr
    assert [(m["model"], m["verdict"]) for m in reproci.latest()["models"]] == [("reproci_tiny", "PASS")]
    assert (reproci.cwd / "goldens" / "local.yaml").is_file()


def test_the_templates_are_package_data() -> None:
    """The wheel carries them (pyproject's package data), so init works from an install."""
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert '"templates/*.tmpl"' in pyproject
    assert {p.name for p in (ROOT / "reproci" / "templates").iterdir()} == {
        "plugin_plain.py.tmpl", "plugin_hf.py.tmpl", "plugin_lightning.py.tmpl", "reproci.yaml.tmpl",
        "goldens-README.md.tmpl", "reproci.yml.tmpl", "golden-update.yml.tmpl", "reproci_script.yaml.tmpl"}
