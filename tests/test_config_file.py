"""reproci.yaml found as git finds a repository: from a subfolder of a set-up repository every
command reads the repository's reproci.yaml, and its results and goldens are beside that file.

The refusals drive the real CLI in-process and train nothing; one real run (embedding, 4
steps) checks where its results go and what it says.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from reproci import errors
from reproci.settings.config_file import find_config


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A git repository with reproci.yaml at its top, the working directory a folder two below."""
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    top = tmp_path / "proj"
    (top / "src" / "deep").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(top)], check=True, timeout=30)
    monkeypatch.chdir(top / "src" / "deep")
    return top


def test_the_nearest_reproci_yaml_up_to_the_top_level_is_found(project: Path, tmp_path: Path) -> None:
    assert find_config() is None
    (project / "reproci.yaml").write_text("steps: 4\n")
    assert find_config() == Path("../../reproci.yaml")
    (project / "src" / "reproci.yaml").write_text("steps: 4\n")
    assert find_config() == Path("../reproci.yaml")  # the nearest
    assert find_config(project) == Path("reproci.yaml")
    for found in (project / "reproci.yaml", project / "src" / "reproci.yaml"):
        found.unlink()
    (tmp_path / "reproci.yaml").write_text("steps: 4\n")  # beyond GIT_CEILING_DIRECTORIES: never read
    assert find_config() is None


def test_above_the_top_level_nothing_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GIT_CEILING_DIRECTORIES", raising=False)
    (tmp_path / "reproci.yaml").write_text("steps: 4\n")
    inner = tmp_path / "repo" / "sub"
    inner.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(tmp_path / "repo")], check=True, timeout=30)
    assert find_config(inner) is None and find_config(tmp_path / "repo") is None


@pytest.mark.parametrize("verb", [("run",), ("golden", "update"), ("bisect",)])
def test_from_a_subfolder_the_repository_s_reproci_yaml_is_read(cli, project: Path, verb) -> None:
    (project / "reproci.yaml").write_text("models: [embedding]\nsteps: 1\n")
    code, out, err = cli(*verb)
    assert code == errors.EXIT_USAGE and err == "error: ../../reproci.yaml: steps must be at least 2 (got 1)", err
    assert sorted(p.name for p in project.rglob("*") if ".git" not in p.parts) == ["deep", "reproci.yaml", "src"]


def test_a_plugin_the_repository_s_reproci_yaml_names_is_the_file_beside_it(cli, project: Path) -> None:
    (project / "reproci.yaml").write_text("models: [plug.py:build]\n")
    (project / "plug.py").write_text("def build(:\n")  # a syntax error: refused before any run, naming the file
    code, out, err = cli("run")
    assert code == errors.EXIT_USAGE and err.startswith("error: ../../plug.py:1: SyntaxError"), err
    assert not (project / "results").exists() and not (project / "src" / "deep" / "results").exists()


def test_the_k8s_jobs_carry_the_repository_s_reproci_yaml_and_goldens_from_a_subfolder(cli, project: Path) -> None:
    (project / "reproci.yaml").write_text("models: [embedding]\nsteps: 6\n")
    (project / "goldens").mkdir()
    (project / "goldens" / "cpu-torch2.13.yaml").write_text("golden: of the repository\n")
    code, out, err = cli("matrix", "--format", "k8s", "--image", "cpu-torch2.13",
                         "--digest", f"cpu-torch2.13=registry.example.com/cpu@sha256:{'a' * 64}")
    assert code == 0, err
    assert "    steps: 6\n" in out and "    golden: of the repository\n" in out


@pytest.mark.slow  # a real run: embedding, 4 steps (about 5 s with the session's fork servers)
def test_a_run_from_a_subfolder_writes_beside_the_repository_s_reproci_yaml(cli, project: Path) -> None:
    (project / "reproci.yaml").write_text("models: [embedding]\nsteps: 4\nresume_at: 2\n")
    code, out, err = cli("run")
    assert code == 0, err
    assert err.startswith("using ../../reproci.yaml, found above the working directory: its folder holds the "
                          "results and goldens"), err
    assert [p.name for p in (project / "results").glob("*/results.json")] == ["results.json"]
    assert not (project / "src" / "deep" / "results").exists()
    assert "reproci golden update --image local -m embedding --steps 4 --resume-at 2 --goldens-dir ../../goldens" in err
