"""The rows every report shows, formatted once: per model throughput, slowdown, top ops."""

from __future__ import annotations

from typing import Any, TypedDict

from ..entry_sections import ModeSummary, Slowdown, Throughput
from ..results import ModelEntry, ResultsDocument


def ranked_job(world_size: int) -> str:
    """How a throughput mode ran above one rank, for the reports' explanations."""
    return f"job of {world_size} ranks under DDP, timed by rank 0"


def slowdown_text(sd: Slowdown | None) -> str:
    """'1.23× [1.20, 1.26]', with how many paired steps it took when sampled sequentially
    and how the sampling stopped ('±1.8 %, settled', 'budget spent at ±4.1 %'), and
    '(wider than the ±2.0 % target)' or, for a fixed count of repetitions, '(noisy)'
    when the interval is wide; '-' when not measured."""
    if not sd or sd.get("median") is None:
        return "-"
    text = f"{sd['median']:.3f}× [{sd['ci_low']:.3f}, {sd['ci_high']:.3f}]"
    if sd.get("pairs") is not None:
        text += f", {sd['pairs']} pairs"
    if sd.get("how_stopped"):
        text += f", {sd['how_stopped']}"
    if sd.get("target_half_width") is not None:
        return text if sd.get("within_target") else text + f" (wider than the ±{sd['target_half_width']:.1%} target)"
    return text + " (noisy)" if sd.get("noisy") else text


def sampling_text(model: str, t: Throughput) -> str | None:
    """How a sequentially sampled slowdown was measured and why it stopped; None otherwise."""
    sd = t.get("slowdown") or {}
    if sd.get("stopped") is None:
        return None
    per = " + ".join(str(n) for n in sd.get("pairs_per_repetition", []))
    return (f"{model}: {t.get('repetitions')} repetitions, {per} pairs "
            f"(after {sum(sd.get('warmup_rounds_dropped', []))} unsettled rounds dropped): {sd['stopped']}")


def rate_text(mode: ModeSummary | None) -> str:
    if not mode or not mode.get("steps_per_s"):
        return "-"
    text = f"{mode['steps_per_s']:.1f}"
    if mode.get("samples_per_s"):
        text += f" ({mode['samples_per_s']:,.0f} samples/s)"
    return text


def bytes_text(n: float | None) -> str:
    if not n:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return "-"


def op_text(op: dict[str, Any]) -> str:
    """'aten::index_add_ +40 % (+0.120 ms/step, 35 % of the added time)'."""
    growth = "new" if op.get("growth") is None else f"{op['growth'] * 100:+.0f} %"
    share = f", {op['share'] * 100:.0f} % of the added time" if op.get("share") is not None else ""
    return f"{op['op']} {growth} ({op['delta_ms']:+.3f} ms/step{share})"


def golden_verdict(m: ModelEntry) -> str:
    """The model's verdict, with the golden comparison's when it says more."""
    v = str(m.get("verdict", "?"))
    g = m.get("golden")
    gv = g.get("verdict") if isinstance(g, dict) else None
    return v if not gv or gv == v else f"{v} (golden: {gv})"


class ThroughputRow(TypedDict):
    """A model's throughput as every report shows it (``throughput_rows``)."""

    model: str | None
    verdict: str
    error: str | None
    modes: dict[str, ModeSummary]
    slowdown: Slowdown
    slowdowns: dict[str, Slowdown]
    top_ops: list[dict[str, Any]]
    regression: str | None
    strict: str
    default: str
    slowdown_text: str
    memory: str
    memory_kind: str | None


def throughput_rows(document: ResultsDocument) -> list[ThroughputRow]:
    """One row per model that has a throughput result (measured or failed)."""
    rows: list[ThroughputRow] = []
    for m in document.get("models", []):
        t = m.get("throughput")
        if not isinstance(t, dict):
            continue
        modes = t.get("modes") or {}
        rows.append({
            "model": m.get("model"), "verdict": golden_verdict(m), "error": (t.get("error") or {}).get("message"),
            "modes": modes, "slowdown": t.get("slowdown") or {}, "slowdowns": t.get("slowdowns") or {},
            "top_ops": t.get("top_ops") or [], "regression": t.get("regression"),
            "strict": rate_text(modes.get("strict")), "default": rate_text(modes.get("default")),
            "slowdown_text": slowdown_text(t.get("slowdown")),
            "memory": " / ".join(bytes_text((modes.get(k) or ModeSummary()).get("peak_memory_bytes")) for k in ("strict", "default")),
            "memory_kind": (modes.get("strict") or {}).get("peak_memory_kind"),
        })
    return rows
