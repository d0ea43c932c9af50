"""The image manifest: pinned versions, entries, resolving ``--image``, refusing a broken
manifest, which manifest is read by default, a manifest of one's own laid over the shipped
one, and ``reproci images``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from reproci import __version__, errors, images, scaffold
from reproci.cluster import github_matrix

from .helpers import ROOT

SHIPPED = ROOT / "docker" / "manifest.yaml"  # what reproci ships, seen from a checkout
SHIPPED_NAMES = list(yaml.safe_load(SHIPPED.read_text())["images"])

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
shipped: false  # these two images alone
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
    laid_over = MANIFEST.replace("shipped: false  # these two images alone\n", "")
    (tmp_path / "docker" / "manifest.yaml").write_text(laid_over)
    assert images.default_manifest().resolve() == tmp_path / "docker" / "manifest.yaml"
    assert images.resolve("gpu-b")[0] == "reproci/gpu-b:2"
    assert images.resolve("cpu-torch2.13")[1] is not None  # laid over the shipped images
    (tmp_path / "docker" / "manifest.yaml").write_text(MANIFEST)
    assert images.resolve("gpu-b")[0] == "reproci/gpu-b:2" and images.resolve("cpu-torch2.13")[1] is None


def listed(cli, manifest: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], str]:
    """The lines and stderr of `reproci images list --manifest MANIFEST` with no engine to ask (exit 0)."""
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent.sock")
    code, out, err = cli("images", "list", "--manifest", str(manifest))
    assert code == 0, err
    return out.splitlines(), err


def test_images_list_shows_every_image_and_says_when_the_engine_is_not_there(
        cli, manifest: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lines, err = listed(cli, manifest, monkeypatch)
    assert lines[0].split() == ["name", "reference", "digest"]
    assert lines[1].split() == ["cpu-a", "reproci/cpu-a:1", "?"]
    assert lines[2].strip().split(", ") == ["python 3.11", "torch 2.13.0+cpu", "numpy 2.4.6", "cudnn 9.1.0.70",
                                    "nccl 2.21.5"]
    assert lines[3].split() == ["gpu-b", "reproci/gpu-b:2", "?", "(GPU)"]
    assert "note: digests unknown: cannot reach the Docker engine at unix:///nonexistent.sock" in err


@pytest.mark.parametrize("script, args", [("build-image.sh", ["cpu-torch2.13"]), ("make-base.sh", [])])
def test_the_shipped_scripts_say_what_a_user_can_do_when_the_engine_does_not_answer(script: str, args: list[str]) -> None:
    """`reproci images build` runs these scripts (shipped beside the code): their advice names
    no file of reproci's own development tree, only what a user can do."""
    if shutil.which("docker") is None:
        pytest.skip("no docker client: the scripts stop before they ask the engine")
    p = subprocess.run(["bash", str(ROOT / "reproci" / "_recipes" / "docker" / script), *args], capture_output=True,
                       text=True, timeout=60, env={**os.environ, "DOCKER_HOST": "unix:///nonexistent.sock"})
    assert p.returncode == 1 and "the Docker engine does not answer: start it" in p.stderr, p.stderr
    assert ".ci/" not in p.stderr


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


# A manifest of one's own, laid over the shipped one: one new image, one shipped NAME replaced.
OWN = """\
version: 1
images:
  my-cpu:
    dockerfile: Dockerfile.cpu
    base: {image: "reproci/base-bookworm:1", digest: null, recipe: docker/make-base.sh}
    python: "3.11"
    requirements: requirements/my-cpu.txt
    cpu_isa: avx2
    tag: my-org/my-cpu:1
  cuda12.4-torch2.5:
    dockerfile: Dockerfile.cuda
    base: {image: "nvidia/cuda:12.4.1-cudnn-runtime-ubuntu22.04", digest: "sha256:11"}
    python: "3.10"
    requirements: requirements/cuda12.4.txt
    tag: my-org/cuda12.4-torch2.5:7
"""


@pytest.fixture
def own(tmp_path: Path) -> Path:
    """``docker/manifest.yaml`` of a user's repository (``tmp_path``), with its own lock file."""
    (tmp_path / "docker" / "requirements").mkdir(parents=True)
    (tmp_path / "docker" / "requirements" / "my-cpu.txt").write_text(REQUIREMENTS.replace("2.13.0+cpu", "2.13.1+cpu"))
    path = tmp_path / "docker" / "manifest.yaml"
    path.write_text(OWN)
    return path


