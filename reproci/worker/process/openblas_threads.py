"""numpy's OpenBLAS pool, held back in a fork server and handed to each run.

numpy's bundled OpenBLAS starts its thread pool as numpy loads when OPENBLAS_NUM_THREADS
is above 1, and a process with threads must not fork; torch (MKL and OpenMP on the CPU)
starts its pools at the first op, so its thread count is already right in a server started
with the run's environment. A server for a run of several threads therefore loads numpy
with one BLAS thread (``hold``); each forked run gets the run's variable back and its pool
set to that count (``give``), the pool starting in the run, after the fork. Where the
OpenBLAS setter cannot be found, the server says so and runs start as fresh processes.

Standard library only (ctypes); numpy is loaded by the caller.
"""

from __future__ import annotations

import ctypes
import os

VAR = "OPENBLAS_NUM_THREADS"
_SETTERS = ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads", "openblas_set_num_threads64_",
            "openblas_set_num_threads")
_GETTERS = tuple(s.replace("set_num", "get_num") for s in _SETTERS)


def hold() -> str | None:
    """Before numpy loads: one BLAS thread for this process; returns the run's value (None: 1 or unset)."""
    wanted = os.environ.get(VAR)
    if wanted is None or wanted.strip() == "1":
        return None
    os.environ[VAR] = "1"
    return wanted


def _library_functions() -> tuple[ctypes._CFuncPtr, ctypes._CFuncPtr] | None:  # type: ignore[name-defined]
    """(setter, getter) of the OpenBLAS this process has loaded, or None."""
    try:
        with open("/proc/self/maps") as f:
            paths = sorted({line.split()[-1] for line in f if "openblas" in line.lower() and "/" in line})
    except OSError:
        return None
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for setter, getter in zip(_SETTERS, _GETTERS):
            if hasattr(lib, setter) and hasattr(lib, getter):
                return getattr(lib, setter), getattr(lib, getter)
    return None


def check() -> str | None:
    """In the server, after numpy loaded: why runs of several BLAS threads cannot be forked, or None."""
    return None if _library_functions() is not None else "numpy's OpenBLAS thread count cannot be set after it loads"


def give(wanted: str) -> None:
    """In a forked run: the run's variable back, and numpy's BLAS pool at that count."""
    os.environ[VAR] = wanted
    functions = _library_functions()
    if functions is None:
        raise RuntimeError("numpy's OpenBLAS thread count cannot be set")
    setter, getter = functions
    n = int(wanted)
    setter(ctypes.c_int(n))
    if getter() != n:
        raise RuntimeError(f"numpy's OpenBLAS kept {getter()} threads, not {n}")
