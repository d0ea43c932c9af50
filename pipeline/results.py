"""The results file: the versioned contract that goldens and reports build on.

Layout of one invocation's output, under ``results/`` (see README "Results format"):

    results/<run_id>/results.json     written last and atomically: present = complete
    results/<run_id>/<model>/spec-*.json, record-*.json   per-run specs and records
    results/latest.json               a copy of the newest complete results.json
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .errors import InfrastructureError, ResultsError

SCHEMA = "reproci.results"
VERSION = 1


def new_run_id(image_name: str) -> str:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{image_name}-{os.getpid()}"


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


def atomic_write_text(path: Path, text: str) -> None:
    """Write via a temp file in the same directory and rename: never a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~umask())  # results and reports are shared: readable like any other file
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        if e.errno == 28:  # ENOSPC
            raise InfrastructureError(f"disk full while writing {path}; free space and run again") from e
        raise
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write(run_dir: Path, document: dict[str, Any]) -> Path:
    text = json.dumps(document, indent=2, sort_keys=False, default=str) + "\n"
    path = run_dir / "results.json"
    atomic_write_text(path, text)
    atomic_write_text(run_dir.parent / "latest.json", text)
    return path


def load(path: Path) -> dict[str, Any]:
    if path.is_dir():
        path = path / "results.json"
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError as e:
        raise ResultsError(f"results file {path} does not exist; run `reproci run` first") from e
    except json.JSONDecodeError as e:
        raise ResultsError(f"{path} is not valid JSON (line {e.lineno}); it was not written by reproci") from e
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise ResultsError(f"{path} is not a reproci results file")
    version = data.get("version")
    if version != VERSION:
        newer = isinstance(version, int) and version > VERSION
        fix = "upgrade reproci (pip install -U reproci)" if newer else "re-run `reproci run` to produce a current file"
        raise ResultsError(f"{path} has results format version {version}, this reproci reads {VERSION}: {fix}")
    return data


def discard(run_dir: Path) -> None:
    """Remove an unfinished run directory (Ctrl-C, fatal error): nothing half-written stays."""
    shutil.rmtree(run_dir, ignore_errors=True)
