"""The pinned toolchain images of ``docker/manifest.yaml``, and ``reproci images build|list``.

An image NAME (a key of the manifest's ``images:``) stands for its local tag wherever
``--image`` is accepted. Building is ``docker/build-image.sh NAME`` (after
``docker/make-base.sh`` for a base made on this machine): the scripts own the build,
this module only picks them and reports.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from .backends.base import CODE_ROOT
from .errors import ConfigError, InfrastructureError, UsageError
from .matrix import load_manifest

DOCKER_DIR = CODE_ROOT / "docker"
MANIFEST = DOCKER_DIR / "manifest.yaml"
# Packages whose versions identify a toolchain, with their short names in listings.
KEY_PACKAGES = {"torch": "torch", "numpy": "numpy", "nvidia-cudnn-cu12": "cudnn", "nvidia-nccl-cu12": "nccl"}
_PIN = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;#]+)")


@dataclass(frozen=True, kw_only=True)
class ImageEntry:
    name: str
    tag: str
    description: str
    base_image: str
    base_digest: str | None
    base_recipe: str | None  # script that makes a local base (digest null)
    python: str
    requirements: Path
    gpu: bool

    def pins(self) -> dict[str, str]:
        """name -> version of every ``name==version`` line of the requirements file."""
        try:
            lines = self.requirements.read_text().splitlines()
        except OSError:
            return {}
        return {m.group(1).lower().replace("_", "-"): m.group(2) for line in lines if (m := _PIN.match(line))}

    def key_packages(self) -> dict[str, str]:
        pins = self.pins()
        return {short: pins[name] for name, short in KEY_PACKAGES.items() if name in pins}


def entries(manifest: Path = MANIFEST) -> dict[str, ImageEntry]:
    """Every image of the manifest, in its order."""
    out: dict[str, ImageEntry] = {}
    for name, raw in load_manifest(manifest).items():
        try:
            base: dict[str, Any] = raw["base"]
            out[name] = ImageEntry(
                name=name, tag=str(raw["tag"]), description=" ".join(str(raw.get("description", "")).split()),
                base_image=str(base["image"]), base_digest=base.get("digest") or None,
                base_recipe=base.get("recipe") or None, python=str(raw.get("python", "")),
                requirements=manifest.parent / str(raw["requirements"]), gpu=bool(raw.get("gpu", False)))
        except (KeyError, TypeError) as e:
            raise ConfigError(f"{manifest}: image {name!r} lacks the field {e}; see the comments at the top") from e
    return out


def resolve(image: str, manifest: Path = MANIFEST) -> tuple[str, ImageEntry | None]:
    """``--image`` as an engine reference, and its manifest entry when it has one.

    A manifest NAME becomes its tag; any other reference (``repo:tag``,
    ``repo@sha256:...``) is used as given, matched to an entry by tag if one has it.
    """
    if not manifest.is_file():
        return image, None
    known = entries(manifest)
    if image in known:
        return known[image].tag, known[image]
    return image, next((e for e in known.values() if e.tag == image), None)


def build(names: tuple[str, ...], *, manifest: Path = MANIFEST, force: bool = False) -> list[str]:
    """Build the named images (all when none are named) with the scripts in docker/; return their tags."""
    known = entries(manifest)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UsageError(f"no image {', '.join(unknown)} in {manifest}; images: {', '.join(known)}")
    scripts = manifest.parent
    env = {"PYTHON": sys.executable}  # build-image.sh reads the manifest with PyYAML and fills the wheelhouse with pip
    tags = []
    for name in names or tuple(known):
        e = known[name]
        if e.base_digest is None and e.base_recipe:
            _script(CODE_ROOT / e.base_recipe, [], env, f"making the base image {e.base_image} for {name}")
        _script(scripts / "build-image.sh", [name] + (["--force"] if force else []), env, f"building {name}")
        tags.append(e.tag)
    return tags


def _script(path: Path, args: list[str], env: dict[str, str], what: str) -> None:
    if not path.is_file():
        raise ConfigError(f"{path} does not exist; `reproci images build` runs from a reproci checkout with docker/")
    code = subprocess.run(["bash", str(path), *args], check=False, env={**os.environ, **env}).returncode
    if code != 0:
        raise InfrastructureError(f"{what} failed ({path.name} exited {code}; its output is above)")


def listing(manifest: Path = MANIFEST) -> tuple[list[dict[str, Any]], str | None]:
    """One row per manifest image, with its local digest when the engine has it, and a note if the engine is down."""
    from .backends import docker_backend

    rows: list[dict[str, Any]] = [{"name": e.name, "reference": e.tag, "gpu": e.gpu, "python": e.python, "packages": e.key_packages(),
             "digest": None, "built": None} for e in entries(manifest).values()]
    try:
        client = docker_backend.connect()
    except InfrastructureError as err:
        return rows, str(err)
    for row in rows:
        attrs = docker_backend.inspect_image(client, row["reference"])
        if attrs is not None:
            row["digest"] = docker_backend.image_digest(attrs, row["reference"])
            row["built"] = str(attrs.get("Created", ""))[:19].replace("T", " ")
    return rows, None


@click.group("images")
def images_group() -> None:
    """Build and list the pinned toolchain images of docker/manifest.yaml."""


@images_group.command("build")
@click.argument("names", nargs=-1)
@click.option("--force", is_flag=True, help="Build again even when the image is up to date.")
@click.option("--manifest", type=click.Path(path_type=Path), default=MANIFEST, show_default=True)
def build_cmd(names: tuple[str, ...], force: bool, manifest: Path) -> None:
    """Build the named images (default: all of the manifest); up-to-date images are skipped."""
    for tag in build(names, manifest=manifest, force=force):
        click.echo(f"ready: {tag}")


@images_group.command("list")
@click.option("--manifest", type=click.Path(path_type=Path), default=MANIFEST, show_default=True)
def list_cmd(manifest: Path) -> None:
    """Show each image's name, reference, local digest and key package versions."""
    rows, note = listing(manifest)
    wide = {k: max([len(k)] + [len(str(r[k])) for r in rows]) for k in ("name", "reference")}
    click.echo(f"{'name':{wide['name']}}  {'reference':{wide['reference']}}  digest")
    for r in rows:
        digest = r["digest"][:19] if r["digest"] else ("?" if note else "not built")
        click.echo(f"{r['name']:{wide['name']}}  {r['reference']:{wide['reference']}}  {digest}"
                   + ("  (GPU)" if r["gpu"] else ""))
        packages = ", ".join([f"python {r['python']}"] + [f"{k} {v}" for k, v in r["packages"].items()])
        click.echo(f"{'':{wide['name']}}  {packages}")
    if note:
        click.echo(f"note: digests unknown: {note}", err=True)
