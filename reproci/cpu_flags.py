"""Whether this CPU has a ``--cpu-isa`` level, read from its own flags (/proc/cpuinfo on Linux).

ATen takes ``ATEN_CPU_CAPABILITY`` at its word (and oneDNN and MKL their caps): capped at a
level the CPU does not have, every worker dies of an illegal instruction (SIGILL) at its first
vectorised kernel. So a level is checked here, before any run, against the instructions the
libraries need for it. Where the flags cannot be read (no /proc/cpuinfo), nothing is refused:
the worker's attestation still says whether the cap took effect.
"""

from __future__ import annotations

from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")
# What each level needs: ATen dispatches AVX512 kernels only with avx512vl, bw, dq (and fma);
# oneDNN's AVX512_CORE and MKL's AVX512 need avx512f, bw, dq and vl; AVX2 kernels need avx2 and fma.
LEVEL_FLAGS = {"avx2": ("avx2", "fma"), "avx512": ("avx512f", "avx512dq", "avx512bw", "avx512vl")}
# The vector flags a message shows (a CPU lists about a hundred): those that choose kernels.
SHOWN = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512dq", "avx512bw", "avx512vl", "avx512cd",
         "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8", "asimd", "sve", "sve2")


def flags(cpuinfo: str) -> set[str] | None:
    """The first processor's flags (x86 ``flags``, Arm ``Features``); None where the text lists none."""
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("flags", "Features"):
            return set(value.split())
    return None


def best_level(cpu: set[str]) -> str | None:
    """The highest ``--cpu-isa`` level whose instructions ``cpu`` has, or None."""
    have = [level for level, need in LEVEL_FLAGS.items() if set(need) <= cpu]
    return have[-1] if have else None


def lacks(level: str, cpuinfo: str) -> str | None:
    """'this CPU has no AVX512 (flags: sse4_2 avx avx2 fma f16c)' when the CPU described by
    ``cpuinfo`` lacks an instruction ``level`` needs; None when it has them or lists no flags."""
    cpu = flags(cpuinfo)
    if cpu is None or set(LEVEL_FLAGS[level]) <= cpu:
        return None
    shown = " ".join(f for f in SHOWN if f in cpu) or "none of " + " ".join(LEVEL_FLAGS[level])
    return f"this CPU has no {level.upper()} (flags: {shown})"


def instead(level: str, cpuinfo: str) -> str:
    """What to cap at instead of a level this CPU lacks: 'avx2 (or native)', or 'native'."""
    best = best_level(flags(cpuinfo) or set())
    return f"{best} (or native)" if best is not None and best != level else "native"


def host_lacks(level: str, path: Path = CPUINFO) -> tuple[str, str] | None:
    """(what this host's CPU lacks, the level to cap at instead) for ``level``, or None: it has
    the level, or its flags cannot be read."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    said = lacks(level, text)
    return None if said is None else (said, instead(level, text))
