"""The pinned toolchain images of ``docker/manifest.yaml``: reading, resolving, building, listing.

An image NAME (a key of the manifest's ``images:``) stands for its local tag wherever
``--image`` is accepted. Building is ``docker/build-image.sh NAME`` (after
``docker/make-base.sh`` for a base made on this machine): the scripts own the build,
this module only picks them and reports. The click commands are in ``commands/images.py``
and ``commands/matrix.py``.

The recipes travel with the package: ``reproci/_recipes/docker`` links to the checkout's
``docker/``, and the wheel carries its files there (package data in pyproject.toml), so an
installed reproci lists and builds its images from any directory.

A manifest of one's own (``--manifest``, or ``docker/manifest.yaml`` of a user's repository)
is laid over the shipped one: the shipped images stay, an entry of the same NAME replaces
the shipped entry whole, new NAMEs follow the shipped ones; ``shipped: false`` at its top
level reads it alone. Each entry remembers the file it came from (``ImageEntry.source``):
its paths are relative to that file's folder, and that file is what builds it.

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
from typing import Any, Mapping, TypedDict

import yaml

from . import __version__, safe_yaml
from .backends.base import CODE_ROOT
from .errors import ConfigError, InfrastructureError, UsageError

MANIFEST = Path("docker", "manifest.yaml")  # in a project checkout: under the working directory, else the code root
SHIPPED = Path(__file__).resolve().parent / "_recipes" / MANIFEST  # the copy the package carries (a wheel install)
MANIFEST_VERSION = 1
# Packages whose versions identify a toolchain, with their short names in listings.
KEY_PACKAGES = {"torch": "torch", "numpy": "numpy", "nvidia-cudnn-cu12": "cudnn", "nvidia-nccl-cu12": "nccl"}
_PIN = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;#]+)")


class ManifestBase(TypedDict, total=False):
    """An entry's ``base:``: the image it builds on, pinned by digest, or made by a recipe here."""

    image: str
    digest: str | None
    recipe: str | None  # script that makes a local base (digest null)


class ListingRow(TypedDict):
    """One image of ``reproci images list`` (``listing``)."""

    name: str
    reference: str  # its tag
    gpu: bool
    python: str
    packages: dict[str, str]  # short name -> version of the key packages (``KEY_PACKAGES``)
    digest: str | None  # the local image's digest; None where the engine has no such image
    built: str | None  # when the engine built it, "YYYY-MM-DD HH:MM:SS"
    source: str  # the manifest it came from (``origin``)


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
    source: Path  # the manifest file the entry came from: its relative paths start from that file's folder
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


def _read(path: Path) -> tuple[dict[str, dict[str, Any]], bool]:
    """One manifest file: its ``images`` mapping (NAME -> entry), checked for its format version,
    and its ``shipped`` key (whether its images are laid over the shipped manifest's)."""
    try:
        data = safe_yaml.load(path, limit=safe_yaml.MANIFEST_LIMIT)
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
    over = data.get("shipped", True)
    if not isinstance(over, bool):
        raise ConfigError(f"{path}: `shipped:` must be true (add these images to the ones reproci ships, the default) "
                          f"or false (these images alone), not {over!r}; fix the manifest")
    images: dict[str, dict[str, Any]] = {}
    for name, entry in data["images"].items():
        if not isinstance(entry, dict):
            raise ConfigError(f"{path}: image {name!r} must be a mapping (dockerfile, base, tag, gpu, ...)")
        images[str(name)] = entry
    return images, over


def sourced(path: Path) -> dict[str, tuple[Path, dict[str, Any]]]:
    """NAME -> (the manifest file it comes from, its entry) for the manifest ``path``: its images
    laid over the shipped manifest's unless it is the shipped one or says ``shipped: false``.
    An entry of a shipped NAME replaces that entry whole, in its place; new NAMEs come after."""
    own, over = _read(path)
    layered: dict[str, tuple[Path, dict[str, Any]]] = {}
    if over and not shipped(path) and SHIPPED.is_file():
        origin = SHIPPED.resolve()  # in a checkout, docker/manifest.yaml
        layered = {name: (origin, raw) for name, raw in _read(origin)[0].items()}
    layered.update((name, (path, raw)) for name, raw in own.items())
    return layered


def load_manifest(path: Path) -> dict[str, dict[str, Any]]:
    """The ``images`` mapping (NAME -> entry) the manifest ``path`` stands for, the shipped images
    included (see ``sourced``)."""
    return {name: raw for name, (_, raw) in sourced(path).items()}


def _cpu_isa(manifest: Path, name: str, value: Any) -> str | None:
    from .worker.process.launch import CPU_ISA_ENV

    if value is None or value in CPU_ISA_ENV:
        return value
    raise ConfigError(f"{manifest}: image {name!r}: cpu_isa {value!r} is not one of {', '.join(CPU_ISA_ENV)}; fix the manifest")


