"""The one atomic write of the orchestrator: results, goldens, reports and summaries are
written to a temporary file beside the target, synced, and renamed over it, so a reader
never sees half a file and an interrupted write leaves the previous file intact."""

from __future__ import annotations

import errno
import os
import stat
import sys
import tempfile
from pathlib import Path
from typing import Callable

from .errors import InfrastructureError, ReprociError, UsageError


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


def is_stream(path: Path) -> bool:
    """Whether a file the user named is written to as a stream, never replaced: ``-`` (stdout),
    a character device (a terminal, /dev/null), a FIFO or a socket, or a symlink to one
    (/dev/stdout, /dev/fd/63 of a shell's ``>(cmd)``)."""
    if str(path) == "-":
        return True
    try:
        mode = os.stat(path).st_mode  # through symlinks
    except OSError:
        return False
    return stat.S_ISCHR(mode) or stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


def followed(path: Path) -> Path:
    """The file a path names: a symlink's target (its links followed), so that the file is
    written and the link kept; any other path as it is."""
    return Path(os.path.realpath(path)) if path.is_symlink() else path


def unwritable(path: Path, flag: str) -> UsageError | None:
    """The usage error (exit 2) of a file the user named (``--output``, ``--summary``) that
    cannot be written there, naming the flag and what to do; None when it can be. A stream
    (``is_stream``) is opened when written; a symlink is judged by the file it leads to."""
    if is_stream(path):
        return None
    target = followed(path)
    if target.is_symlink():  # realpath gave up: the links go round in a loop
        return UsageError(f"{flag} {path} is a symlink that leads to no file (a loop): name a file to write")
    if target.is_block_device():
        return UsageError(f"{flag} {path} is a block device (a disk): name a file to write")
    why = why_unwritable(target)
    if why is None and not target.parent.is_dir():  # a folder the user names is theirs to make, as for a shell's >
        return UsageError(f"{flag} {path}: the folder {target.parent} does not exist: create it first or name a "
                          "path in a folder that exists")
    if why is None:
        return None
    if target.is_dir():
        return UsageError(f"{flag} {path} is a directory: name a file to write, e.g. {path / path_example(flag)}")
    return UsageError(f"{flag} {path}: {why}: name a path in a folder you can write to")


def is_unwritable(e: OSError) -> bool:
    """Whether ``e`` says the path cannot take a file (a user's to fix: exit 2), not that the
    system failed (a disk error, a full disk)."""
    return isinstance(e, (IsADirectoryError, NotADirectoryError, PermissionError, FileExistsError)) or \
        e.errno in (errno.EROFS, errno.EPERM, errno.EACCES)


def error_of(path: Path, flag: str, e: OSError) -> ReprociError:
    """The error an OSError of writing a user's file is, found after the check before writing
    passed: a full disk or a disk error is infrastructure (exit 5); anything else (a path that
    cannot take a file, /proc/version, a reader that went away) a usage error (exit 2) naming it."""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return InfrastructureError(f"disk full while writing {path}; free space and run again")
    if e.errno == errno.EIO and not is_stream(path):
        return InfrastructureError(f"a disk error while writing {path} ({e.strerror}); check the disk and run again")
    refused = unwritable(path, flag) if is_unwritable(e) else None
    return refused or UsageError(f"{flag} {path}: cannot write a file there ({e.strerror or e}): "
                                 "name a path you can write a file to")


def write_output(path: Path, text: str, *, flag: str = "--output") -> None:
    """Write a file the user named, atomically; a stream (``-``, a character device, a FIFO:
    ``is_stream``) is written to, a symlink's file is written and the link kept. A path that
    cannot take a file (a directory, a file among its folders, a read-only or missing folder)
    is a usage error (exit 2) naming it and ``flag``, a full disk an infrastructure error (exit
    5); either way nothing is left half-written and nothing but the file is replaced."""
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
        if is_stream(path):
            _stream(path, text)
        else:
            write(followed(path), text)
    except OSError as e:
        raise error_of(path, flag, e) from e


def _stream(path: Path, text: str) -> None:
    """Write ``text`` to stdout (``-``) or to the stream ``path`` names, as a shell's ``>`` does
    (a FIFO's open waits for its reader)."""
    if str(path) == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    with open(path, "w", encoding="utf-8") as f:  # no O_TRUNC effect on a device or FIFO
        f.write(text)