def test_a_manifest_of_ones_own_adds_images_after_the_shipped_ones_and_replaces_one_by_name(own: Path) -> None:
    known = images.entries(own)
    assert list(known) == SHIPPED_NAMES + ["my-cpu"]  # the replaced entry keeps its place
    replaced = known["cuda12.4-torch2.5"]
    assert (replaced.tag, replaced.base_digest, replaced.python, replaced.source) == (
        "my-org/cuda12.4-torch2.5:7", "sha256:11", "3.10", own)
    assert replaced.gpu is False  # the whole entry is replaced: the shipped `gpu: true` is not kept
    assert (known["my-cpu"].source, known["my-cpu"].cpu_isa) == (own, "avx2")
    assert known["cpu-torch2.13"].source == SHIPPED and known["cpu-torch2.13"].tag == "reproci/cpu-torch2.13:1"
    assert images.load_manifest(own)["cuda12.4-torch2.5"] == yaml.safe_load(OWN)["images"]["cuda12.4-torch2.5"]


def test_shipped_false_reads_a_manifest_of_ones_own_alone(own: Path) -> None:
    own.write_text(OWN.replace("version: 1\n", "version: 1\nshipped: false\n"))
    assert list(images.entries(own)) == ["my-cpu", "cuda12.4-torch2.5"]
    assert images.resolve("cpu-torch2.13", own) == ("cpu-torch2.13", None)
    own.write_text(OWN.replace("version: 1\n", "version: 1\nshipped: true\n"))
    assert list(images.entries(own)) == SHIPPED_NAMES + ["my-cpu"]


def test_requirements_are_read_beside_the_manifest_each_image_came_from(own: Path) -> None:
    known = images.entries(own)
    assert known["my-cpu"].requirements == own.parent / "requirements" / "my-cpu.txt"
    assert known["my-cpu"].key_packages()["torch"] == "2.13.1+cpu"
    assert known["cuda12.4-torch2.5"].requirements == own.parent / "requirements" / "cuda12.4.txt"
    shipped = known["cpu-torch2.13"]
    assert shipped.requirements == ROOT / "docker" / "requirements" / "cpu-torch2.13.txt"
    assert shipped.key_packages()["torch"] == "2.13.0+cpu"


