"""A model entry's ``golden`` section (the comparison with the image's golden) and the document's
``golden`` outcome (the golden file, and whether this run recorded it), as frozen dataclasses
(``reproci.typed``), read by attribute and written as the JSON they have always been.

The results document stays plain JSON: ``of(entry)`` and ``outcome_of(document)`` read these
sections where they are read, ``to_json`` writes one back. The shapes of the JSON are declared for
the readers that keep the dict too (``entry_sections.GoldenComparison``, ``results.GoldenOutcome``).

A comparison always says the golden's file, final hash and image, the package and environment
changes and the evidence (None: no drift); a comparison with a golden says when it was recorded
(``recorded_at``, None where the golden's entry does not say), one without a golden (``NoGolden``,
verdict NEW) does not.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from .. import typed
from ..entry_sections import Evidence, GoldenComparison
from ..results import GoldenOutcome


@dataclass(frozen=True, kw_only=True)
class GoldenImage:
    """The image a golden was recorded in, as its file says (any of them may be missing there)."""

    name: str | None = None
    reference: str | None = None
    digest: str | None = None


@dataclass(frozen=True, kw_only=True)
class Confirmation:
    """A re-run with the golden's settings that proves a drift's cause (stages.determinism.golden_cause)."""

    confirmed: bool | None = None  # None: not run (the golden's settings cannot be set here)
    settings: dict[str, Any] = field(default_factory=dict)  # what was put back: cpu_isa, env, threads, world_size
    steps: int | None = typed.key(omit_none=True, default=None)  # the re-run's length
    unsettable: list[str] = field(default_factory=list)
    seconds: float | None = typed.key(omit_none=True, default=None)


@dataclass(frozen=True, kw_only=True)
class Comparison:
    """A model against the image's golden (``golden.drift.compare``)."""

    file: str | None = None  # the golden file; None: there is none
    golden_final_sha256: str | None = None
    golden_image: GoldenImage | None = None
    package_diff: dict[str, list[Any]] = field(default_factory=dict)  # package -> [golden's, this run's]
    env_diff: dict[str, list[Any]] = field(default_factory=dict)  # environment key -> [golden's, this run's]
    evidence: Evidence | None = None  # where the run first leaves the golden's trajectory
    recorded_at: str | None = None
    verdict: str = ""
    why: str | None = typed.key(omit_none=True, default=None)  # the changes that explain a drift
    identity_diff: dict[str, list[Any]] | None = typed.key(omit_none=True, default=None)  # MODEL_CHANGED: what makes the model another one
    message: str = ""
    upgrade_checked: bool | None = typed.key(omit_none=True, default=None)  # a passing run after an upgrade
    recorded: bool | None = typed.key(omit_none=True, default=None)  # this run recorded the golden (--update-golden)
    confirmation: Confirmation | None = typed.key(omit_none=True, default=None)

    def to_json(self) -> GoldenComparison:
        data: GoldenComparison = typed.dump(self)
        return data

    @classmethod
    def from_json(cls, data: Any) -> Comparison:
        return typed.load(cls, data)


@dataclass(frozen=True, kw_only=True)
class NoGolden(Comparison):
    """No golden to compare with (NEW): it says nothing of when one was recorded."""

    recorded_at: str | None = typed.key(omit_none=True, default=None)


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """The document's ``golden``: the image's golden file, and whether this run recorded it (``golden.check``)."""

    update_command: str = ""  # the command that records it
    file: str = ""  # the image's golden file
    existed: bool = False
    updated: bool = False  # this run recorded it (--update-golden)
    refused: str | None = typed.key(omit_none=True, default=None)  # why it was not recorded

    def to_json(self) -> GoldenOutcome:
        data: GoldenOutcome = typed.dump(self)
        return data

    @classmethod
    def from_json(cls, data: Any) -> Outcome:
        return typed.load(cls, data)


def of(entry: Mapping[str, Any]) -> Comparison | None:
    """A model's comparison with the golden, from its entry (or a merged matrix's model); None where
    it was not compared."""
    section = entry.get("golden")
    return Comparison.from_json(section) if isinstance(section, Mapping) else None


def outcome_of(document: Mapping[str, Any]) -> Outcome | None:
    """The document's golden outcome; None where the golden check did not run."""
    section = document.get("golden")
    return Outcome.from_json(section) if isinstance(section, Mapping) else None
