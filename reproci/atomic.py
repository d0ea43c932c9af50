"""The one atomic write of the orchestrator: results, goldens, reports and summaries are
written to a temporary file beside the target, synced, and renamed over it, so a reader
never sees half a file and an interrupted write leaves the previous file intact."""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path
from typing import Callable

from .errors import InfrastructureError, UsageError


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


def path_example(flag: str) -> str:
    """A file name to suggest inside a directory given where a file was asked for."""
    return {"--summary": "summary.md"}.get(flag, "out.md")


def why_unwritable(path: Path) -> str | None:
    """Why no file can be written at ``path``, found without creating anything: 'X is a
    directory', 'F is a file, not a folder' (a file among its folders), 'F is not writable
    here' (read-only, immutable); None when it can be."""
    if path.is_dir():
        return f"{path} is a directory"
    folder = path.parent
    while not folder.exists() and folder != folder.parent:  # the first folder that is there
        folder = folder.parent
    if not folder.is_dir():
        return f"{folder} is a file, not a folder"
    if not os.access(folder, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        return f"{path if path.exists() else folder} is not writable here"
    return None


def unwritable(path: Path, flag: str) -> UsageError | None:
    """The usage error (exit 2) of a file the user named (``--output``, ``--summary``) that
    cannot be written there, naming the flag and what to do; None when it can be."""
    why = why_unwritable(path)
    if why is None:
        return None
    if path.is_dir():
        return UsageError(f"{flag} {path} is a directory: name a file to write, e.g. {path / path_example(flag)}")
    return UsageError(f"{flag} {path}: {why}: name a path in a folder you can write to")


def is_unwritable(e: OSError) -> bool:
    """Whether ``e`` says the path cannot take a file (a user's to fix: exit 2), not that the
    system failed (a disk error, a full disk)."""
    return isinstance(e, (IsADirectoryError, NotADirectoryError, PermissionError, FileExistsError)) or \
        e.errno in (errno.EROFS, errno.EPERM, errno.EACCES)


def error_of(path: Path, flag: str, e: OSError) -> Exception:
    """The error an OSError of writing a user's file is: a full disk is infrastructure (exit 5),
    a path that cannot take a file a usage error (exit 2) naming it; else the OSError itself."""
    if e.errno == errno.ENOSPC:
        return InfrastructureError(f"disk full while writing {path}; free space and run again")
    if is_unwritable(e):
        return unwritable(path, flag) or UsageError(f"{flag} {path}: cannot write it ({e.strerror or e}): "
                                                    "name a path in a folder you can write to")
    return e


def write_output(path: Path, text: str, *, flag: str = "--output") -> None:
    """Write a file the user named, atomically. A path that cannot take a file (a directory, a
    file among its folders, a read-only folder) is a usage error (exit 2) naming it and ``flag``,
    a full disk an infrastructure error (exit 5); either way nothing is left half-written."""
    _to_output(write_text, path, text, flag)


def append_output(path: Path, text: str, *, flag: str) -> None:
    """``append_text`` to a file the user named (a step summary), its failures as ``write_output``'s."""
    _to_output(append_text, path, text, flag)


def _to_output(write: Callable[[Path, str], None], path: Path, text: str, flag: str) -> None:
    """``write(path, text)`` to a file the user named: refused before anything is written where the
    path cannot take a file, an OSError on the way turned into its one-line error."""
    refused = unwritable(path, flag)
    if refused is not None:
        raise refused
    try:
        write(path, text)
    except OSError as e:
        raise error_of(path, flag, e) from e