def test_images_list_says_which_manifest_each_image_came_from(
        cli, own: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lines, _ = listed(cli, own, monkeypatch)
    assert [line.split()[0] for line in lines[1:-2:2]] == SHIPPED_NAMES + ["my-cpu"]
    assert "torch 2.13.1+cpu" in lines[-3]  # my-cpu's packages, from its own lock file
    still_shipped = [n for n in SHIPPED_NAMES if n != "cuda12.4-torch2.5"]
    assert lines[-2:] == [f"from {SHIPPED} (shipped with reproci {__version__}): {', '.join(still_shipped)}",
                          f"from {own}: cuda12.4-torch2.5, my-cpu"]


def test_matrix_run_and_init_see_an_image_a_manifest_of_ones_own_adds(
        cli, own: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, err = cli("matrix", "--manifest", str(own), "--image", "my-cpu", "--image", "cpu-torch2.13")
    assert code == 0, err
    assert [(r["image"], r["tag"]) for r in json.loads(out)["include"]] == [
        ("cpu-torch2.13", "reproci/cpu-torch2.13:1"), ("my-cpu", "my-org/my-cpu:1")]
    rows = {r["image"]: r for r in github_matrix.build(own)["include"]}
    assert list(rows) == SHIPPED_NAMES + ["my-cpu"] and rows["cuda12.4-torch2.5"]["device"] == "cpu"
    repo = own.parent.parent
    monkeypatch.chdir(repo)  # `reproci run --image my-cpu` in the repository: the default manifest
    tag, entry = images.resolve("my-cpu")
    assert tag == "my-org/my-cpu:1" and entry is not None and entry.cpu_isa == "avx2"
    assert images.resolve("reproci/cpu-torch2.13:1")[1] is not None
    for name in ("my-cpu", "cpu-torch2.13"):  # `reproci init --image NAME` accepts both
        scaffold.check(scaffold.InitOptions(directory=repo, image=name))
    with pytest.raises(errors.ConfigError, match="--image cpu-torch2.99 is not in"):
        scaffold.check(scaffold.InitOptions(directory=repo, image="cpu-torch2.99"))


def test_a_broken_manifest_of_ones_own_names_its_file_and_a_broken_shipped_one_names_that(
        own: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refusal() -> str:
        with pytest.raises(errors.ConfigError) as e:
            images.entries(own)
        assert "\n" not in str(e.value) and e.value.return_code == errors.EXIT_USAGE
        return str(e.value)

    own.write_text(OWN.replace("cpu_isa: avx2", "cpu_isa: sse9"))
    assert refusal().startswith(f"{own}: image 'my-cpu': cpu_isa 'sse9' is not one of")
    own.write_text(OWN.replace("version: 1\n", "version: 1\nshipped: maybe\n"))
    assert refusal().startswith(f"{own}: `shipped:` must be true")
    own.write_text(OWN)
    broken = tmp_path / "site" / "docker" / "manifest.yaml"
    broken.parent.mkdir(parents=True)
    broken.write_text("version: 1\nimages:\n  cpu-torch2.13: {tag: t:1, requirements: r.txt}\n")
    monkeypatch.setattr(images, "SHIPPED", broken)
    assert refusal().startswith(f"{broken}: image 'cpu-torch2.13' lacks the field 'base'")
    broken.write_text("version: 1\nimages: [a\n")
    assert refusal().startswith(f"{broken} line 3: malformed YAML")


def test_each_image_is_built_by_the_scripts_of_its_own_manifest(own: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[Path, list[str], str]] = []
    monkeypatch.setattr(images, "_script", lambda path, args, env, what: calls.append(
        (path, args, env["REPROCI_MANIFEST"])))
    assert images.build(("my-cpu", "cpu-torch2.13"), manifest=own) == ["my-org/my-cpu:1", "reproci/cpu-torch2.13:1"]
    shipped_script, base = ROOT / "docker" / "build-image.sh", ROOT / "docker" / "make-base.sh"
    assert calls == [(base, [], str(own)), (shipped_script, ["my-cpu"], str(own)),  # none beside it: reproci's
                     (base, [], str(SHIPPED)), (shipped_script, ["cpu-torch2.13"], str(SHIPPED))]
    (own.parent / "build-image.sh").write_text("exit 0\n")
    calls.clear()
    images.build(("my-cpu",), manifest=own, force=True)
    assert calls[-1] == (own.parent / "build-image.sh", ["my-cpu", "--force"], str(own))


def test_build_image_sh_reads_the_manifest_reproci_manifest_names(own: Path) -> None:
    def tag(name: str, **env: str) -> str:
        out = subprocess.run(["bash", str(ROOT / "docker" / "build-image.sh"), name, "--print-tag"],
                             env={**os.environ, "PYTHON": sys.executable, **env},
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return out.stdout.strip()

    assert tag("my-cpu", REPROCI_MANIFEST=str(own)) == "my-org/my-cpu:1"
    assert tag("cpu-torch2.13") == "reproci/cpu-torch2.13:1"  # unset: the manifest beside the script


def _docker(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=120)


@pytest.mark.docker
@pytest.mark.slow
def test_an_image_of_ones_own_builds_from_the_shipped_recipe_and_is_listed_with_its_manifest(tmp_path: Path) -> None:
    """``my-cpu``: the shipped CPU entry under another name and tag, with a copy of its lock file
    beside the user's manifest; the Dockerfile and scripts are reproci's."""
    base = "reproci/base-bookworm:1"
    if shutil.which("docker") is None or _docker("image", "inspect", base).returncode != 0:
        problem = f"no Docker engine with the image {base}: run `bash .ci/docker-setup.sh`"
        if os.environ.get("REPROCI_REQUIRE_DOCKER") == "1":
            pytest.fail(f"REPROCI_REQUIRE_DOCKER=1 but {problem}")
        pytest.skip(problem)
    repo = tmp_path / "repo"
    (repo / "docker" / "requirements").mkdir(parents=True)
    shutil.copy(ROOT / "docker" / "requirements" / "cpu-torch2.13.txt", repo / "docker" / "requirements" / "my-cpu.txt")
    entry = yaml.safe_load(SHIPPED.read_text())["images"]["cpu-torch2.13"]
    entry.update(description="The CPU toolchain under a name of the repository's own",
                 requirements="requirements/my-cpu.txt", tag="reproci-test/my-cpu:1")
    own = repo / "docker" / "manifest.yaml"
    own.write_text(yaml.safe_dump({"version": 1, "images": {"my-cpu": entry}}, sort_keys=False))
    reproci = Path(sys.executable).parent / "reproci"

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(reproci), *args, "--manifest", str(own)], cwd=repo, capture_output=True,
                              text=True, timeout=900)

    image_id = None
    try:
        built = run("images", "build", "my-cpu")
        found = _docker("image", "inspect", "--format", "{{.Id}}", "reproci-test/my-cpu:1")
        image_id = found.stdout.strip() if found.returncode == 0 else None
        assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
        assert built.stdout.splitlines()[-1] == "ready: reproci-test/my-cpu:1"
        assert "building reproci-test/my-cpu:1 from Dockerfile.cpu" in built.stdout
        assert (repo / ".cache" / "wheelhouse" / "my-cpu" / "requirements.txt").is_file()  # the repository's
        assert image_id and image_id != _docker("image", "inspect", "--format", "{{.Id}}",
                                                "reproci/cpu-torch2.13:1").stdout.strip()
        label = _docker("image", "inspect", "--format", '{{ index .Config.Labels "reproci.image.name" }}', image_id)
        assert label.stdout.strip() == "my-cpu"
        torch = _docker("run", "--rm", "--network", "none", image_id, "python", "-c",
                        "import torch; print(torch.__version__)")
        assert torch.stdout.strip() == "2.13.0+cpu", torch.stderr
        listed = run("images", "list")
        assert listed.returncode == 0, listed.stderr
        lines = listed.stdout.splitlines()
        row = next(line.split() for line in lines if line.startswith("my-cpu "))
        assert row[:2] == ["my-cpu", "reproci-test/my-cpu:1"] and row[2] == image_id[:19]
        assert lines[-1] == f"from {own}: my-cpu"
        assert lines[-2].startswith(f"from {SHIPPED} (shipped with reproci ") and "cpu-torch2.13" in lines[-2]
    finally:
        if image_id:
            _docker("image", "rm", "--force", image_id)
        shutil.rmtree(repo / ".cache", ignore_errors=True)


@pytest.mark.parametrize("under", ["file", "read-only"])
def test_a_cache_dir_that_cannot_hold_the_wheelhouse_is_one_line_naming_the_variable(
        own: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli, under: str) -> None:
    """REPROCI_CACHE_DIR under a file, or in a folder that cannot be written: `images build`
    says so before any build, naming the variable (it was build-image.sh's raw `mkdir` error)."""
    blocker = tmp_path / "blocker"
    if under == "file":
        blocker.write_text("")
    else:
        blocker.mkdir()
        monkeypatch.setattr(images.os, "access", lambda path, mode: Path(path) != blocker)  # root writes anywhere
    calls: list[str] = []
    monkeypatch.setattr(images, "_script", lambda path, args, env, what: calls.append(what))
    monkeypatch.setenv("REPROCI_CACHE_DIR", str(blocker / "cache"))
    code, _, err = cli("images", "build", "my-cpu", "--manifest", str(own))
    why = "is not a folder" if under == "file" else "cannot be written"
    assert code == errors.EXIT_USAGE and calls == [], err
    assert err == (f"error: the wheelhouse {blocker}/cache/wheelhouse (from REPROCI_CACHE_DIR={blocker}/cache) cannot "
                   f"be made: {blocker} {why}; set REPROCI_CACHE_DIR to a folder you can write")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blocker", "docker"]  # nothing made


def test_the_wheelhouse_is_the_user_s_cache_for_a_pip_install_and_beside_a_manifest_of_one_s_own(
        own: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pip install's shipped manifest lies in site-packages: its wheels (gigabytes) go to the
    user's cache (tests/test_wheel.py checks that from an installed wheel); a checkout's or a
    repository's stay in its .cache/wheelhouse; REPROCI_CACHE_DIR moves them all."""
    assert images.wheelhouse(own, env={}) is None and images.wheelhouse(SHIPPED, env={}) is None
    assert images.wheelhouse(own, env={"REPROCI_CACHE_DIR": str(tmp_path / "c")}) == tmp_path / "c" / "wheelhouse"
    inside = Path(images.__file__).resolve().parent / "_recipes_of_an_install" / "manifest.yaml"
    assert images.wheelhouse(inside, env={"XDG_CACHE_HOME": str(tmp_path / "x")}) == tmp_path / "x" / "reproci" / "wheelhouse"
    assert images.wheelhouse(inside, env={}) == Path.home() / ".cache" / "reproci" / "wheelhouse"

    calls: list[dict[str, str]] = []
    monkeypatch.setattr(images, "_script", lambda path, args, env, what: calls.append(env))
    monkeypatch.setenv("REPROCI_CACHE_DIR", str(tmp_path / "c"))
    images.build(("my-cpu",), manifest=own)
    assert calls and all(env["REPROCI_WHEELHOUSE"] == str(tmp_path / "c" / "wheelhouse") for env in calls)
    out = subprocess.run(["bash", str(ROOT / "docker" / "build-image.sh"), "my-cpu", "--print-wheelhouse"],
                         env={**os.environ, "PYTHON": sys.executable, "REPROCI_MANIFEST": str(own), **calls[-1]},
                         capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == str(tmp_path / "c" / "wheelhouse" / "my-cpu"), out.stderr
