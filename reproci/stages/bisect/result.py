"""The bisection's result: a model entry's ``bisect`` section (``reproci.typed``), read by
attribute and written as the JSON it has always been.

A row is one factor of the bisection, in the order the factors were tried. A row of a factor that
was already off says only that; a factor turned off (or put back to the golden's) says what it was
and what it became, and whether the runs then agreed. A factor turned off in a failing pair's
re-run is a ``PairRow``: its ``evidence`` is written even where there is none (null: the pair agreed).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ... import typed
from ...entry_sections import Evidence


@dataclass(frozen=True, kw_only=True)
class BisectRow:
    """One factor of a bisection."""

    factor: str  # a factor's name (compile, amp, ...) or, for a drift, the golden's setting put back
    status: str  # already off, turned off, put back, error
    from_: str | None = typed.key(name="from", omit_none=True, default=None)  # the factor's state in the failing check
    to: str | None = typed.key(omit_none=True, default=None)  # what it was turned to
    equal: bool | None = typed.key(omit_none=True, default=None)  # the runs agreed (None: no run finished)
    evidence: Evidence | None = typed.key(omit_none=True, default=None)  # where the pair still differs
    note: str | None = typed.key(omit_none=True, default=None)
    message: str | None = typed.key(omit_none=True, default=None)  # error: why the run failed


@dataclass(frozen=True, kw_only=True)
class PairRow(BisectRow):
    """A factor turned off and the failing pair re-run: its ``evidence`` is written even when
    None (the pair agreed), so that a reader tells "agreed" from "not compared"."""

    evidence: Evidence | None = typed.key(default=None)


@dataclass(frozen=True, kw_only=True)
class Bisect(typed.Section):
    """The bisection by configuration of one model (``stages.bisect``)."""

    check: str | None = None  # 'A vs B', 'A vs the golden'; None: not bisected
    verdict: str | None = None  # the verdict it bisected
    stages: list[BisectRow] = field(default_factory=list)
    culprit: str | None = None  # the factor whose change restored equality
    runs: int = 0
    steps: int | None = None  # the runs' length: to the first differing step plus one
    message: str = ""
    seconds: float = 0.0

