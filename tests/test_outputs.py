"""Files a user names (``-o``, ``--summary``, what ``reproci init`` writes): a path that cannot
take a file is one line and exit 2 naming it, and nothing is half-written.

The commands run through the real CLI on the session's real results files. The targets are
a directory where a file was asked for, a path under a file (NotADirectoryError) and a folder
made immutable with ``chattr +i`` (root may write to a folder chmod made read-only; an
immutable one it may not), skipped where chattr is refused.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

from reproci import errors


def one_line(err: str) -> str:
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


@contextlib.contextmanager
def read_only(folder: Path) -> Iterator[None]:
    """``folder`` unwritable even for root (``chattr +i``), or for others by its mode."""
    if os.geteuid() != 0:
        folder.chmod(0o555)
        try:
            yield
        finally:
            folder.chmod(0o755)
        return
    if subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is refused here: no way to make a folder read-only for root")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(folder)], check=True)


def listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def _commands(files: dict[str, Path]) -> dict[str, tuple[str, ...]]:
    return {"merge": ("merge", str(files["compared"])),
            "report": ("report", str(files["compared"])),
            "pr-body": ("pr-body", str(files["recorded"]))}


@pytest.mark.parametrize("verb", ["merge", "report", "pr-body"])
@pytest.mark.parametrize("target", ["directory", "under-a-file", "read-only"])
def test_an_output_that_cannot_be_written_is_one_line_exit_2(files, cli, tmp_path, verb, target):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.md").write_text("the user's\n")
    path = {"directory": out, "under-a-file": out / "keep.md" / "report.md", "read-only": out / "report.md"}[target]
    before = listing(out)
    with read_only(out) if target == "read-only" else contextlib.nullcontext():
        code, stdout, err = cli(*_commands(files)[verb], "-o", str(path))
    line = one_line(err)
    assert code == errors.EXIT_USAGE, err
    assert line.startswith(f"error: --output {path}") and ("directory" in line or "folder" in line), line
    assert listing(out) == before and (out / "keep.md").read_text() == "the user's\n"  # nothing half-written


def test_a_merge_summary_that_cannot_be_written_writes_no_merged_file_either(files, cli, tmp_path):
    code, _, err = cli("merge", str(files["compared"]), "-o", str(tmp_path / "m.json"), "--summary", str(tmp_path))
    assert code == errors.EXIT_USAGE and one_line(err).startswith(f"error: --summary {tmp_path} is a directory")
    assert not (tmp_path / "m.json").exists()


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """A folder on a file system with no space left (a 16 KiB tmpfs, filled); skipped where this
    process may not mount one."""
    folder = tmp_path / "full"
    folder.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", str(folder)],
                      capture_output=True).returncode != 0:
        pytest.skip("mounting a tmpfs is refused here: no full disk to write to")
    try:
        with contextlib.suppress(OSError), open(folder / "filler", "wb") as f:
            while True:
                f.write(b"\0" * 4096)
                f.flush()
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)


@pytest.mark.parametrize("verb", ["merge", "report", "pr-body"])
def test_an_output_on_a_full_disk_is_exit_5_and_leaves_nothing(files, cli, full_disk, verb):
    path = full_disk / "out.md"
    code, _, err = cli(*_commands(files)[verb], "-o", str(path))
    assert code == errors.EXIT_INFRA and one_line(err) == f"error: disk full while writing {path}; free space and run again"
    assert listing(full_disk) == ["filler"]