def entries(manifest: Path | None = None) -> dict[str, ImageEntry]:
    """Every image of the manifest (the shipped ones first, see ``sourced``), in its order."""
    manifest = manifest or default_manifest()
    out: dict[str, ImageEntry] = {}
    for name, (source, raw) in sourced(manifest).items():
        try:
            base: ManifestBase = raw["base"]
            out[name] = ImageEntry(
                name=name, tag=str(raw["tag"]), description=" ".join(str(raw.get("description", "")).split()),
                base_image=str(base["image"]), base_digest=base.get("digest") or None,
                base_recipe=base.get("recipe") or None, python=str(raw.get("python", "")),
                requirements=source.parent / str(raw["requirements"]), gpu=bool(raw.get("gpu", False)),
                source=source, cpu_isa=_cpu_isa(source, name, raw.get("cpu_isa")))
        except KeyError as e:
            raise ConfigError(f"{source}: image {name!r} lacks the field {e}; see the comments at the top") from e
        except TypeError as e:
            raise ConfigError(f"{source}: image {name!r}: `base:` must be a mapping with `image:` "
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


def build_script(entry: ImageEntry) -> Path:
    """The script that builds ``entry``: the ``build-image.sh`` beside its manifest, else the one
    reproci ships (told the manifest through REPROCI_MANIFEST either way)."""
    own = entry.source.parent / "build-image.sh"
    return own if own.is_file() else SHIPPED.resolve().parent / "build-image.sh"


def build(names: tuple[str, ...], *, manifest: Path | None = None, force: bool = False) -> list[str]:
    """Build the named images (when none are named, every image the manifest itself names: a
    manifest of one's own builds its own images, not the shipped ones it is laid over) with the
    scripts of each image's own manifest (``build_script``, ``base_recipe``); return their tags."""
    manifest = manifest or default_manifest()
    known = entries(manifest)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UsageError(f"no image {', '.join(unknown)} in {manifest}; images: {', '.join(known)}")
    tags = []
    own = tuple(n for n, e in known.items() if e.source.resolve() == manifest.resolve())
    for name in names or own:
        e = known[name]
        # build-image.sh reads the manifest with PyYAML and fills the wheelhouse with pip
        env = {"PYTHON": sys.executable, "REPROCI_MANIFEST": str(e.source.absolute())}
        house = wheelhouse(e.source)
        if house is not None:
            require_writable(house)
            env["REPROCI_WHEELHOUSE"] = str(house)
        if e.base_digest is None and e.base_recipe:
            _script(base_recipe(e.source, e.base_recipe), [], env, f"making the base image {e.base_image} for {name}")
        _script(build_script(e), [name] + (["--force"] if force else []), env, f"building {name}")
        tags.append(e.tag)
    return tags


def wheelhouse(manifest: Path, env: Mapping[str, str] | None = None) -> Path | None:
    """Where ``images build`` has build-image.sh keep the wheels it downloads (a folder per image
    under it, gigabytes for a CUDA image): ``$REPROCI_CACHE_DIR/wheelhouse`` when set; for a
    manifest inside the installed package (the one a pip install ships) the user's cache,
    ``$XDG_CACHE_HOME/reproci/wheelhouse``, else ``~/.cache/reproci/wheelhouse``, never
    site-packages; None for a manifest of a checkout or a repository of one's own: the script's
    default, ``.cache/wheelhouse`` in the folder above the manifest's."""
    env = os.environ if env is None else env
    if env.get("REPROCI_CACHE_DIR"):
        return Path(env["REPROCI_CACHE_DIR"]).expanduser().absolute() / "wheelhouse"
    if not manifest.resolve().is_relative_to(Path(__file__).resolve().parent):
        return None
    cache = Path(env["XDG_CACHE_HOME"]).expanduser() if env.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return cache.absolute() / "reproci" / "wheelhouse"


def require_writable(house: Path, env: Mapping[str, str] | None = None) -> None:
    """Refuse, before any build, a wheelhouse (``wheelhouse``) that cannot be made or written:
    one line naming the variable that put it there, not the build script's ``mkdir`` error."""
    env = os.environ if env is None else env
    folder = house
    while not folder.exists() and folder != folder.parent:  # the nearest folder that exists: nothing is made
        folder = folder.parent
    if folder.is_dir() and os.access(folder, os.W_OK | os.X_OK):
        return
    why = "is not a folder" if not folder.is_dir() else "cannot be written"
    said = (f"REPROCI_CACHE_DIR={env['REPROCI_CACHE_DIR']}" if env.get("REPROCI_CACHE_DIR") else
            f"XDG_CACHE_HOME={env['XDG_CACHE_HOME']}" if env.get("XDG_CACHE_HOME") else "the user's cache, ~/.cache")
    raise ConfigError(f"the wheelhouse {house} (from {said}) cannot be made: {folder} {why}; set REPROCI_CACHE_DIR "
                      "to a folder you can write")


def _script(path: Path, args: list[str], env: dict[str, str], what: str) -> None:
    if not path.is_file():
        raise ConfigError(f"{path} does not exist; `reproci images build` runs the scripts beside the image's "
                          "manifest, else the ones reproci ships: put it there, or fix the manifest")
    code = subprocess.run(["bash", str(path), *args], check=False, env={**os.environ, **env}).returncode
    if code != 0:
        raise InfrastructureError(f"{what} failed ({path.name} exited {code}; its output is above)")


def listing(manifest: Path | None = None) -> tuple[list[ListingRow], str | None]:
    """One row per manifest image, with the manifest it came from, its local digest when the
    engine has it, and a note if the engine is down."""
    from .backends.docker_engine import Engine, image_digest

    rows: list[ListingRow] = [{"name": e.name, "reference": e.tag, "gpu": e.gpu, "python": e.python,
                               "packages": e.key_packages(), "digest": None, "built": None, "source": origin(e)}
                              for e in entries(manifest or default_manifest()).values()]
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


def origin(entry: ImageEntry) -> str:
    """Where ``entry`` came from, as listings say it."""
    return f"{entry.source} (shipped with reproci {__version__})" if shipped(entry.source) else str(entry.source)


def listing_lines(rows: list[ListingRow], *, engine_down: bool) -> list[str]:
    """``reproci images list`` as text: name, reference and digest, then the key package versions;
    last, one line per manifest with the names that came from it."""
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
