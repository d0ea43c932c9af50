"""Per-op hashes kept with a golden (``reproci/stages/golden_ops.py``): a later run in
another environment names the first op whose output changed, without the old one."""

from __future__ import annotations

from types import SimpleNamespace

from reproci import verdicts
from reproci.golden import store
from reproci.stages.base import StageRun
from reproci.stages.determinism import golden_ops
from tests.helpers import PLUGINS, model_entry


def _rows(*digests: str) -> list[dict]:
    return [{"op": f"op{i}", "overload": f"aten.op{i}.default", "phase": "backward", "module": "conv",
             "where": "m.py:3 (forward)", "digest": d} for i, d in enumerate(digests)]


def test_the_first_changed_op_is_found_from_the_kept_hashes_alone() -> None:
    kept = golden_ops.compact(_rows("a", "b", "c"))
    assert kept[0] == ["aten.op0.default", "aten.op1.default", "aten.op2.default"] and len(kept[1][0]) == 16
    changed = golden_ops._first_changed(_rows("a", "x", "y"), kept)
    assert changed["found"] and changed["op"] == "aten::op1" and changed["module"] == "conv"
    assert not golden_ops._first_changed(_rows("a", "b", "c"), kept)["found"]


def test_the_golden_sidecar_keeps_the_per_op_hashes(files) -> None:
    """Recorded by a real golden update (the session's shared results), read back from the sidecar."""
    golden = store.load(files["recorded"].parents[2] / "goldens", "cpu-torch2.13")
    kept = golden.models["embedding"].ops
    assert sorted(kept) == [1, 2, 3]
    overloads, digests = kept[1]
    assert len(overloads) == len(digests) > 50 and any("embedding" in o for o in overloads)


def test_a_thread_count_change_names_the_op_it_changed(reproci) -> None:
    plugin = f"{PLUGINS / 'portability.py'}:leaky"
    first = reproci("golden", "update", "-m", plugin, "--steps", "3", "--threads", "1")
    assert first.returncode == 0, first.stderr
    r = reproci("run", "-m", plugin, "--steps", "3", "--threads", "2")
    assert r.returncode == 3, r.stderr
    m = model_entry(reproci.latest(), "portability.leaky")
    assert m["verdict"] == verdicts.ENV_CHANGED
    op = m["golden"]["evidence"]["op"]
    assert op["found"] and op["op"] == "aten::convolution_backward" and op["module"] == "conv"
    assert "(threads 1 → 2); first changed op: aten::convolution_backward in conv at portability.py:" in m["message"]
    assert m["message"].count("threads 1 → 2") == 1  # the cause is said once


NO_OPTIONS = SimpleNamespace(models=[])


class _Golden:
    def __init__(self, ops: dict) -> None:
        self.models = {"conv": store.ModelGolden(name="conv", entry={}, ops=ops)}


def test_a_drift_the_kept_steps_cannot_explain_says_why_no_op_is_named() -> None:
    """No run is launched: the step lies outside the kept hashes, or none are kept."""
    def drifted(step: int) -> dict:
        return {"models": [{"model": "conv", "verdict": verdicts.ENV_CHANGED, "message": "conv differs",
                            "golden": {"evidence": {"step": step, "cause": "compute"}}}]}

    kept = {s: (["aten.mm.default"], ["0" * 16]) for s in (1, 2, 3)}
    late = drifted(12)
    golden_ops.name_changes(StageRun(NO_OPTIONS, None, None, {}, _Golden(kept)), late)
    assert late["models"][0]["message"] == ("conv differs; the first changed op is not named: the golden keeps "
                                            "per-op hashes of steps 1–3, and this difference begins at step 12")
    none = drifted(1)
    golden_ops.name_changes(StageRun(NO_OPTIONS, None, None, {}, _Golden({})), none)
    assert none["models"][0]["message"].endswith("the golden keeps no per-op hashes for this model "
                                                 "(a golden update records them)")


def test_why_no_op_is_named_never_says_step_none():
    """A difference with no known step says nothing of its step; step 0 is before the first step."""
    kept = {1: ([], []), 2: ([], [])}
    assert golden_ops._unnamed(kept, None) == "the golden keeps per-op hashes of steps 1–2"
    assert golden_ops._unnamed(kept, 0).endswith("and this difference begins before the first step")
    assert golden_ops._unnamed(kept, 7).endswith("and this difference begins at step 7")
