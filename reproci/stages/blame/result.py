"""The upgrade blame's result: a model entry's ``blame`` section (``reproci.typed``), read by
attribute and written as the JSON it has always been.

A try is the golden's image with one group (or a pair of groups) of the new image's packages,
and what the model's run in it showed. A blame that was refused (no image, no image ID in the
golden) says only that: its ``culprit`` (None) and its ``message``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ... import typed


@dataclass(frozen=True, kw_only=True)
class BlameCost:
    """What the blame had cost when this model's result was written (its images are shared)."""

    images_built: int
    runs: int
    seconds: float  # the blame's own, images built included


@dataclass(frozen=True, kw_only=True)
class BlameTry:
    """The golden's image with one group (or a pair) of the new image's packages."""

    group: list[str]
    moves: list[str]  # 'torch 2.13.0 → 2.14.1'
    pair: bool | None = typed.key(omit_none=True, default=None)  # True: two groups together
    outcome: str  # reproduces, does not, changes otherwise, cannot swap
    why: str | None = typed.key(omit_none=True, default=None)  # cannot swap: why
    from_step: int | None = typed.key(omit_none=True, default=None)  # reproduces: the first step that differs


@dataclass(frozen=True, kw_only=True)
class Reproduced(BlameTry):
    """A try that reproduces the change: its ``from_step`` is written even when None (no step of
    its checksums differs from the golden's)."""

    from_step: int | None = typed.key(default=None)


@dataclass(frozen=True, kw_only=True)
class Blame(typed.Section):
    """The upgrade blame of one model by package group (``stages.blame``)."""

    steps: int | None = typed.key(omit_none=True, default=None)  # the runs' length: the golden's first differing step + 1
    tried: list[BlameTry] | None = typed.key(omit_none=True, default=None)  # each package group alone
    pairs: list[BlameTry] | None = typed.key(omit_none=True, default=None)  # two groups together, where none alone did
    culprit: list[str] | None = None  # the group that reproduces the change
    message: str = ""
    cost: BlameCost | None = typed.key(omit_none=True, default=None)

