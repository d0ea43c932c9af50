"""The op audit: which ops of a model strict determinism acts on, and how, on CUDA.

One recorded training step (``oprecord.OpRecorder`` without digests) gives the inventory
of aten ops a model executes, forward, backward and optimizer, with counts, module paths
and source lines. ``TABLE`` says, for the ops strict determinism acts on, what happens on
CUDA: strict mode **raises** (no deterministic CUDA kernel), switches to a **slower**
deterministic kernel (the op is nondeterministic on CUDA otherwise), or **fills** its
uninitialised output. Each entry names the item of ``torch.use_deterministic_algorithms``'
own documentation it stands for, and that documentation is read from the torch in this
process: when a newer torch moves an op from "raises" to "deterministic", the audit says
so instead of repeating an old table. So a CPU run predicts what a GPU run will hit and
what will get slower; on CUDA the warnings torch gives under ``warn_only`` are kept too.
(Worker side: stdlib and torch only.)
"""

from __future__ import annotations

import json
import os
import re
import warnings
from collections import OrderedDict
from typing import Any

import torch

from . import module_text
from .audit_table import EXCLUDED, FILLS, RAISES, SLOWER, TABLE, Entry  # noqa: F401 (the table's names, here too)
from .rows import AttentionCall, Audit, Finding, InventoryItem, OpRow

SEVERITY = {RAISES: 0, SLOWER: 1, FILLS: 2}
_NO_KERNEL = "strict mode raises on CUDA: torch has no deterministic CUDA kernel for it"


_ITEM = re.compile(r"^\s*\*\s+(.*)$")


def _plain(text: str) -> str:
    """':class:`torch.nn.Conv2d` when ``mode='max'``' -> "torch.nn.Conv2d when mode='max'"."""
    return re.sub(r":\w+:`([^`]*)`", r"\1", text).replace("``", "").replace("`", "").strip()


def documented() -> dict[str, str]:
    """The running torch's own list: each item of ``torch.use_deterministic_algorithms``'
    documentation -> "deterministic" (acts deterministically in strict mode) or "raises"."""
    items: dict[str, str] = {}
    section, current = None, None
    for line in (torch.use_deterministic_algorithms.__doc__ or "").splitlines():
        if "will act" in line:
            section = "deterministic"
        elif "throw a" in line:
            section = RAISES
        elif line.strip().startswith("In addition"):
            section = None
        m = _ITEM.match(line)
        if m and section:
            current = _plain(m.group(1))
            items[current] = section
        elif current and section and line.startswith(" " * 10) and line.strip() and not line.strip().startswith("-"):
            text = f"{current} {_plain(line)}"  # a continuation line of the item
            items[text] = items.pop(current)
            current = text
        elif not line.strip():
            current = None
    return items


def _doc_status(entry: Entry, docs: dict[str, str]) -> tuple[str, str]:
    """(category, check) of an entry against the running torch's documentation."""
    if not entry.docs:
        return entry.cuda, "table"
    found = next((section for item, section in docs.items() if any(item.startswith(d) for d in entry.docs)), None)
    if found is None:
        return entry.cuda, f"not in torch {torch.__version__}'s list"
    if found == RAISES or entry.cuda != RAISES:
        return entry.cuda, f"torch {torch.__version__} docs"
    return SLOWER, f"torch {torch.__version__} docs list it as deterministic now"


def completeness(docs: dict[str, str] | None = None) -> dict[str, list[str]]:
    """The table against the running torch's list, both ways: items no entry stands for (and
    that are not excluded), and entries' items the docs no longer have."""
    docs = documented() if docs is None else docs
    claimed = [d for e in TABLE for d in e.docs]
    missing = [item for item in docs if not any(item.startswith(d) for d in claimed)
               and not any(item.startswith(x) for x in EXCLUDED)]
    stale = [d for d in dict.fromkeys(claimed) if not any(item.startswith(d) for item in docs)]
    return {"missing": missing, "stale": stale}


def _matches(entry: Entry, row: OpRow, device: str) -> bool:
    if row["op"] not in entry.ops or not entry.applies(row):
        return False
    return entry.device == "cuda" or entry.device == device  # CPU entries: only where the run is on the CPU


def inventory(rows: list[OpRow]) -> list[InventoryItem]:
    """Every op executed, once per (op, phase): its count and up to three places."""
    out: "OrderedDict[tuple[str, str], InventoryItem]" = OrderedDict()
    for r in rows:
        item = out.setdefault((r["op"], r["phase"]), {"op": f"aten::{r['op']}", "phase": r["phase"], "count": 0,
                                                       "where": []})
        item["count"] += 1
        place = _place(r)
        if place and place not in item["where"] and len(item["where"]) < 3:
            item["where"].append(place)
    return list(out.values())


