"""Attention in the audit: each ``scaled_dot_product_attention`` call, the CUDA backend it
would take, and what strict mode does to that backend.

On the CPU, SDPA runs a fused CPU kernel or the math path, so the ops recorded never show what
a GPU will run. The call's inputs decide it (PyTorch's selection in ``sdp_utils``, in its
priority order): flash attention takes fp16/bf16 without an explicit mask and a head dimension
that is a multiple of 8 up to 256; memory-efficient attention takes fp32 too and explicit masks;
the math path takes the rest. The memory-efficient backward is nondeterministic by default
(torch warns "Memory Efficient attention defaults to a non-deterministic algorithm"); strict
mode makes it deterministic, slower. On a GPU the backend that actually ran is recorded beside
the prediction (the aten op the call dispatched to), so the two can be compared.
(Worker side: stdlib and torch only.)
"""

from __future__ import annotations

from typing import Any

import torch

from .rows import AttentionCall, Finding, OpRow

SLOWER = "slower"
RAN = {"_scaled_dot_product_flash_attention": "flash", "_scaled_dot_product_efficient_attention": "memory-efficient",
       "_scaled_dot_product_cudnn_attention": "cuDNN", "_scaled_dot_product_flash_attention_for_cpu": "CPU flash",
       "_scaled_dot_product_fused_attention_overrideable": "a device's own fused kernel"}
STRICT = {
    "flash": (None, "flash attention: not switched by strict mode (its backward is deterministic as torch dispatches "
                    "it); the GPU check records what runs"),
    "memory-efficient": (SLOWER, "memory-efficient attention: its backward is nondeterministic by default; strict mode "
                                 "makes it take a deterministic path: slower"),
    "math": (None, "the math path (matmuls and a softmax): deterministic, the slowest and largest in memory"),
}
FIX = ("to stay off the memory-efficient backward: fp16/bf16 inputs (--amp bf16) without an explicit mask "
       "(is_causal=True instead of a causal mask; no padding mask) select flash attention; else accept the "
       "deterministic path's cost (measured on CUDA by benchmarks/gpu_check.sh)")




def call_facts(args: tuple[Any, ...], kwargs: dict[str, Any]) -> AttentionCall:
    """What decides the backend of one SDPA call: shapes, dtype, mask, dropout, causal, grad."""
    q, k = args[0], args[1]
    mask = kwargs.get("attn_mask", args[3] if len(args) > 3 else None)
    dropout = kwargs.get("dropout_p", args[4] if len(args) > 4 else 0.0)
    causal = kwargs.get("is_causal", args[5] if len(args) > 5 else False)
    return {"q": list(q.shape), "k": list(k.shape), "dtype": str(q.dtype), "head_dim": int(q.shape[-1]),
            "mask": None if mask is None else ("bool" if mask.dtype == torch.bool else str(mask.dtype)),
            "dropout": float(dropout), "causal": bool(causal),
            "grad": any(isinstance(t, torch.Tensor) and t.requires_grad for t in args[:3])}


def predict(f: AttentionCall) -> tuple[str, str]:
    """(the backend CUDA would run, why) for one call's facts."""
    half = f["dtype"] in ("torch.float16", "torch.bfloat16")
    hd = f["head_dim"]
    if half and f["mask"] is None and hd <= 256 and hd % 8 == 0:
        return "flash", f"{_dtype(f)}, no explicit mask, head dim {hd}"
    why = [w for w in (None if half else f"{_dtype(f)} (flash takes fp16/bf16 only)",
                       f"a {f['mask']} attention mask (flash takes none)" if f["mask"] else None,
                       f"head dim {hd}" if hd > 256 or hd % 8 else None) if w]
    if f["dtype"] in ("torch.float16", "torch.bfloat16", "torch.float32") and hd % (8 if half else 4) == 0:
        return "memory-efficient", ", ".join(why)
    return "math", ", ".join(why + [f"{_dtype(f)}, head dim {hd}: no fused kernel takes it"])


def _dtype(f: AttentionCall) -> str:
    return f["dtype"].removeprefix("torch.")


def ran(rows: list[OpRow]) -> str:
    """The backend one call dispatched to, from the ops recorded during it."""
    return next((RAN[r["op"]] for r in rows if r["op"] in RAN), "math")


def findings(calls: list[AttentionCall]) -> list[Finding]:
    """One finding per predicted backend that strict mode acts on (with grad flowing), with
    every call's prediction and what ran beside it."""
    out: dict[str, Finding] = {}
    for c in calls:
        backend, why = predict(c)
        category, what = STRICT[backend]
        if category is None or not c["grad"]:
            continue
        item = out.setdefault(backend, {
            "op": f"scaled_dot_product_attention → {backend} on CUDA", "cuda": category, "what": what, "advice": FIX,
            "when": f"predicted from the call's inputs: {why}", "checked": "sdp_utils selection rules",
            "phases": ["forward", "backward"], "count": 0, "where": [], "ran": [], "device": "cuda",
            "why": ""})  # the why, once every call is counted
        item["count"] += 1
        place, backend_ran = c.get("place"), c.get("ran")
        if place and place not in item["where"] and len(item["where"]) < 3:
            item["where"].append(place)
        if backend_ran and backend_ran not in item["ran"]:
            item["ran"].append(backend_ran)
    for item in out.values():
        item["why"] = f"{item['op']} ({item['when']}; ran here: {', '.join(item['ran']) or '?'}): {item['what']}"
    return list(out.values())
