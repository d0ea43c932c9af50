"""The first op whose output differs between two recordings of the same step
(``reproci.worker.audit.oprecord``): which aten op, in which module, at which source line, in
the forward pass, the backward pass or the optimizer, and by how much."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..entry_sections import FirstOp
from .divergence import tensor_magnitude


def load(path: Path) -> dict[str, Any]:
    import torch

    return torch.load(path, map_location="cpu", weights_only=True)


def first_op_difference(a: dict[str, Any], b: dict[str, Any]) -> FirstOp:
    """Where two recordings of one step part: ``{"found": True, "op": ..., "index": ...}``
    for the first op whose outputs differ (or where the sequence of ops itself differs),
    ``{"found": False, ...}`` when every op's outputs agree (the difference entered outside
    the step's ops: after the optimizer, or in state the step does not read)."""
    rows_a, rows_b = a.get("rows") or [], b.get("rows") or []
    aside: FirstOp | None = None  # a first differing op whose output enters neither loss nor gradients
    for i, (ra, rb) in enumerate(zip(rows_a, rows_b)):
        if ra["overload"] != rb["overload"]:
            out: FirstOp = {"found": True, "index": i, "ops": len(rows_a), "kind": "sequence", **_where(ra),
                            "other_op": f"aten::{rb['op']}"}
            if aside:
                out["aside"] = aside
            return out
        if ra["digest"] != rb["digest"]:
            out = {"found": True, "index": i, "ops": len(rows_a), "kind": "output", **_where(ra)}
            ka, kb = (a.get("kept") or {}).get(i), (b.get("kept") or {}).get(i)
            m = tensor_magnitude(ka, kb) if ka is not None and kb is not None else None
            if m is not None and m["elements_differing"]:  # else another of its outputs differs (one copy is kept)
                out.update({"max_abs": m["max_abs"], "max_ulp": m["max_ulp"],
                            "elements_differing": m["elements_differing"]})
            if ra.get("on_path") is False and rb.get("on_path") is False:
                # The loss and the gradients do not read it (a logging metric): look on for one they do.
                aside = aside or out
                continue
            if aside:
                out = {**out, "aside": _aside(aside)}
            return out
    if aside is not None:
        return aside
    if len(rows_a) != len(rows_b):
        i = min(len(rows_a), len(rows_b))
        longer = rows_a if len(rows_a) > len(rows_b) else rows_b
        return {"found": True, "index": i, "ops": len(rows_a), "kind": "sequence", **_where(longer[i])}
    return {"found": False, "ops": len(rows_a)}


def _aside(op: FirstOp) -> FirstOp:
    """The earlier differing op that the loss and the gradients do not read, in brief."""
    return {"op": op.get("op"), "module": op.get("module"), "source": op.get("source"), "phase": op.get("phase"),
            "index": op.get("index")}


def _where(row: dict[str, Any]) -> FirstOp:
    return {"op": f"aten::{row['op']}", "overload": row.get("overload"), "phase": row.get("phase"),
            "module": row.get("module"), "source": row.get("where"), "shape": row.get("shape"),
            "dtype": row.get("dtype")}
