"""``reproci matrix``: the GitHub job matrix generated from the image manifest.

One test drives the installed command in a subprocess; the others call the same entry
point (``reproci.cli.main``, which maps errors to exit codes) in-process, to stay fast.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from reproci.cli import main
from tests.helpers import ROOT

MANIFEST = ROOT / "docker" / "manifest.yaml"

TWO_IMAGES = """\
version: 1
shipped: false  # these two alone, not laid over the shipped images
images:
  cpu-a:
    dockerfile: Dockerfile.cpu
    base: {image: base:1, digest: null}
    build_args: {}
    gpu: false
    tag: reproci/cpu-a:1
  gpu-b:
    dockerfile: Dockerfile.cuda
    base: {image: nvidia/cuda:12, digest: "sha256:00"}
    build_args: {}
    gpu: true
    tag: reproci/gpu-b:1
"""


@pytest.fixture
def manifest(tmp_path: Path) -> Path:
    path = tmp_path / "manifest.yaml"
    path.write_text(TWO_IMAGES)
    return path


class Result:
    def __init__(self, returncode: int, stdout: str, stderr: str) -> None:
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]):
    def call(*args: str) -> Result:
        code = main(list(args))
        captured = capsys.readouterr()
        return Result(code, captured.out, " ".join(captured.err.split()))  # rich wraps long lines
    return call


def matrix_of(cli, *args: str) -> dict:
    out = cli("matrix", *args)
    assert out.returncode == 0, out.stderr
    assert len(out.stdout.strip().splitlines()) == 1, "one line, so a workflow can write it to $GITHUB_OUTPUT"
    return json.loads(out.stdout)


def test_project_manifest_gives_one_job_per_image_in_manifest_order(reproci) -> None:
    images = yaml.safe_load(MANIFEST.read_text())["images"]
    out = reproci("matrix", "--manifest", str(MANIFEST))
    assert out.returncode == 0, out.stderr
    matrix = json.loads(out.stdout)
    assert [row["image"] for row in matrix["include"]] == list(images)
    for row in matrix["include"]:
        entry = images[row["image"]]
        assert row["tag"] == entry["tag"]
        on_gpu = bool(entry.get("gpu") or entry.get("cuda"))  # a CUDA-wheel image runs on the GPU runner too
        assert row["gpu"] is on_gpu
        assert row["device"] == ("cuda" if on_gpu else "cpu")
        assert row["runs_on"] == ["self-hosted", "linux", "x64", "gpu"]


def test_gpu_images_ask_for_the_gpu_and_the_full_profile(cli, manifest: Path) -> None:
    rows = {r["image"]: r for r in matrix_of(cli, "--manifest", str(manifest))["include"]}
    assert rows["gpu-b"] == {"image": "gpu-b", "tag": "reproci/gpu-b:1", "gpu": True, "device": "cuda",
                             "gpus": "all", "profile": "full", "world_size": 1, "runs_on": ["self-hosted", "linux", "x64", "gpu"]}
    assert rows["cpu-a"]["device"] == "cpu" and rows["cpu-a"]["gpus"] == "" and rows["cpu-a"]["profile"] == "quick"


def test_gpu_only_and_image_filters(cli, manifest: Path) -> None:
    assert [r["image"] for r in matrix_of(cli, "--manifest", str(manifest), "--gpu-only")["include"]] == ["gpu-b"]
    assert [r["image"] for r in matrix_of(cli, "--manifest", str(manifest), "--image", "cpu-a")["include"]] == ["cpu-a"]


def test_runner_labels_are_configurable(cli, manifest: Path) -> None:
    rows = matrix_of(cli, "--manifest", str(manifest), "--runner-labels", "self-hosted, linux,h100")["include"]
    assert {tuple(r["runs_on"]) for r in rows} == {("self-hosted", "linux", "h100")}


def test_runner_labels_as_a_json_array_as_a_workflow_passes_them(cli, manifest: Path) -> None:
    rows = matrix_of(cli, "--manifest", str(manifest), "--runner-labels", '["self-hosted", "linux", "h100"]')["include"]
    assert {tuple(r["runs_on"]) for r in rows} == {("self-hosted", "linux", "h100")}
    out = cli("matrix", "--manifest", str(manifest), "--runner-labels", '["self-hosted", "gpu"')
    assert out.returncode == 2 and "not a JSON array of labels" in out.stderr


def test_local_is_the_local_backend_with_its_settings_left_to_reproci_yaml(cli, manifest: Path) -> None:
    rows = matrix_of(cli, "--manifest", str(manifest), "--image", "local", "--image", "gpu-b")["include"]
    assert [r["image"] for r in rows] == ["local", "gpu-b"]
    assert rows[0] == {"image": "local", "tag": None, "gpu": False, "device": "", "gpus": "", "profile": "",
                       "world_size": None, "runs_on": ["self-hosted", "linux", "x64", "gpu"]}


def test_default_manifest_is_docker_manifest_yaml_under_the_working_directory(
        cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "docker").mkdir()
    (tmp_path / "docker" / "manifest.yaml").write_text(TWO_IMAGES)
    monkeypatch.chdir(tmp_path)
    assert len(matrix_of(cli)["include"]) == 2


def test_unknown_image_is_refused_with_the_known_names(cli, manifest: Path) -> None:
    out = cli("matrix", "--manifest", str(manifest), "--image", "cuda99")
    assert out.returncode == 2
    assert "cuda99" in out.stderr and "cpu-a" in out.stderr and "gpu-b" in out.stderr


def test_an_empty_matrix_is_refused(cli, tmp_path: Path) -> None:
    cpu_only = tmp_path / "cpu.yaml"
    cpu_only.write_text(TWO_IMAGES.split("  gpu-b:")[0])
    out = cli("matrix", "--manifest", str(cpu_only), "--gpu-only")
    assert out.returncode == 2
    assert "empty matrix" in out.stderr


@pytest.mark.parametrize("text, expect", [
    ("version: 2\nimages: {}\n", "version"),
    ("version: 1\n", "images"),
    ("version: 1\nimages: [a, b\n", "malformed YAML"),
])
def test_bad_manifests_are_refused(cli, tmp_path: Path, text: str, expect: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    out = cli("matrix", "--manifest", str(path))
    assert out.returncode == 2
    assert expect in out.stderr


def test_missing_manifest_is_refused(cli, tmp_path: Path) -> None:
    out = cli("matrix", "--manifest", str(tmp_path / "nope.yaml"))
    assert out.returncode == 2 and "does not exist" in out.stderr


def test_an_image_of_cuda_wheels_runs_on_the_gpu_runner_though_it_needs_no_gpu() -> None:
    from reproci.cluster import github_matrix

    row = github_matrix.entry("cuda13.0-torch2.14", {"tag": "t:1", "gpu": False, "cuda": True}, ("gpu",))
    assert (row["gpu"], row["device"], row["gpus"], row["profile"]) == (True, "cuda", "all", "full")
