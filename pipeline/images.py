"""The pinned toolchain images of ``docker/manifest.yaml``: reading, resolving, building, listing.

An image NAME (a key of the manifest's ``images:``) stands for its local tag wherever
``--image`` is accepted. Building is ``docker/build-image.sh NAME`` (after
``docker/make-base.sh`` for a base made on this machine): the scripts own the build,
this module only picks them and reports. The click commands are in ``commands/images.py``
and ``commands/matrix.py``.

The recipes travel with the package: ``pipeline/_recipes/docker`` links to the checkout's
``docker/``, and the wheel carries its files there (package data in pyproject.toml), so an
installed reproci lists and builds its images from any directory.

This module needs only PyYAML (the engine only for ``listing``), so the CI planning job
that runs ``reproci matrix`` needs no torch.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from . import __version__
from .backends.base import CODE_ROOT
from .errors import ConfigError, InfrastructureError, UsageError

MANIFEST = Path("docker", "manifest.yaml")  # in a project checkout: under the working directory, else the code root
SHIPPED = Path(__file__).resolve().parent / "_recipes" / MANIFEST  # the copy the package carries (a wheel install)
MANIFEST_VERSION = 1
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
    cpu_isa: str | None = None  # cap the CPU kernels at this level (--cpu-isa), for goldens portable across hosts

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


def default_manifest() -> Path:
    """The manifest read when none is named: ``docker/manifest.yaml`` under the working
    directory (CI runs from the checkout), else the one beside this code, else the one the
    installed package carries."""
    for candidate in (Path.cwd() / MANIFEST, CODE_ROOT / MANIFEST, SHIPPED):
        if candidate.is_file():
            return candidate
    return MANIFEST  # names itself in the "does not exist" message


def shipped(manifest: Path) -> bool:
    """Whether ``manifest`` is the one reproci ships (in a checkout, its ``docker/manifest.yaml``)."""
    return manifest.is_file() and SHIPPED.is_file() and manifest.resolve() == SHIPPED.resolve()


def base_recipe(manifest: Path, recipe: str) -> Path:
    """A base recipe of the manifest (``docker/make-base.sh``): relative to the folder that holds
    the manifest's folder, else to reproci's code or its shipped recipes (where a manifest of
    one's own names reproci's recipe)."""
    candidates = [manifest.parent.parent / recipe, CODE_ROOT / recipe, SHIPPED.parent.parent / recipe]
    return next((c for c in candidates if c.is_file()), candidates[0])


def load_manifest(path: Path) -> dict[str, dict[str, Any]]:
    """The ``images`` mapping of a manifest (NAME -> entry), checked for its format version."""
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError as e:
        raise ConfigError(f"image manifest {path} does not exist; pass --manifest or run from the project root") from e
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (byte {e.start}); fix the manifest") from e
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path}{where}: malformed YAML ({getattr(e, 'problem', e)}); fix the manifest") from e
    if not isinstance(data, dict) or not isinstance(data.get("images"), dict):
        raise ConfigError(f"{path}: expected a mapping with an `images:` mapping of NAME -> entry")
    if data.get("version") != MANIFEST_VERSION:
        raise ConfigError(f"{path}: manifest format version {data.get('version')!r}, this reproci reads "
                          f"{MANIFEST_VERSION}; upgrade reproci or fix `version:`")
    images: dict[str, dict[str, Any]] = {}
    for name, entry in data["images"].items():
        if not isinstance(entry, dict):
            raise ConfigError(f"{path}: image {name!r} must be a mapping (dockerfile, base, tag, gpu, ...)")
        images[str(name)] = entry
    return images


def _cpu_isa(manifest: Path, name: str, value: Any) -> str | None:
    from .worker.process.launch import CPU_ISA_ENV

    if value is None or value in CPU_ISA_ENV:
        return value
    raise ConfigError(f"{manifest}: image {name!r}: cpu_isa {value!r} is not one of {', '.join(CPU_ISA_ENV)}; fix the manifest")


def entries(manifest: Path | None = None) -> dict[str, ImageEntry]:
    """Every image of the manifest, in its order."""
    manifest = manifest or default_manifest()
    out: dict[str, ImageEntry] = {}
    for name, raw in load_manifest(manifest).items():
        try:
            base: dict[str, Any] = raw["base"]
            out[name] = ImageEntry(
                name=name, tag=str(raw["tag"]), description=" ".join(str(raw.get("description", "")).split()),
                base_image=str(base["image"]), base_digest=base.get("digest") or None,
                base_recipe=base.get("recipe") or None, python=str(raw.get("python", "")),
                requirements=manifest.parent / str(raw["requirements"]), gpu=bool(raw.get("gpu", False)),
                cpu_isa=_cpu_isa(manifest, name, raw.get("cpu_isa")))
        except KeyError as e:
            raise ConfigError(f"{manifest}: image {name!r} lacks the field {e}; see the comments at the top") from e
        except TypeError as e:
            raise ConfigError(f"{manifest}: image {name!r}: `base:` must be a mapping with `image:` "
                              f"(and `digest:`); see the comments at the top") from e
    return out


def resolve(image: str, manifest: Path | None = None) -> tuple[str, ImageEntry | None]:
    """``--image`` as an engine reference, and its manifest entry when it has one.

    A manifest NAME becomes its tag; any other reference (``repo:tag``,
    ``repo@sha256:...``) is used as given, matched to an entry by tag if one has it.
    Without a manifest every reference is used as given.
    """
    manifest = manifest or default_manifest()
    if not manifest.is_file():
        return image, None
    known = entries(manifest)
    if image in known:
        return known[image].tag, known[image]
    return image, next((e for e in known.values() if e.tag == image), None)


def build(names: tuple[str, ...], *, manifest: Path | None = None, force: bool = False) -> list[str]:
    """Build the named images (all when none are named) with the scripts in docker/; return their tags."""
    manifest = manifest or default_manifest()
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
            _script(base_recipe(manifest, e.base_recipe), [], env, f"making the base image {e.base_image} for {name}")
        _script(scripts / "build-image.sh", [name] + (["--force"] if force else []), env, f"building {name}")
        tags.append(e.tag)
    return tags


def _script(path: Path, args: list[str], env: dict[str, str], what: str) -> None:
    if not path.is_file():
        raise ConfigError(f"{path} does not exist; `reproci images build` runs the scripts beside the manifest: "
                          "put them there, or omit --manifest to build the images reproci ships")
    code = subprocess.run(["bash", str(path), *args], check=False, env={**os.environ, **env}).returncode
    if code != 0:
        raise InfrastructureError(f"{what} failed ({path.name} exited {code}; its output is above)")


def listing(manifest: Path | None = None) -> tuple[list[dict[str, Any]], str | None]:
    """One row per manifest image, with its local digest when the engine has it, and a note if the engine is down."""
    from .backends.docker_engine import Engine, image_digest

    manifest = manifest or default_manifest()
    source = f"{manifest} (shipped with reproci {__version__})" if shipped(manifest) else str(manifest)
    rows: list[dict[str, Any]] = [{"name": e.name, "reference": e.tag, "gpu": e.gpu, "python": e.python,
                                   "packages": e.key_packages(), "digest": None, "built": None, "source": source}
                                  for e in entries(manifest).values()]
    try:
        engine = Engine.connect()
    except InfrastructureError as err:
        return rows, str(err)
    try:
        for row in rows:
            attrs = engine.inspect_image(row["reference"])
            if attrs is not None:
                row["digest"] = image_digest(attrs, row["reference"])
                row["built"] = str(attrs.get("Created", ""))[:19].replace("T", " ")
    finally:
        engine.close()
    return rows, None


def listing_lines(rows: list[dict[str, Any]], *, engine_down: bool) -> list[str]:
    """``reproci images list`` as text: name, reference and digest, then the key package versions."""
    wide = {k: max([len(k)] + [len(str(r[k])) for r in rows]) for k in ("name", "reference")}
    lines = [f"{'name':{wide['name']}}  {'reference':{wide['reference']}}  digest"]
    for r in rows:
        digest = r["digest"][:19] if r["digest"] else ("?" if engine_down else "not built")
        lines.append(f"{r['name']:{wide['name']}}  {r['reference']:{wide['reference']}}  {digest}"
                     + ("  (GPU)" if r["gpu"] else ""))
        packages = ", ".join([f"python {r['python']}"] + [f"{k} {v}" for k, v in r["packages"].items()])
        lines.append(f"{'':{wide['name']}}  {packages}")
    sources: dict[str, list[str]] = {}
    for r in rows:
        if r.get("source"):
            sources.setdefault(r["source"], []).append(r["name"])
    lines += [f"from {where}: {', '.join(names)}" for where, names in sources.items()]
    return lines
