"""What a failed run's one line says beyond the exception itself: where in the plugin's own
code it was raised (``own_frames``), and which C++ compiler inductor could not use and how
to pick another (``compiler_failure``). Standard library only: exceptions are read by class
name, since the modules that define them may not import."""

from __future__ import annotations

import os
import subprocess
import sysconfig
import traceback
from pathlib import Path
from types import TracebackType

_HARNESS = str(Path(__file__).resolve().parents[2])  # reproci/: the harness's own frames
_PYTHON = tuple(sorted({os.path.abspath(sysconfig.get_paths()[k]) for k in ("stdlib", "platstdlib", "purelib", "platlib")}))
FIX_CXX = "set CXX to a working C++ compiler (CXX=g++) where the runs execute, or drop --compile"


def _own(filename: str) -> bool:
    """Whether a frame is the plugin's own code: not the harness's, a library's or Python's."""
    if filename.startswith("<"):
        return False
    path = os.path.abspath(filename)
    if "site-packages" in path.split(os.sep) or "dist-packages" in path.split(os.sep):
        return False
    return not any(path == p or path.startswith(p + os.sep) for p in (_HARNESS, *_PYTHON))


def own_frames(tb: TracebackType | None, limit: int = 3) -> str:
    """`` (at model.py:4 in _helper, from model.py:9 in build)``: the innermost frames of a
    traceback that are the plugin's own code, innermost first; "" where there are none."""
    frames = [f for f in traceback.extract_tb(tb) if _own(f.filename)][-limit:]
    if not frames:
        return ""
    shown = [f"{Path(f.filename).name}:{f.lineno} in {f.name}" for f in reversed(frames)]
    return f" (at {shown[0]}" + "".join(f", from {s}" for s in shown[1:]) + ")"


def compiler_named() -> str:
    """The C++ compiler inductor builds with, as the user would name it."""
    cxx = os.environ.get("CXX")
    return f"CXX={cxx}" if cxx else "g++ (inductor's default)"


def broken_compiler(cxx: str) -> str | None:
    """Why ``cxx`` cannot build inductor's kernels, as inductor itself tests it (``cxx --version``);
    None when it answers."""
    try:
        done = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        return f"`{cxx} --version` failed: {e}"
    if done.returncode == 0:
        return None
    said = done.stderr.strip().splitlines()[:1]
    return f"`{cxx} --version` exited with {done.returncode}" + (f": {said[0][:200]}" if said else "")


def _chain(e: BaseException) -> list[BaseException]:
    """The exception and the ones it wraps (inductor's ``inner_exception``, causes, contexts)."""
    out: list[BaseException] = []
    current: BaseException | None = e
    while current is not None and current not in out and len(out) < 8:
        out.append(current)
        current = getattr(current, "inner_exception", None) or current.__cause__ or current.__context__
    return out


def compiler_failure(e: BaseException) -> tuple[str, str] | None:
    """(error kind, one line) when inductor failed with its C++ compiler: none works
    (``InvalidCxxCompiler``: no compiled run of the invocation can work, "no-device"), or a
    kernel's build failed (``CppCompileError``, "crash"); None for any other failure."""
    for inner in _chain(e):
        name = type(inner).__name__
        if name == "InvalidCxxCompiler":
            return "no-device", (f"torch.compile found no working C++ compiler to build inductor's kernels with "
                                 f"({compiler_named()}): {FIX_CXX}")
        if name == "CppCompileError":
            cmd = getattr(inner, "cmd", None)
            compiler = (cmd.split()[0] if isinstance(cmd, str) else cmd[0]) if cmd else compiler_named()
            output = [line.strip() for line in str(getattr(inner, "output", "")).splitlines() if line.strip()]
            return "crash", (f"inductor could not build a C++ kernel with {compiler}"
                             + (f" ({output[0][:200]})" if output else "") + f": {FIX_CXX}")
    return None
