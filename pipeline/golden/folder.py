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
