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
from dataclasses import dataclass
from typing import Any

import torch

RAISES, SLOWER, FILLS = "raises", "slower", "fills"
SEVERITY = {RAISES: 0, SLOWER: 1, FILLS: 2}


@dataclass(frozen=True)
class Entry:
    ops: tuple[str, ...]  # aten op names (the overload packet)
    cuda: str  # RAISES, SLOWER or FILLS
    doc: str | None  # the item of torch.use_deterministic_algorithms' docs this entry stands for
    what: str  # what happens on CUDA
    advice: str  # the fix, or the cost to expect
    variant: str | None = None  # only when the op was called with this argument (oprecord.variant)
    floating: bool = False  # only on floating-point outputs


_ATOMICS = "nondeterministic on CUDA (atomic adds) unless strict; strict mode uses a slower deterministic kernel"
_NO_KERNEL = "strict mode raises on CUDA: torch has no deterministic CUDA kernel for it"

TABLE: tuple[Entry, ...] = (
    Entry(("convolution_backward",), SLOWER, "torch.nn.Conv2d when called on CUDA tensor",
          "cuDNN is held to deterministic backward algorithms (benchmark off): slower",
          "the main cost of strict mode for conv nets (H200: conv reference 1.47× step time, "
          "convolution backward +316 %); channels_last and larger batches narrow it"),
    Entry(("index_put", "index_put_", "_index_put_impl_"), SLOWER, None, _ATOMICS + " (sorts the indices first)",
          "expected cost (H200: embedding reference 1.13× step time); comes from advanced-indexing "
          "backward (x[idx]) and index_put_(accumulate=True)", variant="accumulate=True"),
    Entry(("index_add", "index_add_"), SLOWER, "torch.index_add when called on CUDA tensor", _ATOMICS,
          "expected cost; also the backward of index_select"),
    Entry(("scatter_add", "scatter_add_"), SLOWER, "torch.Tensor.scatter_add_ when called on a CUDA tensor",
          _ATOMICS, "expected cost; also the backward of gather"),
    Entry(("scatter_reduce", "scatter_reduce_"), SLOWER, "torch.Tensor.scatter_reduce when reduce='sum'",
          _ATOMICS, "expected cost", variant="reduce=sum"),
    Entry(("scatter_reduce", "scatter_reduce_"), SLOWER, "torch.Tensor.scatter_reduce when reduce='sum'",
          _ATOMICS, "expected cost", variant="reduce=mean"),
    Entry(("index_copy", "index_copy_"), SLOWER, "torch.Tensor.index_copy when called on a CPU or CUDA tensor",
          "nondeterministic with repeated indices unless strict; strict mode serialises the copies", "expected cost"),
    Entry(("replication_pad1d_backward", "replication_pad2d_backward", "replication_pad3d_backward"), SLOWER,
          "torch.nn.ReplicationPad2d when attempting to differentiate a CUDA tensor", _ATOMICS, "expected cost"),
    Entry(("max_pool3d_with_indices_backward",), SLOWER, "torch.nn.MaxPool3d when attempting to differentiate",
          _ATOMICS, "expected cost"),
    Entry(("_adaptive_avg_pool2d_backward",), RAISES, "torch.nn.AdaptiveAvgPool2d when attempting to differentiate",
          _NO_KERNEL, "global pooling: x.mean(dim=(-2, -1)); a fixed ratio: nn.AvgPool2d with that kernel"),
    Entry(("_adaptive_avg_pool3d_backward",), RAISES, "torch.nn.AdaptiveAvgPool3d when attempting to differentiate",
          _NO_KERNEL, "global pooling: x.mean(dim=(-3, -2, -1)); a fixed ratio: nn.AvgPool3d"),
    Entry(("adaptive_max_pool2d_backward",), RAISES, "torch.nn.AdaptiveMaxPool2d when attempting to differentiate",
          _NO_KERNEL, "nn.MaxPool2d with the matching kernel, or amax over the spatial dims"),
    Entry(("avg_pool3d_backward",), RAISES, "torch.nn.AvgPool3d when attempting to differentiate", _NO_KERNEL,
          "a strided 3-d convolution with fixed 1/k³ weights, or mean over reshaped windows"),
    Entry(("fractional_max_pool2d_backward", "fractional_max_pool3d_backward"), RAISES,
          "torch.nn.FractionalMaxPool2d when attempting to differentiate", _NO_KERNEL, "nn.MaxPool2d"),
    Entry(("max_unpool2d", "max_unpool3d"), RAISES, "torch.nn.MaxUnpool2d", _NO_KERNEL,
          "a transposed convolution or interpolate(mode='nearest')"),
    Entry(("upsample_linear1d_backward", "upsample_bilinear2d_backward", "upsample_bicubic2d_backward",
           "upsample_trilinear3d_backward"), RAISES, "torch.nn.functional.interpolate when attempting to differentiate",
          _NO_KERNEL, "interpolate(mode='nearest') or a transposed convolution"),
    Entry(("reflection_pad1d_backward", "reflection_pad2d_backward", "reflection_pad3d_backward"), RAISES,
          "torch.nn.ReflectionPad2d when attempting to differentiate", _NO_KERNEL,
          "padding_mode='replicate' or 'zeros' (or reflect in the data pipeline, without grad)"),
    Entry(("nll_loss2d_forward",), RAISES, "torch.nn.NLLLoss when called on a CUDA tensor", _NO_KERNEL,
          "flatten to (N·H·W, C) and (N·H·W,) before the loss"),
    Entry(("_ctc_loss_backward",), RAISES, "torch.nn.CTCLoss when attempting to differentiate", _NO_KERNEL,
          "compute the CTC loss on CPU"),
    Entry(("_embedding_bag_backward", "_embedding_bag_dense_backward"), RAISES,
          "torch.nn.EmbeddingBag when attempting to differentiate a CUDA tensor when mode='max'", _NO_KERNEL,
          "mode='sum' or 'mean'", variant="mode=2"),
    Entry(("put_",), RAISES, "torch.Tensor.put_ when accumulate=False", _NO_KERNEL, "index_put_ or scatter_",
          variant="accumulate=False"),
    Entry(("put_",), RAISES, "torch.Tensor.put_ when accumulate=True and called on a CUDA tensor", _NO_KERNEL,
          "index_put_(..., accumulate=True)", variant="accumulate=True"),
    Entry(("histc",), RAISES, "torch.histc when called on a CUDA tensor", _NO_KERNEL,
          "torch.bucketize then bincount without weights"),
    Entry(("bincount",), RAISES, "torch.bincount when called on a CUDA tensor and weights", _NO_KERNEL,
          "scatter_add_ of the weights (deterministic, slower)", variant="weights=tensor"),
    Entry(("median",), RAISES, "torch.median with indices output when called on a CUDA tensor", _NO_KERNEL,
          "torch.sort and take the middle element"),
    Entry(("grid_sampler_2d_backward", "grid_sampler_3d_backward"), RAISES,
          "torch.nn.functional.grid_sample when attempting to differentiate", _NO_KERNEL,
          "no deterministic alternative in torch: keep the model out of the strict stage"),
    Entry(("cumsum",), RAISES, "torch.cumsum when called on a CUDA tensor when dtype is floating point", _NO_KERNEL,
          "a triangular matmul (short sequences) or cumsum in float64 on CPU", floating=True),
    Entry(("scatter_reduce", "scatter_reduce_"), RAISES, "torch.Tensor.scatter_reduce when reduce='prod'",
          _NO_KERNEL, "sum of logarithms with scatter_add_", variant="reduce=prod"),
    Entry(("empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"), FILLS, None,
          "strict mode fills its uninitialised output (NaN) on every device: one extra write per element",
          "small (H200: most of the transformer reference's 1.06×); torch.zeros where values are read"),
)

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
    if entry.doc is None:
        return entry.cuda, "table"
    found = next((section for item, section in docs.items() if item.startswith(entry.doc)), None)
    if found is None:
        return entry.cuda, f"not in torch {torch.__version__}'s list"
    if found == RAISES or entry.cuda != RAISES:
        return entry.cuda, f"torch {torch.__version__} docs"
    return SLOWER, f"torch {torch.__version__} docs list it as deterministic now"


