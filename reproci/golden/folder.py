"""Where goldens live: a ``--goldens-dir`` that names a file is refused by every command that
takes one (``run``, ``golden update``, ``golden show``, ``golden diff``), in the same words."""

from __future__ import annotations

from pathlib import Path

from ..errors import UsageError


def require_folder(goldens_dir: Path, said: str = "--goldens-dir") -> None:
    """Refuse a goldens directory that is a file; ``said`` names the setting as the user wrote it
    (the flag, or the config file's key)."""
    if goldens_dir.exists() and not goldens_dir.is_dir():
        raise UsageError(f"{said} {goldens_dir} is a file, not a directory; name the directory that holds the goldens")


def golden_file_name(name: object, said: str) -> str | None:
    """``--image-name`` (``said``: as the user gave it), which names a golden file: no path of its own."""
    if name is not None and (not str(name).strip() or "/" in str(name) or str(name).startswith(".")):
        raise UsageError(f"{said} {name!r} names a golden file: use a name without slashes that does not start "
                         "with a dot, e.g. cuda12.6-torch2.7")
    return None if name is None else str(name)


def golden_path(goldens_dir: Path, image_name: str) -> Path:
    """The golden file of an image (a name ``golden_file_name`` has checked)."""
    return goldens_dir / f"{image_name}.yaml"
