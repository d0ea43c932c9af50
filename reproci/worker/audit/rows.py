"""What the audit records and writes, as its modules share it: a recorded op call and its row
(``oprecord``), an SDPA call (``attention``), a finding and the audit's JSON file (``audit``).
Declared apart from them, so that each reads the others' shapes without importing them.

Standard library only.
"""

from __future__ import annotations

from typing import TypedDict


class OpCall(TypedDict):
    """One recorded op call: what it was, where it ran, what it read and what it wrote."""

    op: str  # the aten op (overload packet)
    overload: str  # "aten.index_put.default"
    phase: str  # forward, backward, optimizer
    module: str | None  # the module path it ran in
    where: str | None  # "model.py:47 (forward)"
    reads: list[int]  # the rows whose outputs it read (data flow)
    shape: list[int]  # of its first output
    dtype: str
    device: str
    variant: str | None  # the argument that decides its CUDA behaviour (``variant``)
    digest: str | None  # its outputs' bits; None in the audit's inventory


class _Facts(TypedDict):
    grad: bool  # grad flows to a tensor input
    sparse: bool  # a tensor input is sparse


class AuditFacts(_Facts, total=False):
    """What the audit's conditions read from one call (``audit_facts``)."""

    duplicates: bool  # the indexed ops: whether the index repeats (absent: not checked)


class OpRow(OpCall, total=False):
    """A row of ``OpRecorder.rows``: the call, the audit's facts (the audit's recording), and
    whether it is on the loss's path (as saved, when the loss was marked)."""

    grad: bool
    sparse: bool
    duplicates: bool
    on_path: bool


class _CallInputs(TypedDict):
    q: list[int]  # the query's shape
    k: list[int]  # the key's shape
    dtype: str
    head_dim: int
    mask: str | None  # the explicit mask's dtype ("bool" for a boolean one), or None
    dropout: float
    causal: bool
    grad: bool  # grad flows to q, k or v


class AttentionCall(_CallInputs, total=False):
    """One SDPA call, as the audit records it: its inputs (``call_facts``), then, once it has
    run, the backend it ran (``ran``) and where it was made (``place``)."""

    ran: str
    place: str | None


class _Finding(TypedDict):
    op: str  # "aten::index_put (accumulate=True)", an attention backend, or a kernel torch warned about
    cuda: str  # RAISES, SLOWER or FILLS
    what: str  # what strict mode does
    advice: str  # the fix
    when: str  # the condition met, in words
    checked: str  # what the category was checked against
    device: str  # the device whose kernels it is about
    phases: list[str]
    count: int  # calls in the step
    where: list[str]  # up to three places
    why: str  # the sentence that says it all


class Finding(_Finding, total=False):
    """One finding of the audit: an op of the table that ran (with ``docs`` and ``duplicates``),
    an attention backend strict mode acts on (with ``ran``), or an op torch warned about."""

    docs: list[str]  # the items of torch's documentation the entry stands for
    duplicates: bool | None  # whether an index repeated in the step (None: not known)
    ran: list[str]  # the attention backends that ran here


class InventoryItem(TypedDict):
    """An op executed in the audited step, once per (op, phase)."""

    op: str  # "aten::addmm"
    phase: str
    count: int
    where: list[str]  # up to three places


class Audit(TypedDict):
    """The audit of one model (``audited_step``), as its JSON file holds it."""

    torch: str  # the version that ran it
    ops_executed: int
    warnings: list[str]  # torch's warnings about determinism in the step
    findings: list[Finding]  # most serious first
    attention: list[AttentionCall] | None
    inventory: list[InventoryItem]
