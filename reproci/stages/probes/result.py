"""The portability probes' result: a model entry's ``probes`` section (``reproci.typed``), read by
attribute and written as the JSON it has always been: a row per probe, and the probes that found
a dependency."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from ... import typed


@dataclass(frozen=True, kw_only=True)
class ProbeRow:
    """One probe of a model: a setting changed, or the loader and the model inspected."""

    probe: str  # hash-seed, listing-order, num-workers, threads, epoch-order, batch-size
    factor: str = ""  # what it changes: 'PYTHONHASHSEED', 'a new sample order each epoch'
    change: str | None = None  # '0 → 1'; None for an inspection, and where the probe could not change it
    evidence: Mapping[str, Any] | None = None  # a divergence (entry_sections.Evidence), or what an inspection found
    status: str = ""  # depends, independent, not applicable, error
    message: str = ""  # the sentence every report shows


@dataclass(frozen=True, kw_only=True)
class ProbesResult(typed.Section):
    """The portability probes of one model (stages.probes)."""

    rows: list[ProbeRow] = field(default_factory=list)
    depends: list[str] = field(default_factory=list)  # the probes whose status is depends
    seconds: float = 0.0



def of(entry: Mapping[str, Any]) -> ProbesResult | None:
    """A model's probes, from its entry; None where its probes did not run."""
    section = entry.get("probes")
    return ProbesResult.from_json(section) if isinstance(section, Mapping) else None
