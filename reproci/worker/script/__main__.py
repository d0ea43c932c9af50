"""``python -m reproci.worker.script SPEC.json``: one run of a script model.

Prepares the run's output folder (``out-ROLE`` beside the spec: empty for a run from scratch;
for a resumed run, a fresh copy of the folder run A left as its step k + 1 began), fills the
command's placeholders and replaces this process with the command (``os.execve``: the same
process, so the launcher's timeout, its kill of the process group and the parent-death signal
all reach it). A leading ``python`` is this interpreter; ``torchrun`` and ``accelerate`` are
looked for first beside it. A command that cannot start leaves an error record, as a worker's
failure does.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
import traceback
from pathlib import Path

from ..__main__ import _write, begin
from ..process.exitcodes import EXIT_CONTRACT, EXIT_USAGE
from ..process.spec import WorkerSpec, resolve
from ..run_record import FailedRun
from . import SPEC_VARIABLE, TOP_PID_VARIABLE, fill

SITE = Path(__file__).resolve().parent / "site"  # holds the sitecustomize that installs the hooks
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
_PYTHON = re.compile(r"python(3(\.\d+)?)?")


class ScriptError(Exception):
    """A script model's run cannot start: said in one line."""


def out_folder(spec_file: Path, role: str) -> Path:
    """The run's own output folder, ``{out}``."""
    return spec_file.parent / f"out-{role}"


def prepare(spec: WorkerSpec, spec_file: Path) -> Path:
    """The run's ``{out}``, made afresh: empty, or a copy of run A's folder at step k + 1."""
    out = out_folder(spec_file, spec.role)
    shutil.rmtree(out, ignore_errors=True)
    source = resolve(spec_file, spec.resume_from)
    if source is None:
        out.mkdir(parents=True)
    elif not source.is_dir():
        raise ScriptError(f"run A left no copy of {{out}} as its step {spec.script.resume_at + 1 if spec.script else '?'} "
                          f"began ({source.name} is missing): run A must take more than k steps")
    else:
        shutil.copytree(source, out, symlinks=True)
    return out


def command_line(spec: WorkerSpec, out: Path, env: dict[str, str]) -> list[str]:
    """The filled command as argv; leading ``NAME=value`` words go into ``env``, and a leading
    ``python`` is this interpreter."""
    assert spec.script is not None
    try:
        argv = shlex.split(fill(spec.script.command, steps=spec.steps, resume_at=spec.script.resume_at, out=str(out)))
    except (ValueError, KeyError, IndexError) as e:
        raise ScriptError(f"the command {spec.script.command!r} cannot be read: {e}") from None
    while argv and _ASSIGNMENT.match(argv[0]):
        name, _, value = argv.pop(0).partition("=")
        env[name] = value
    if not argv:
        raise ScriptError(f"the command {spec.script.command!r} names no program")
    if _PYTHON.fullmatch(argv[0]):
        argv[0] = sys.executable
    return argv


def main(argv: list[str]) -> int:
    spec_file = begin(argv, "reproci.worker.script")
    if spec_file is None:
        return EXIT_USAGE
    spec = WorkerSpec.from_json(spec_file.read_text())
    record = resolve(spec_file, spec.output)
    assert record is not None and spec.script is not None
    try:
        out = prepare(spec, spec_file)
        env = dict(os.environ)
        command = command_line(spec, out, env)
        here = os.path.dirname(sys.executable)  # this environment's torchrun and accelerate first
        env["PATH"] = here + os.pathsep + env.get("PATH", os.defpath)
        env["PYTHONPATH"] = os.pathsep.join([str(SITE)] + [p for p in [env.get("PYTHONPATH")] if p])
        env[SPEC_VARIABLE] = str(spec_file)
        env[TOP_PID_VARIABLE] = str(os.getpid())
        program = command[0] if os.sep in command[0] else shutil.which(command[0], path=env["PATH"])
        if program is None:
            raise ScriptError(f"{command[0]}: command not found (the command {spec.script.command!r})")
        try:
            os.chdir(spec.script.cwd)
        except OSError as e:
            raise ScriptError(f"cannot run from {spec.script.cwd}: {e.strerror}") from None
        sys.stdout.flush()
        os.execve(program, command, env)
    except (ScriptError, OSError) as e:
        message = str(e) if isinstance(e, ScriptError) else f"the command could not start: {e}"
        _write(record, FailedRun(error_kind="contract", message=message, traceback=traceback.format_exc()[-4000:],
                                 model=spec.model_name, role=spec.role).to_json())
        print(f"reproci worker: {message}", file=sys.stderr)
        return EXIT_CONTRACT
    return EXIT_CONTRACT  # not reached: execve does not return


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
