"""The op audit's result: a model entry's ``audit`` section (``reproci.typed``), read by attribute
and written as the JSON it has always been. A model that could not be audited has only ``error``
and ``seconds``; every other key is the audit's, left out then.

Its findings are the worker's (``reproci/worker/audit/audit.py`` and ``attention.py`` write them):
``Finding`` declares every key they carry, ``Inventoried`` an op of the inventory. The attention
calls stay the worker's dicts: no report reads them, they are kept for the reader of results.json.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, TypedDict

from ... import typed
from ...typed import Error


@dataclass(frozen=True, kw_only=True)
class Finding:
    """An executed op (or an attention call's predicted CUDA backend) that strict determinism acts on."""

    op: str  # 'aten::index_put (accumulate=True)', 'scaled_dot_product_attention → flash on CUDA'
    cuda: str  # what strict determinism does to it: raises, slower, fills
    what: str = ""  # what strict determinism does, in a sentence
    advice: str = ""  # the fix, or the cost
    checked: str = ""  # where the table's entry was checked (the torch docs, sdp_utils, a warning in this run)
    when: str = ""  # the condition under which the entry applies
    device: str = "cuda"  # where strict determinism acts on it (a result from before the key: CUDA)
    docs: list[str] | None = typed.key(omit_none=True, default=None)  # the table's own entries only
    phases: list[str] = field(default_factory=list)  # forward, backward, optimizer
    count: int = 0  # calls in the audited step
    where: list[str] = field(default_factory=list)  # up to three places: module at file:line
    ran: list[str] | None = typed.key(omit_none=True, default=None)  # an attention call's: the backends that ran
    duplicates: bool | None = typed.key(omit_none=True, default=None)  # an index op's: repeated indices seen
    why: str | None = typed.key(omit_none=True, default=None)  # the sentence that says which condition it met



class Inventoried(TypedDict):
    """An op executed in the audited step, once per (op, phase): a row of the worker's inventory."""

    op: str  # 'aten::addmm'
    phase: str
    count: int
    where: list[str]  # up to three places


@dataclass(frozen=True, kw_only=True)
class AuditResult(typed.Section):
    """The ops a model runs, and what strict determinism does to them on CUDA (stages.audit)."""

    torch: str | None = typed.key(omit_none=True, default=None)  # the audited torch's version
    device: str | None = typed.key(omit_none=True, default=None)
    ops_executed: int | None = typed.key(omit_none=True, default=None)
    distinct_ops: int | None = typed.key(omit_none=True, default=None)
    counts: dict[str, int] | None = typed.key(omit_none=True, default=None)  # raises, slower, fills
    findings: list[Finding] | None = typed.key(omit_none=True, default=None)  # most serious first
    warnings: list[Any] | None = typed.key(omit_none=True, default=None)  # torch's own, under warn_only
    attention: list[dict[str, Any]] | None = typed.key(omit_none=True, default=None)  # each SDPA call: inputs,
    # the predicted CUDA backend's facts, what ran
    inventory: list[Inventoried] | None = typed.key(omit_none=True, default=None)  # op, phase, count, where
    record: str | None = typed.key(omit_none=True, default=None)  # the worker's audit.json, relative to the run
    error: Error | None = typed.key(omit_none=True, default=None)  # the only key beside seconds when it failed
    seconds: float = 0.0



def of(entry: Mapping[str, Any]) -> AuditResult | None:
    """A model's audit, from its entry; None where the model was not audited."""
    section = entry.get("audit")
    return AuditResult.from_json(section) if isinstance(section, Mapping) else None
