"""The image manifest: pinned versions, entries, resolving ``--image``, refusing a broken
manifest, which manifest is read by default, and ``reproci images``."""

from __future__ import annotations

from pathlib import Path

import pytest

from reproci import errors, images

from .helpers import ROOT

REQUIREMENTS = """\
# wheels of the image, hash-pinned
numpy==2.4.6 --hash=sha256:89cd  # numpy-2.4.6-cp311.whl
torch==2.13.0+cpu --hash=sha256:6746  # torch-2.13.0+cpu.whl

# dependencies of the lines above
Jinja2==3.1.6 --hash=sha256:85ec
nvidia_cudnn_cu12==9.1.0.70 ; sys_platform == "linux"
nvidia-nccl-cu12==2.21.5
filelock>=4.0
"""

MANIFEST = """\
version: 1
images:
  cpu-a:
    description: >-
      A CPU image
      on two lines.
    dockerfile: Dockerfile.cpu
    base: {image: "reproci/base:1", digest: null, recipe: docker/make-base.sh}
    python: "3.11"
    requirements: requirements/cpu-a.txt
    tag: reproci/cpu-a:1
  gpu-b:
    dockerfile: Dockerfile.cuda
    base: {image: "nvidia/cuda:12", digest: "sha256:00"}
    python: "3.12"
    requirements: requirements/gpu-b.txt
    gpu: true
    tag: reproci/gpu-b:2
"""


@pytest.fixture
def manifest(tmp_path: Path) -> Path:
    (tmp_path / "requirements").mkdir()
    (tmp_path / "requirements" / "cpu-a.txt").write_text(REQUIREMENTS)
    path = tmp_path / "manifest.yaml"
    path.write_text(MANIFEST)
    return path


def test_pins_are_every_exact_version_of_the_requirements_file(manifest: Path) -> None:
    entry = images.entries(manifest)["cpu-a"]
    assert entry.requirements == manifest.parent / "requirements" / "cpu-a.txt"
    assert entry.pins() == {"numpy": "2.4.6", "torch": "2.13.0+cpu", "jinja2": "3.1.6",
                            "nvidia-cudnn-cu12": "9.1.0.70", "nvidia-nccl-cu12": "2.21.5"}  # not filelock>=


def test_key_packages_are_the_toolchain_versions_under_short_names(manifest: Path) -> None:
    entry = images.entries(manifest)["cpu-a"]
    assert entry.key_packages() == {"torch": "2.13.0+cpu", "numpy": "2.4.6", "cudnn": "9.1.0.70", "nccl": "2.21.5"}
    missing = images.entries(manifest)["gpu-b"]  # its requirements file is not there
    assert missing.pins() == {} and missing.key_packages() == {}


def test_entries_are_the_manifest_images_in_order_with_their_fields(manifest: Path) -> None:
    known = images.entries(manifest)
    assert list(known) == ["cpu-a", "gpu-b"]
    cpu, gpu = known["cpu-a"], known["gpu-b"]
    assert (cpu.tag, cpu.gpu, cpu.python, cpu.description) == ("reproci/cpu-a:1", False, "3.11",
                                                               "A CPU image on two lines.")
    assert (cpu.base_image, cpu.base_digest, cpu.base_recipe) == ("reproci/base:1", None, "docker/make-base.sh")
    assert (gpu.tag, gpu.gpu, gpu.base_digest, gpu.base_recipe, gpu.description) == (
        "reproci/gpu-b:2", True, "sha256:00", None, "")


def test_a_name_resolves_to_its_tag_and_a_tag_to_the_same_entry(manifest: Path) -> None:
    tag, entry = images.resolve("gpu-b", manifest)
    assert tag == "reproci/gpu-b:2" and entry is not None and entry.name == "gpu-b" and entry.gpu
    assert images.resolve("reproci/gpu-b:2", manifest) == (tag, entry)


def test_an_unknown_reference_is_used_as_given_without_an_entry(manifest: Path, tmp_path: Path) -> None:
    assert images.resolve("nvcr.io/nvidia/pytorch:24.05-py3", manifest) == ("nvcr.io/nvidia/pytorch:24.05-py3", None)
    assert images.resolve("reproci/gpu-b:1", manifest) == ("reproci/gpu-b:1", None)  # another tag of that repo
    assert images.resolve("gpu-b", tmp_path / "none.yaml") == ("gpu-b", None)  # no manifest: names nothing