def _place(row: OpRow) -> str | None:
    parts = [p for p in (module_text(row["module"]) if row["module"] else None, row["where"]) if p]
    return " at ".join(parts) if parts else None


def findings(rows: list[OpRow], warned: list[str], device: str = "cpu",
             attention: list[AttentionCall] | None = None) -> list[Finding]:
    """The executed ops that strict determinism acts on, most serious first, each with the
    condition it met (``why``); the attention calls' predicted CUDA backends (``attention``);
    ops torch itself warned about in this run."""
    docs = documented()
    found: "OrderedDict[tuple[int, str], Finding]" = OrderedDict()
    for r in rows:
        for i, entry in enumerate(TABLE):
            if not _matches(entry, r, device):
                continue
            category, checked = _doc_status(entry, docs)
            item = found.setdefault((i, r["op"]), {
                "op": f"aten::{r['op']}" + (f" ({r['variant']})" if r["variant"] else ""), "cuda": category,
                "what": entry.what, "advice": entry.advice, "checked": checked, "when": entry.when,
                "device": entry.device, "docs": list(entry.docs), "phases": [], "count": 0, "where": [], "duplicates": None,
                "why": ""})  # the why, once every call is counted
            item["count"] += 1
            if r["phase"] not in item["phases"]:
                item["phases"].append(r["phase"])
            if r.get("duplicates") is not None:
                item["duplicates"] = bool(item["duplicates"]) or r["duplicates"]
            place = _place(r)
            if place and place not in item["where"] and len(item["where"]) < 3:
                item["where"].append(place)
    for item in found.values():
        item["why"] = _why(item)
    out = sorted([*found.values(), *attention_findings(attention or [])], key=lambda f: SEVERITY[f["cuda"]])
    for text in warned:  # on CUDA, torch's own word under warn_only
        if "does not have a deterministic implementation" not in text:
            continue  # kept in the audit's warnings (an attention backend's, say), not an op of its own
        op = text.split(" does not have a deterministic implementation")[0].split()[-1]
        if not any(_kernel_op(op) in f["op"] for f in out):
            out.insert(0, {"op": op, "cuda": RAISES, "what": _NO_KERNEL, "advice": "replace the op", "when": "in this run",
                           "why": f"{op}: torch warned in this run: {_NO_KERNEL}", "device": "cuda",
                           "checked": "torch warned in this run", "phases": [], "count": 1, "where": []})
    return out


def _kernel_op(kernel: str) -> str:
    """The op a warning's kernel name belongs to: 'max_unpooling3d_forward_out' -> 'max_unpool3d'."""
    op = re.sub(r"_(cuda|forward_out|out|forward)$", "", kernel)
    return re.sub(r"_(cuda|forward_out|out|forward)$", "", op).replace("unpooling", "unpool")


def _why(item: Finding) -> str:
    """'aten::index_put (accumulate=True) with accumulate=True ...: nondeterministic on CUDA ...'."""
    repeats = {True: "; repeated indices in this step: the order of the writes changes the result",
               False: "; no index repeats in this step's calls: the result does not depend on the order here, but "
                      "strict mode still takes the slower kernel", None: ""}[item.get("duplicates")]
    return f"{item['op']} {item['when']} ({', '.join(item['phases'])}): {item['what']}{repeats}"


def attention_findings(calls: list[AttentionCall]) -> list[Finding]:
    from .attention import findings as predicted

    return predicted(calls)


def audited_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, step: Any, path: str) -> Any:
    """Take one training step (``step()``) with every op and attention call recorded, and write
    the audit to ``path`` as JSON. Strict mode is in ``warn_only`` here
    (``determinism.make_deterministic``), so an op without a deterministic kernel warns instead
    of raising, and is listed; every warning about determinism torch gives is kept."""
    from .oprecord import OpRecorder

    with warnings.catch_warnings(record=True) as caught, OpRecorder(model, optimizer, digests=False) as recorder:
        warnings.simplefilter("always")
        out = step()
    warned = sorted({str(w.message).splitlines()[0] for w in caught if "determinis" in str(w.message).lower()})
    device = next((r["device"] for r in recorder.rows if r["device"]), "cpu")
    audit: Audit = {"torch": torch.__version__, "ops_executed": len(recorder.rows), "warnings": warned,
             "findings": findings(recorder.rows, warned, device, recorder.attention),
             "attention": recorder.attention, "inventory": inventory(recorder.rows)}
    with open(path + ".tmp", "w") as f:
        json.dump(audit, f)
    os.replace(path + ".tmp", path)
    return out
