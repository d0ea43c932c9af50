"""``python -m reproci.worker SPEC.json``: one fresh-process training run. Its exit codes
are in ``exitcodes.py``; on failure an error record (status "error") is written in place
of the run record, and its ``error_kind`` is what the orchestrator reads."""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path
from typing import NoReturn

from .process.exitcodes import (  # noqa: F401
    EXIT_ATTESTATION,
    EXIT_CONTRACT,
    EXIT_CRASH,
    EXIT_INTERRUPTED,
    EXIT_MISSING_DEPENDENCY,
    EXIT_NO_DETERMINISTIC_KERNEL,
    EXIT_NO_DEVICE,
    EXIT_NON_FINITE,
    EXIT_OK,
    EXIT_USAGE,
)
from .process.failure import compiler_failure, own_frames
from .run_record import FailedRun

_NO_KERNEL = " does not have a deterministic implementation"


def no_deterministic_kernel(e: BaseException) -> str | None:
    """The one-line ERROR for an op that strict mode refuses on this device (torch raises
    "X does not have a deterministic implementation, but you set
    'torch.use_deterministic_algorithms(True)' ..."), or None for any other failure."""
    text = str(e)
    if not isinstance(e, RuntimeError) or _NO_KERNEL not in text:
        return None
    op = text.split(_NO_KERNEL, 1)[0].strip().splitlines()[-1].split()[-1]
    from .audit.audit_table import raising_entry

    entry = raising_entry(op)
    fix = entry.advice if entry is not None else "replace it in the model with an op that has one"
    out = "" if "strict stage" in fix else "; or leave this model out of the strict stage"
    return f"{op} has no deterministic kernel on this device, and strict determinism requires one: {fix}{out}"


def _write(path: Path, record: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record))
    os.replace(tmp, path)


def _classify(e: BaseException) -> tuple[str, int]:
    """(error_kind, exit code) of a failure. By class name: when torch is missing, the
    modules that define these classes cannot be imported."""
    name = type(e).__name__
    compiler = compiler_failure(e)
    if compiler is not None:
        return compiler[0], EXIT_NO_DEVICE if compiler[0] == "no-device" else EXIT_CRASH
    if no_deterministic_kernel(e) is not None:
        return "no-deterministic-kernel", EXIT_NO_DETERMINISTIC_KERNEL
    if name == "ContractError":
        return "contract", EXIT_CONTRACT
    if name == "AttestationError":
        return "attestation", EXIT_ATTESTATION
    if name in ("DeviceUnavailable", "CompilerMissing"):  # no run of the invocation can work here
        return "no-device", EXIT_NO_DEVICE
    if name == "NonFiniteError":
        return "non-finite", EXIT_NON_FINITE
    if isinstance(e, ModuleNotFoundError) and e.name in ("torch", "numpy"):
        return "missing-dependency", EXIT_MISSING_DEPENDENCY
    if isinstance(e, KeyboardInterrupt):
        return "interrupted", EXIT_INTERRUPTED
    return "crash", EXIT_CRASH


def die_with_parent() -> None:
    """On Linux, ask the kernel to kill this process when the process that launched it dies: a
    reproci killed by SIGKILL (or out of memory) leaves no worker training on, writing into a
    run directory nobody reads. Under the local backend the launcher's pid is given, so a parent
    that died before this call is noticed too."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - no libc to ask: the orchestrator still stops its workers itself
        return
    parent = os.environ.get("REPROCI_PARENT_PID")
    if parent and "RANK" not in os.environ and os.getppid() != int(parent):
        os._exit(EXIT_INTERRUPTED)


def own_temp_dir(spec_file: Path) -> None:
    """Point this run's temporary files (TMPDIR, for it and every process it starts) at a folder
    of its own, which the launcher removes once the run ends (``launch.run_temp_dir``). Kept
    as it was where that folder cannot be made, or is not this user's own."""
    import stat
    import tempfile

    from .process.launch import run_temp_dir

    folder = run_temp_dir(spec_file, tempfile.gettempdir())
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:  # another rank of the run made it
        pass
    except OSError:
        return
    st = os.lstat(folder)
    if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid():
        os.environ["TMPDIR"] = tempfile.tempdir = folder


def begin(argv: list[str], module: str) -> Path | None:
    """What an entry point (``python -m MODULE SPEC.json``) does first: die with its launcher, take
    its temporary folder, and return the spec file; None, the usage printed, for other arguments."""
    die_with_parent()
    if len(argv) != 1:
        print(f"usage: python -m {module} SPEC.json", file=sys.stderr)
        return None
    spec_file = Path(argv[0]).resolve()
    own_temp_dir(spec_file)
    return spec_file


def main(argv: list[str]) -> int:
    spec_file = begin(argv, "reproci.worker")
    if spec_file is None:
        return EXIT_USAGE
    from .process.spec import WorkerSpec, for_rank, resolve

    # Under torchrun each rank writes its own files (spec.for_rank); rank 0's are the run's.
    spec = for_rank(WorkerSpec.from_json(spec_file.read_text()), int(os.environ.get("RANK", "0")))
    out = resolve(spec_file, spec.output)
    assert out is not None
    try:
        from .train import run

        _write(out, run(spec, spec_file).to_json())
        return EXIT_OK
    except BaseException as e:  # noqa: BLE001 - every failure becomes an error record
        kind, code = _classify(e)
        message = _message(e, kind)
        _write(out, FailedRun(error_kind=kind, message=message, traceback=traceback.format_exc()[-4000:],
                              model=spec.model_name, role=spec.role).to_json())
        print(f"reproci worker: {message}", file=sys.stderr)
        return code


def _message(e: BaseException, kind: str) -> str:
    """The error record's one line: a crash's ends with where in the plugin's own code it was raised."""
    compiler = compiler_failure(e)
    message = (compiler[1] if compiler is not None
               else f"breaks the plugin contract: {e}" if kind == "contract"
               else no_deterministic_kernel(e) or "" if kind == "no-deterministic-kernel"
               else str(e) if kind in ("attestation", "no-device", "non-finite") else f"{type(e).__name__}: {e}").strip()
    line = message.splitlines()[0][:500] if message else type(e).__name__
    return line + own_frames(e.__traceback__) if kind == "crash" and compiler is None else line


def leave(code: int) -> NoReturn:
    """End the process as its interpreter's exit would, without tearing torch's modules down.

    Everything a run leaves is on disk by now (the record is written and renamed). What an
    exit does that a user or a library could notice still happens, in the interpreter's
    order: non-daemon threads are joined, ``atexit`` callbacks run (torch's among them), the
    standard streams are flushed. What is skipped is the teardown of every module and object,
    which takes about 0.2 s with torch loaded and has no effect outside the process, as
    multiprocessing ends its children. torch.library's finalizers, which take its operator
    registrations out of this process's dispatcher one by one (about 15 ms), are part of
    that teardown and are skipped with it."""
    import atexit
    import threading
    import weakref

    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None:
        shutdown()
    teardown = getattr(sys.modules.get("torch.library"), "_del_library", None)
    for finalizer, info in list(getattr(weakref.finalize, "_registry", {}).items()):
        if teardown is not None and getattr(info, "func", None) is teardown:
            finalizer.atexit = False
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


if __name__ == "__main__":
    leave(main(sys.argv[1:]))
