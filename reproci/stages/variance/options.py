"""The variance stage's options, read by attribute (``run.options.of(VarianceOptions)``)."""

from __future__ import annotations

from dataclasses import dataclass

from ...settings.declared import INTEGER, setting


@dataclass(frozen=True, kw_only=True)
class VarianceOptions:
    seeds: int = setting(
        5, type=int, yaml=INTEGER, convert=int,
        refuse=lambda v: None if v >= 2 else (f"must be at least 2 for a spread (got {v}); "
                                              "`reproci compare` needs at least 3 on each side"),
        help="Variance stage: strict runs per model, seeds --seed .. --seed + K - 1 (default 5).")