def test_the_project_manifest_names_the_test_image() -> None:
    tag, entry = images.resolve("cpu-torch2.13", ROOT / "docker" / "manifest.yaml")
    assert tag == "reproci/cpu-torch2.13:1" and entry is not None and entry.gpu is False
    assert entry.key_packages()["torch"] == "2.13.0+cpu"
    assert any(e.gpu for e in images.entries(ROOT / "docker" / "manifest.yaml").values())


@pytest.mark.parametrize("text, fragment", [
    ("version: 1\nimages:\n\tcpu-a: {}\n", "manifest.yaml line 3: malformed YAML"),
    ("version: 2\nimages: {}\n", "manifest format version 2, this reproci reads 1"),
    ("version: 1\n", "expected a mapping with an `images:` mapping"),
    ("version: 1\nimages:\n  cpu-a: reproci/cpu-a:1\n", "image 'cpu-a' must be a mapping"),
    ("version: 1\nimages:\n  cpu-a: {base: {image: b:1}, requirements: r.txt}\n", "image 'cpu-a' lacks the field 'tag'"),
    ("version: 1\nimages:\n  cpu-a: {tag: a:1, base: b:1, requirements: r.txt}\n", "`base:` must be a mapping"),
])
def test_a_malformed_manifest_is_a_one_line_config_error(tmp_path: Path, text: str, fragment: str) -> None:
    path = tmp_path / "manifest.yaml"
    path.write_text(text)
    with pytest.raises(errors.ConfigError) as e:
        images.resolve("cpu-a", path)
    assert fragment in str(e.value) and str(path) in str(e.value)
    assert "\n" not in str(e.value) and e.value.return_code == errors.EXIT_USAGE


def test_the_default_manifest_is_the_working_directorys_else_the_one_beside_the_code(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert images.default_manifest().resolve() == ROOT / "docker" / "manifest.yaml"
    assert images.resolve("cpu-torch2.13")[0] == "reproci/cpu-torch2.13:1"
    (tmp_path / "docker").mkdir()
    (tmp_path / "docker" / "manifest.yaml").write_text(MANIFEST)
    assert images.default_manifest().resolve() == tmp_path / "docker" / "manifest.yaml"
    assert images.resolve("gpu-b")[0] == "reproci/gpu-b:2" and images.resolve("cpu-torch2.13")[1] is None


def test_images_list_shows_every_image_and_says_when_the_engine_is_not_there(
        cli, manifest: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent.sock")
    code, out, err = cli("images", "list", "--manifest", str(manifest))
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split() == ["name", "reference", "digest"]
    assert lines[1].split() == ["cpu-a", "reproci/cpu-a:1", "?"]
    assert lines[2].strip().split(", ") == ["python 3.11", "torch 2.13.0+cpu", "numpy 2.4.6", "cudnn 9.1.0.70",
                                    "nccl 2.21.5"]
    assert lines[3].split() == ["gpu-b", "reproci/gpu-b:2", "?", "(GPU)"]
    assert "note: digests unknown: cannot reach the Docker engine at unix:///nonexistent.sock" in err


def test_images_never_built_are_listed_as_not_built() -> None:
    rows = [{"name": "a", "reference": "r/a:1", "gpu": False, "python": "3.11", "packages": {}, "digest": None},
            {"name": "bb", "reference": "r/bb:1", "gpu": True, "python": "3.12", "packages": {"torch": "2.7.1"},
             "digest": "sha256:" + "e" * 64}]
    assert images.listing_lines(rows, engine_down=False) == [
        "name  reference  digest",
        "a     r/a:1      not built",
        "      python 3.11",
        "bb    r/bb:1     sha256:eeeeeeeeeeee  (GPU)",
        "      python 3.12, torch 2.7.1",
    ]


def test_building_an_unknown_image_is_a_usage_error(cli) -> None:
    code, _, err = cli("images", "build", "no-such-image", "--manifest", str(ROOT / "docker" / "manifest.yaml"))
    assert code == errors.EXIT_USAGE
    assert "no image no-such-image" in err and "cpu-torch2.13" in err
