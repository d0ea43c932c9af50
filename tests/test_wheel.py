"""The installed tool is the whole tool: the wheel carries the package ``reproci`` (the folder
``reproci/``, every subpackage of it), the image recipes, and ``reproci images list`` reads the
shipped manifest from any directory."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from reproci import __version__, images

from .helpers import ROOT, build_wheel

RECIPES = "reproci/_recipes/docker"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    """The wheel pip builds from a copy of the sources (the checkout is left as it is)."""
    return zipfile.ZipFile(build_wheel(tmp_path_factory.mktemp("wheel")))


@pytest.mark.slow
def test_the_wheel_carries_the_image_recipes_and_the_typed_api(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    recipes = {p.relative_to(ROOT / "docker").as_posix() for p in (ROOT / "docker").rglob("*") if p.is_file()}
    assert {"manifest.yaml", "Dockerfile.cpu", "make-base.sh", "build-image.sh",
            "requirements/cpu-torch2.13.txt"} <= recipes
    assert {f"{RECIPES}/{r}" for r in recipes} <= names, sorted(recipes - {n[len(RECIPES) + 1:] for n in names})
    assert wheel.read(f"{RECIPES}/manifest.yaml") == (ROOT / "docker" / "manifest.yaml").read_bytes()
    assert {"reproci/__init__.py", "reproci/py.typed", "reproci/cli.py", "reproci/reference_models/__init__.py"} <= names
    assert not [n for n in names if n.startswith("pipeline/")]  # never a top-level `pipeline` in site-packages
    # nothing of reproci's at a top-level name a user's repository may have (reference_models/, reproci/)
    assert {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))} == {"reproci"}
    templates = {f"reproci/templates/{p.name}" for p in (ROOT / "reproci" / "templates").iterdir()}
    assert templates and templates <= names  # what `reproci init` writes from
    assert not [n for n in names if n.startswith("docker/")]  # never a top-level `docker` (the engine SDK's name)


@pytest.mark.slow
def test_every_package_of_the_source_folder_is_in_the_wheel_under_the_name_reproci(wheel: zipfile.ZipFile) -> None:
    """pyproject.toml lists the packages by hand: a subpackage left out of the list would be
    missing from every install but a checkout's."""
    names = set(wheel.namelist())
    for top, name in (("reproci", "reproci"),):
        for init in (ROOT / top).rglob("__init__.py"):
            package = init.parent.relative_to(ROOT / top).as_posix()
            modules = {f"{name}/{p.relative_to(ROOT / top).as_posix()}" for p in init.parent.glob("*.py")}
            assert modules <= names, f"{top}/{package} is not in the wheel as {name}: add it to packages in pyproject.toml"


@pytest.mark.slow
def test_installed_from_the_wheel_images_list_reads_the_shipped_manifest_from_any_directory(
        wheel: zipfile.ZipFile, tmp_path: Path) -> None:
    """The wheel installed alone (no checkout beside it), run from a directory without docker/."""
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q", "--target", str(site),
                    wheel.filename], check=True, capture_output=True, text=True, timeout=300)
    work = tmp_path / "work"
    work.mkdir()
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(site), "DOCKER_HOST": "unix:///nonexistent.sock"}
    out = subprocess.run([sys.executable, "-c", "from reproci.cli import main; main()", "images", "list"], cwd=work,
                         capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    known = list(images.entries(ROOT / "docker" / "manifest.yaml"))
    assert all(any(line.startswith(f"{n} ") for line in out.stdout.splitlines()) for n in known), out.stdout
    shipped = site / "reproci" / "_recipes" / "docker" / "manifest.yaml"
    assert out.stdout.splitlines()[-1] == f"from {shipped} (shipped with reproci {__version__}): {', '.join(known)}"
    # `images build` of this install keeps its wheels (gigabytes) in the user's cache, not in site-packages
    house = subprocess.run([sys.executable, "-c", "from reproci import images; print(images.wheelhouse(images.SHIPPED))"],
                           cwd=work, capture_output=True, text=True, timeout=120,
                           env={**env, "XDG_CACHE_HOME": str(tmp_path / "xdg")})
    assert house.stdout.strip() == str(tmp_path / "xdg" / "reproci" / "wheelhouse"), house.stderr


def test_a_manifest_of_ones_own_is_listed_as_such_and_finds_the_shipped_base_recipe(tmp_path: Path) -> None:
    own = tmp_path / "docker" / "manifest.yaml"
    own.parent.mkdir()
    own.write_text((ROOT / "docker" / "manifest.yaml").read_text())
    assert not images.shipped(own) and images.shipped(images.SHIPPED)
    lines = images.listing_lines([{"name": "a", "reference": "r/a:1", "gpu": False, "python": "3.11", "packages": {},
                                   "digest": None, "source": str(own)}], engine_down=False)
    assert lines[-1] == f"from {own}: a"
    assert images.base_recipe(own, "docker/make-base.sh").resolve() == ROOT / "docker" / "make-base.sh"
    (tmp_path / "docker" / "make-base.sh").write_text("true\n")
    assert images.base_recipe(own, "docker/make-base.sh") == tmp_path / "docker" / "make-base.sh"