def _matches(entry: Entry, row: dict[str, Any]) -> bool:
    if row["op"] not in entry.ops:
        return False
    if entry.variant is not None and row.get("variant") != entry.variant:
        return False
    if entry.ops == ("median",) and not str(row.get("overload", "")).startswith("aten.median.dim"):
        return False  # only median with indices
    return not entry.floating or "float" in str(row.get("dtype")) or "complex" in str(row.get("dtype"))


def inventory(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every op executed, once per (op, phase): its count and up to three places."""
    out: "OrderedDict[tuple[str, str], dict[str, Any]]" = OrderedDict()
    for r in rows:
        item = out.setdefault((r["op"], r["phase"]), {"op": f"aten::{r['op']}", "phase": r["phase"], "count": 0,
                                                       "where": []})
        item["count"] += 1
        place = _place(r)
        if place and place not in item["where"] and len(item["where"]) < 3:
            item["where"].append(place)
    return list(out.values())


def _place(row: dict[str, Any]) -> str | None:
    parts = [p for p in (row.get("module"), row.get("where")) if p]
    return " at ".join(parts) if parts else None


def findings(rows: list[dict[str, Any]], warned: list[str]) -> list[dict[str, Any]]:
    """The executed ops that strict determinism acts on, most serious first."""
    docs = documented()
    found: "OrderedDict[tuple[int, str], dict[str, Any]]" = OrderedDict()
    for r in rows:
        for i, entry in enumerate(TABLE):
            if not _matches(entry, r):
                continue
            category, checked = _doc_status(entry, docs)
            item = found.setdefault((i, r["op"]), {
                "op": f"aten::{r['op']}" + (f" ({r['variant']})" if r.get("variant") else ""), "cuda": category,
                "what": entry.what, "advice": entry.advice, "checked": checked, "phases": [], "count": 0,
                "where": []})
            item["count"] += 1
            if r["phase"] not in item["phases"]:
                item["phases"].append(r["phase"])
            place = _place(r)
            if place and place not in item["where"] and len(item["where"]) < 3:
                item["where"].append(place)
            break
    out = sorted(found.values(), key=lambda f: SEVERITY[f["cuda"]])
    for text in warned:  # on CUDA, torch's own word under warn_only
        op = text.split(" does not have a deterministic implementation")[0].split()[-1]
        if not any(op.replace("_cuda", "") in f["op"] for f in out):
            out.insert(0, {"op": op, "cuda": RAISES, "what": _NO_KERNEL, "advice": "replace the op",
                           "checked": "torch warned in this run", "phases": [], "count": 1, "where": []})
    return out


def audited_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, step: Any, path: str) -> Any:
    """Take one training step (``step()``) with every op recorded, and write the audit to
    ``path`` as JSON. Strict mode is in ``warn_only`` here (``determinism.make_deterministic``),
    so an op without a deterministic kernel warns instead of raising, and is listed."""
    from .oprecord import OpRecorder

    with warnings.catch_warnings(record=True) as caught, OpRecorder(model, optimizer, digests=False) as recorder:
        warnings.simplefilter("always")
        out = step()
    warned = sorted({str(w.message).splitlines()[0] for w in caught
                     if "does not have a deterministic implementation" in str(w.message)})
    audit = {"torch": torch.__version__, "ops_executed": len(recorder.rows), "warnings": warned,
             "findings": findings(recorder.rows, warned), "inventory": inventory(recorder.rows)}
    with open(path + ".tmp", "w") as f:
        json.dump(audit, f)
    os.replace(path + ".tmp", path)
    return out
