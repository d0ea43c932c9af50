"""The throughput stage's options: flags of ``reproci run`` and keys of ``reproci.yaml``, read by
attribute (``run.options.of(ThroughputOptions)``)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...settings.declared import BOOLEAN, INTEGER, NUMBER, SECONDS, setting

# Seconds per model. On an H200 a quick-profile repetition (two processes launched and warmed up, 30 steps timed)
# took at most about 8 s (conv's and transformer's ten and part of embedding's: 80 s); 15 s a model, plus the last
# repetition's profiled steps and exit, keeps the three reference models within 60 s there
DEFAULT_TIME_BUDGET = 15.0


def _positive(v: float) -> bool:
    return math.isfinite(v) and v > 0


@dataclass(frozen=True, kw_only=True)
class ThroughputOptions:
    repetitions: int = setting(
        5, type=int, minimum=1, yaml=INTEGER, convert=int,
        refuse=lambda v: None if v >= 1 else f"must be at least 1 (got {v})",
        help="Throughput stage: interleaved repetitions per mode (at most; default 5).")
    time_budget: float = setting(
        DEFAULT_TIME_BUDGET, type=float, metavar="SECONDS", yaml=SECONDS, convert=float,
        refuse=lambda v: None if _positive(v) else
        f"must be a positive number of seconds, as {DEFAULT_TIME_BUDGET:g} (got {v:g})",
        help="Throughput stage: seconds a model's measurement may take; it stops when the slowdown's interval "
             f"reaches its target or this is spent, and says which (default {DEFAULT_TIME_BUDGET:g}).")
    slowdown_factor: float = setting(
        1.25, type=float, yaml=NUMBER, convert=float,
        refuse=lambda v: None if _positive(v) else f"must be a positive number, as 1.25 (got {v})",
        help="Throughput regression threshold against the golden (default 1.25).")
    slowdown_fails: bool = setting(
        False, flag=True, yaml=BOOLEAN, convert=bool, record=True,
        help="A throughput regression fails the run (exit 3) instead of warning.")
