"""The one atomic write of the orchestrator: results, goldens, reports and summaries are
written to a temporary file beside the target, synced, and renamed over it, so a reader
never sees half a file and an interrupted write leaves the previous file intact."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from .errors import InfrastructureError


def umask() -> int:
    """This process's umask, read without changing it where the system says it (threads may
    be creating files meanwhile)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_bytes(path: Path, data: bytes, *, on_full: str = "") -> None:
    """Write ``data`` to ``path`` atomically with the umask's mode (files here are shared:
    results are uploaded, goldens committed). A full disk is an InfrastructureError whose
    message ends with ``on_full`` (what is still intact)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~umask())
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        if e.errno == 28:  # ENOSPC
            raise InfrastructureError(f"disk full while writing {path}; free space and run again{on_full}") from e
        raise
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text(path: Path, text: str, *, on_full: str = "") -> None:
    write_bytes(path, text.encode("utf-8"), on_full=on_full)


def append_text(path: Path, text: str) -> None:
    """Append to a file that others append to too (GitHub's step summary), atomically: the
    file holds either its old text or the old text and all of ``text``."""
    existing = path.read_text(encoding="utf-8") if path.is_file() else ""
    sep = "\n" if existing and not existing.endswith("\n") else ""
    write_text(path, existing + sep + text)
