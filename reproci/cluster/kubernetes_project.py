"""The project's files the cell pods of ``reproci matrix --format k8s`` read: ``reproci.yaml``
and the goldens of the images run (``NAME.yaml`` and the sidecar it names), as the data of a
ConfigMap; the ConfigMap volume lays them out as ``reproci.yaml`` and ``goldens/FILE``.

A ConfigMap holds at most 1 MiB (binary files count base64-encoded): more is refused, with
``--goldens-on-volume`` as the way out (the goldens copied onto the results volume instead).
Standard library and PyYAML only; ``kubernetes.py`` writes the objects.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

import yaml

from .. import safe_yaml
from ..errors import UsageError
from ..settings.config_file import CONFIG_FILE, find_config, load_config
from ..settings.declared import Catalog

MAX_BYTES = 1024 * 1024  # what the API server stores of one ConfigMap
KEY = re.compile(r"^[-._a-zA-Z0-9]{1,253}$")
MOUNT = "/reproci/project"
ON_VOLUME = "/results/goldens"  # --goldens-on-volume: copied there with kubectl cp before the cells start
REFUSED_KEYS = {  # reproci.yaml settings that cannot hold inside a pod
    "gpus": "chooses a container's GPUs; in a pod the Job's nvidia.com/gpu limit (the image's world_size) does",
    "update_golden": "records goldens, but the pods read them from a read-only volume; record them with "
                     "`reproci golden update` where the golden-update workflow runs",
}


class KeyToPath(TypedDict):
    """A file of the ConfigMap volume: its key in the ConfigMap, its path under the mount."""

    key: str
    path: str


@dataclass(frozen=True, kw_only=True)
class Project:
    """The ConfigMap's data (text) and binaryData (base64), and where the pods find what."""

    data: dict[str, str]
    binary: dict[str, str]
    goldens: tuple[str, ...]  # the keys that are golden files
    config: bool  # whether reproci.yaml is carried
    on_volume: bool  # goldens on the results volume, not in the ConfigMap

    @property
    def goldens_dir(self) -> str:
        return ON_VOLUME if self.on_volume else f"{MOUNT}/goldens"

    def items(self) -> list[KeyToPath]:
        """The ConfigMap volume's layout: reproci.yaml at the top, the goldens under goldens/."""
        top: list[KeyToPath] = [{"key": CONFIG_FILE, "path": CONFIG_FILE}] if self.config else []
        return top + [{"key": key, "path": f"goldens/{key}"} for key in self.goldens]


def config_path() -> Path | None:
    """The project's reproci.yaml, where ``reproci run`` looks for it: the working directory, else
    the nearest folder above it up to the repository's top level (``config_file.find_config``)."""
    return find_config()


def config_settings(path: Path | None, catalog: Catalog) -> dict[str, Any]:
    """The config file's settings (each value checked by its key in ``catalog``, as ``load_config``
    reads them), refused (one line) where a pod cannot honour them."""
    settings, _ = load_config(path, catalog)
    for key, why in REFUSED_KEYS.items():
        if settings.get(key) not in (None, False):
            raise UsageError(f"{path}: {key} {why}; remove it for --format k8s")
    return settings


def golden_files(goldens_dir: Path, image: str) -> list[Path]:
    """``NAME.yaml`` and the sidecar it names (none when the image has no golden yet)."""
    golden = goldens_dir / f"{image}.yaml"
    if not golden.is_file():
        return []
    try:
        sidecar = (safe_yaml.load(golden, limit=safe_yaml.GOLDEN_LIMIT) or {}).get("sidecar") or {}
    except (yaml.YAMLError, UnicodeDecodeError, AttributeError):
        return [golden]  # carried as it is: the run in the pod refuses it with exit 6, as it would here
    name = sidecar.get("file") if isinstance(sidecar, dict) else None
    return [golden] + ([goldens_dir / name] if isinstance(name, str) and (goldens_dir / name).is_file() else [])


def collect(goldens_dir: Path, config: Path | None, images: list[str], *, on_volume: bool) -> Project:
    """The ConfigMap's contents for these images, refused when a key is not a valid ConfigMap key or
    the whole passes 1 MiB."""
    files = [] if on_volume else [f for image in images for f in golden_files(goldens_dir, image)]
    data: dict[str, str] = {}
    binary: dict[str, str] = {}
    if config is not None:
        data[CONFIG_FILE] = config.read_text()
    for path in files:
        if not KEY.match(path.name) or path.name == CONFIG_FILE:
            raise UsageError(f"{path}: {path.name!r} cannot be a ConfigMap key (letters, digits, '-', '_', '.', "
                             f"not {CONFIG_FILE}); rename the image, or pass --goldens-on-volume")
        raw = path.read_bytes()
        try:
            data[path.name] = raw.decode("utf-8")
        except UnicodeDecodeError:
            binary[path.name] = base64.b64encode(raw).decode("ascii")
    size = sum(len(k) + len(v.encode()) for k, v in data.items()) + sum(len(k) + len(v) for k, v in binary.items())
    if size > MAX_BYTES:
        biggest = max(files, key=lambda p: p.stat().st_size)
        raise UsageError(f"the goldens of {', '.join(images)} take {size / MAX_BYTES:.1f} MiB in a ConfigMap (largest "
                         f"{biggest}), over its 1 MiB: pass --goldens-on-volume and copy {goldens_dir} onto the "
                         "results volume (docs/kubernetes.md)")
    return Project(data=data, binary=binary, goldens=tuple(p.name for p in files), config=config is not None,
                   on_volume=on_volume)
