"""What the determinism stage says about a model: the sentence of its verdict, the evidence
it records, and the determinism controls the model switched off."""

from __future__ import annotations

from typing import Any, cast

from ... import verdicts
from ...entry_sections import Evidence, SwitchedControl
from ...golden.divergence import Divergence, presence_text
from ...worker.run_record import RunRecord
from . import beyond_tensors


def controls_switched_off(records: dict[str, RunRecord]) -> list[SwitchedControl]:
    """Determinism controls switched off during any run: by the model's own calls (with
    file:line), or found off by a re-attestation (at the checkpoint, at the end)."""
    found: dict[tuple[Any, ...], SwitchedControl] = {}
    for role, rec in records.items():
        for e in rec.controls["switched_off"] if rec.controls else []:
            key: tuple[str, str | None, int | None] = (e["control"], e["file"], e["line"])
            found.setdefault(key, cast(SwitchedControl, {**e, "runs": []}))["runs"].append(role)  # the worker's keys
        for when, att in rec.attestations.items():
            if when == "start" or att["ok"]:
                continue
            for control, c in att["checks"].items():
                if c["ok"] or any(f["control"] == control for f in found.values()):
                    continue
                key = (control, None, None)
                found.setdefault(key, {"control": control, "value": repr(c["actual"]), "where": None,
                                       "step": None, "found_at": when, "runs": []})["runs"].append(role)
    return list(found.values())


def controls_sentence(switched: list[SwitchedControl]) -> str:
    parts = []
    for e in switched[:3]:
        if e.get("where"):
            when = "before the first step" if e.get("step") == 0 else f"in step {e['step']}"
            parts.append(f"{e['control']} set to {e['value']} at {e['where']} ({e.get('function', '?')}, {when})")
        else:
            parts.append(f"{e['control']} was {e['value']} at the {e['found_at']} (set where torch could not be watched)")
    return "determinism controls switched off by the model: " + "; ".join(parts)


def comparison_evidence(ev: Divergence | None, pair: tuple[str, str] | None, switched: list[SwitchedControl],
                        hint: str | None = None, rank: int | None = None) -> Evidence | None:
    """The evidence a model's entry records of a comparison of two runs: where the ``pair`` first differs
    (``ev``), the determinism controls the model switched off, a hint, the rank it was found on."""
    if ev is None and not switched:
        return None
    out: Evidence = {"comparison": f"{pair[0]} vs {pair[1]}", **ev.to_dict()} if ev and pair else {
        "comparison": None, "step": None, "tensor": None, "kind": None, "cause": "controls"}
    if ev is not None and ev.only_in and pair is not None:  # "a"/"b" -> the run that has the tensor
        out["only_in"] = pair[0] if ev.only_in == "a" else pair[1]
        out["presence"] = presence_text(ev.tensor or "?", ev.step, *_sides(ev, pair))
    if rank is not None and pair is not None:  # found on another rank than 0
        out.update({"rank": rank, "comparison": (f"run {pair[0]}: rank 0 vs rank {rank}" if pair[0] == pair[1]
                                                 else f"{pair[0]} vs {pair[1]} on rank {rank}")})
    if switched:
        out["controls"] = switched
    if hint:
        out["hint"] = hint
    return out


def _sides(ev: Divergence, pair: tuple[str, str]) -> tuple[str, str]:
    """(the run that has the divergence's tensor at its step, the run that does not)."""
    return (pair[0], pair[1]) if ev.only_in == "a" else (pair[1], pair[0])


def describe(verdict: str, ev: Divergence | None, pair: tuple[str, str] | None,
             switched: list[SwitchedControl] | None = None) -> str:
    controls = controls_sentence(switched) if switched else ""
    if ev is None or pair is None:
        if controls:
            return f"A = B = C here, but not under strict determinism: {controls}"
        return "A = B = C: bitwise reproducible, resume exact"
    if ev.cause in ("eval", "extra", "scaler"):
        text = beyond_tensors.describe(ev, pair)
        return f"{text}; {controls}" if controls else text
    d = ev.to_dict()
    text = f"{pair[0]} ≠ {pair[1]} {verdicts.where_text(d)}"
    if pair == ("A", "W"):
        text = (f"cache-dependent compilation: A (cold inductor caches) ≠ W (A again, on A's warm caches) "
                f"{verdicts.where_text(d)}")
    if ev.cause == "init":
        text += f" ({ev.differing_tensors} differ): the initial parameters/buffers are not seeded"
    elif ev.cause == "restore":
        text += f" ({ev.differing_tensors} tensors differ): the checkpoint does not restore it"
    else:
        # A tensor in one run only has no magnitude: say which run has it, never |Δ| 0.
        mag = ("which exists in {} at that step, not in {}".format(*_sides(ev, pair)) if ev.only_in
               else verdicts.magnitude_text(d))
        cause = f"; {verdicts.cause_text(d)}" if ev.cause in ("data", "compute") else ""
        loss = "; losses still equal" if ev.losses_equal else ""
        op = f"; first differing op: {verdicts.op_text(ev.op)}" if ev.op else ""
        text += f"{', ' + mag if mag else ''}{cause}{op}{loss}"
    return f"{text}; {controls}" if controls else text
