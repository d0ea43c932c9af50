"""Files a user names (``-o``, ``--summary``, what ``reproci init`` writes): a path that cannot
take a file is one line and exit 2 naming it, and nothing is half-written.

The commands run through the real CLI on the session's real results files. The targets are
a directory where a file was asked for, a path under a file (NotADirectoryError) and a folder
made immutable with ``chattr +i`` (root may write to a folder chmod made read-only; an
immutable one it may not), skipped where chattr is refused.

A stream is written to, never replaced: ``-``, a FIFO, a pipe by its /dev/fd path (a shell's
``>(cmd)``) and character devices made with mknod in a temporary folder (never the machine's
own /dev, which the old code replaced as root); a symlink's file is written and the link kept.
These run ``reproci report`` on a small results file of their own and train nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import subprocess
import sys
import threading
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
@pytest.mark.parametrize("target", ["directory", "under-a-file", "read-only", "missing-folder"])
def test_an_output_that_cannot_be_written_is_one_line_exit_2(files, cli, tmp_path, verb, target):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.md").write_text("the user's\n")
    path = {"directory": out, "under-a-file": out / "keep.md" / "report.md", "read-only": out / "report.md",
            "missing-folder": out / "nosuch" / "report.md"}[target]  # a folder is not made without a word
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


RESULTS = {"schema": "reproci.results", "version": 1, "models": [{"model": "conv", "verdict": "PASS"}],
           "image": {"name": "local"}, "summary": {}}


@pytest.fixture
def small(tmp_path: Path, cli) -> tuple[Path, str]:
    """A small results file and the report ``reproci report`` prints of it on stdout."""
    path = tmp_path / "results.json"
    path.write_text(json.dumps(RESULTS))
    code, out, _ = cli("report", str(path))
    assert code == 0 and out.startswith("## reproci"), out
    return path, out


def device(folder: Path, name: str, rdev: int, kind: int = stat.S_IFCHR) -> Path:
    """A device node made with mknod in ``folder`` (a temporary folder, never /dev); skipped where
    this process may not make one."""
    node = folder / name
    try:
        os.mknod(node, 0o600 | kind, rdev)
    except PermissionError:
        pytest.skip("mknod is refused here (no CAP_MKNOD): no device node to write to")
    return node


def reading(fd_or_path: int | str) -> tuple[threading.Thread, list[bytes]]:
    """A thread that reads a pipe or FIFO to its end, started."""
    got: list[bytes] = []

    def read() -> None:
        with open(fd_or_path, "rb") as f:
            got.append(f.read())
    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread, got


def test_dash_is_stdout(cli, small):
    path, report = small
    code, out, err = cli("report", str(path), "-o", "-")
    assert (code, out, err) == (0, report, ""), err  # no 'report: -' line: the stream is the report


def test_a_character_device_is_written_to_not_replaced(cli, small, tmp_path):
    """A character device: /dev/null's node made again in a temporary folder stays a device (the
    old code renamed a file over it), and /dev/full's is a full disk's one line, exit 5."""
    path, _ = small
    null = device(tmp_path, "null", os.makedev(1, 3))
    assert cli("report", str(path), "-o", str(null)) == (0, "", "")
    assert stat.S_ISCHR(null.lstat().st_mode)
    full = device(tmp_path, "full", os.makedev(1, 7))
    code, _, err = cli("report", str(path), "-o", str(full))
    assert code == errors.EXIT_INFRA and one_line(err) == f"error: disk full while writing {full}; free space and run again"
    assert stat.S_ISCHR(full.lstat().st_mode)


def test_dev_stdout_on_a_terminal_is_written_to(cli, small):
    """/dev/stdout on a terminal is a symlink through /proc/self/fd to the terminal's device: here a
    pseudo-terminal's, by its /proc/self/fd path. The report arrives on the terminal."""
    path, report = small
    master, slave = os.openpty()
    try:
        assert cli("report", str(path), "-o", f"/proc/self/fd/{slave}") == (0, "", "")
        os.set_blocking(master, False)
        assert os.read(master, 1 << 16).decode().replace("\r\n", "\n") == report  # the terminal's line endings
    finally:
        os.close(master)
        os.close(slave)


def test_a_fifo_and_a_pipe_are_written_to_not_replaced(cli, small, tmp_path):
    """A FIFO, and a pipe by the /dev/fd path a shell's ``>(cmd)`` gives: each is read whole by its
    reader and stays what it was."""
    path, report = small
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    thread, got = reading(str(fifo))
    assert cli("report", str(path), "-o", str(fifo)) == (0, "", "")
    thread.join(timeout=30)
    assert got == [report.encode()] and stat.S_ISFIFO(fifo.lstat().st_mode)
    r, w = os.pipe()
    thread, got = reading(r)
    try:
        assert cli("report", str(path), "-o", f"/dev/fd/{w}") == (0, "", "")
    finally:
        os.close(w)
    thread.join(timeout=30)
    assert got == [report.encode()]


def test_a_symlink_is_followed_and_kept(cli, small, tmp_path):
    """The file a symlink leads to is written; the link stays a link (the old code replaced it)."""
    path, report = small
    (tmp_path / "real.md").write_text("old\n")
    link = tmp_path / "link.md"
    link.symlink_to("real.md")
    code, _, err = cli("report", str(path), "-o", str(link))
    assert code == 0, err
    assert link.is_symlink() and os.readlink(link) == "real.md" and (tmp_path / "real.md").read_text() == report


@pytest.mark.parametrize("target", ["symlink-loop", "block-device"])
def test_a_path_that_leads_to_no_file_is_refused(cli, small, tmp_path, target):
    """A symlink loop, and a disk's device node (made in a temporary folder): one line, exit 2, untouched."""
    path, _ = small
    if target == "symlink-loop":
        out = tmp_path / "a"
        out.symlink_to("b")
        (tmp_path / "b").symlink_to("a")
    else:
        out = device(tmp_path, "disk", os.makedev(7, 0), stat.S_IFBLK)  # a loop device's numbers
    code, _, err = cli("report", str(path), "-o", str(out))
    line = one_line(err)
    assert code == errors.EXIT_USAGE and line.startswith(f"error: --output {out} is a "), line
    assert out.is_symlink() if target == "symlink-loop" else stat.S_ISBLK(out.lstat().st_mode)


def test_proc_version_is_one_line_and_untouched(cli, small):
    """A file of /proc: root passes the check before writing (the folder is writable to it) and
    the write fails; either way one line, exit 2."""
    path, _ = small
    before = Path("/proc/version").read_text()
    code, _, err = cli("report", str(path), "-o", "/proc/version")
    assert code == errors.EXIT_USAGE and one_line(err).startswith("error: --output /proc/version: "), err
    assert Path("/proc/version").read_text() == before


def test_a_write_that_fails_after_the_check_is_one_line_and_leaves_nothing(small, tmp_path):
    """The check before writing cannot foresee every failure: under a file-size limit (``ulimit
    -f``) the temporary file is made and its write fails (EFBIG). One line, exit 2, no file left."""
    path, _ = small
    out = tmp_path / "out"
    out.mkdir()
    limited = ("import resource, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
               "resource.setrlimit(resource.RLIMIT_FSIZE, (64, 64)); from reproci.cli import main; "
               "sys.exit(main(sys.argv[1:]))")
    proc = subprocess.run([sys.executable, "-c", limited, "report", str(path), "-o", str(out / "report.md")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == errors.EXIT_USAGE, proc.stderr
    assert one_line(proc.stderr) == (f"error: --output {out / 'report.md'}: cannot write a file there (File too "
                                     "large): name a path you can write a file to")
    assert listing(out) == []
