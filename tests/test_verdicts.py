"""The one vocabulary of verdicts: exit codes, annotation levels, order, evidence text."""

from __future__ import annotations

import pytest

from reproci import errors, plugins, verdicts
from reproci.reports import github, webhook

STAGES = plugins.stages()


def doc(*vs: str, ci: bool = False, updated: bool = False, slowdown_fails: bool = False,
        regression: bool = False) -> dict:
    models = [{"model": f"m{i}", "verdict": v, "message": f"message {i}"} for i, v in enumerate(vs)]
    if regression:
        models[0]["throughput_regression"] = "strict 1.40× slower than the golden's 1.10×"
    return {"image": {"name": "img"}, "options": {"ci": ci, "slowdown_fails": slowdown_fails},
            "golden": {"updated": updated}, "models": models, "summary": {}}


def test_every_verdict_has_an_exit_code_a_style_an_icon_and_a_place_in_the_order():
    for v in verdicts.ALL:
        assert v in verdicts.EXIT_CODES and v in verdicts.STYLE and v in verdicts.ICON and v in verdicts.ORDER
    assert set(verdicts.ORDER) == set(verdicts.ALL)
    assert not (verdicts.FAILING & verdicts.DRIFTING) and not (verdicts.DRIFTING & verdicts.NOTICES)


@pytest.mark.parametrize("vs,ci,code", [
    ((verdicts.PASS, verdicts.NEW), False, errors.EXIT_PASS),
    ((verdicts.PASS, verdicts.NEW), True, errors.EXIT_DRIFT),
    ((verdicts.PASS, verdicts.MODEL_CHANGED), False, errors.EXIT_PASS),
    ((verdicts.PASS, verdicts.MODEL_CHANGED), True, errors.EXIT_DRIFT),  # CI that compares nothing fails
    ((verdicts.UPGRADE_CHANGED, verdicts.NONDETERMINISTIC), False, errors.EXIT_REPRO_FAILURE),
    ((verdicts.ERROR, verdicts.RESUME_BROKEN), False, errors.EXIT_RUN_ERROR),
    ((verdicts.REPLICAS_DIVERGE,), False, errors.EXIT_REPRO_FAILURE),
    ((verdicts.PASS, verdicts.NEW, verdicts.UPGRADE_CHANGED, verdicts.REPLICAS_DIVERGE), True, errors.EXIT_REPRO_FAILURE),
    ((verdicts.REPLICAS_DIVERGE, verdicts.ERROR), False, errors.EXIT_RUN_ERROR),
    ((verdicts.NOT_CHECKED,), True, errors.EXIT_PASS),
    ((), False, errors.EXIT_PASS),
])
def test_the_most_serious_verdict_sets_the_exit_code(vs, ci, code):
    assert verdicts.document_exit_code(doc(*vs, ci=ci), STAGES) == code


def test_drift_is_the_evidence_of_a_golden_update_not_its_failure():
    assert verdicts.document_exit_code(doc(verdicts.UPGRADE_CHANGED, verdicts.NEW, ci=True), STAGES) == errors.EXIT_DRIFT
    assert verdicts.document_exit_code(doc(verdicts.UPGRADE_CHANGED, verdicts.NEW, ci=True, updated=True), STAGES) == 0
    assert verdicts.document_exit_code(doc(verdicts.NONDETERMINISTIC, updated=True), STAGES) == errors.EXIT_REPRO_FAILURE
    assert verdicts.document_exit_code(doc(verdicts.REPLICAS_DIVERGE, verdicts.NEW, updated=True), STAGES) == errors.EXIT_REPRO_FAILURE


def test_a_throughput_regression_fails_only_with_slowdown_fails_and_only_a_passing_run():
    assert verdicts.document_exit_code(doc(verdicts.PASS, regression=True), STAGES) == 0
    assert verdicts.document_exit_code(doc(verdicts.PASS, regression=True, slowdown_fails=True), STAGES) == errors.EXIT_DRIFT
    assert verdicts.document_exit_code(doc(verdicts.RESUME_BROKEN, regression=True, slowdown_fails=True), STAGES) == 1


def test_a_golden_update_is_failed_by_a_dependency_with_probes_fail_and_not_by_its_slowdown():
    """A dependency on the environment found by the probes is no evidence of an update: with
    --probes-fail it fails the run that records the golden too; a slowdown against the golden
    the update replaces is its evidence, as drift is."""
    probed = doc(verdicts.UPGRADE_CHANGED, updated=True)
    probed["options"]["probes_fail"] = True
    probed["models"][0]["probes"] = {"rows": [{"probe": "threads", "status": "depends"}], "depends": ["threads"]}
    assert verdicts.document_exit_code(probed, STAGES) == errors.EXIT_REPRO_FAILURE
    probed["options"]["probes_fail"] = False
    assert verdicts.document_exit_code(probed, STAGES) == errors.EXIT_PASS
    assert verdicts.document_exit_code(doc(verdicts.PASS, regression=True, slowdown_fails=True, updated=True),
                                       STAGES) == errors.EXIT_PASS


def test_summarize_counts_and_sets_the_exit_code_once():
    d = doc(verdicts.PASS, verdicts.PASS, verdicts.ENV_CHANGED)
    verdicts.summarize(d, STAGES)
    assert d["summary"] == {"verdicts": {"ENV_CHANGED": 1, "PASS": 2}, "exit_code": errors.EXIT_DRIFT}


def test_annotation_levels_follow_the_exit_code_meaning():
    assert {v: verdicts.annotation_level(v) for v in verdicts.ALL} == {
        verdicts.PASS: None, verdicts.NOT_CHECKED: None, verdicts.NEW: "notice", verdicts.MODEL_CHANGED: "notice",
        verdicts.NONDETERMINISTIC: "error", verdicts.RESUME_BROKEN: "error", verdicts.REPLICAS_DIVERGE: "error",
        verdicts.ERROR: "error",
        verdicts.UPGRADE_CHANGED: "warning", verdicts.ENV_CHANGED: "warning", verdicts.GOLDEN_MISMATCH: "warning"}
    assert verdicts.annotation_level(verdicts.NEW, ci=True) == "warning"  # fails as drift in CI
    assert verdicts.annotation_level(verdicts.MODEL_CHANGED, ci=True) == "warning"


def test_run_and_merged_annotations_agree_on_levels():
    """The same verdict gets the same annotation level from a run and from a merged matrix."""
    run_doc = doc(verdicts.UPGRADE_CHANGED, verdicts.NONDETERMINISTIC, verdicts.PASS, verdicts.NEW)
    merged = {"missing": [], "models": [{**m, "image": "img"} for m in run_doc["models"]]}
    levels = lambda lines: sorted(line.split(" ", 1)[0] for line in lines)  # noqa: E731
    assert levels(github.run_annotations(run_doc, STAGES)) == levels(github.merged_annotations(merged)) == [
        "::error", "::notice", "::warning"]
    assert github.run_annotations(run_doc, STAGES)[0].startswith("::error ")  # most serious first


def test_workflow_command_escaping():
    line = github.annotation("error", "reproci a: b, c", "line 1\nline 2 100%")
    assert line == "::error title=reproci a%3A b%2C c::line 1%0Aline 2 100%25"


def test_evidence_sentences():
    ev = {"step": 15, "tensor": "buffer:bn.running_mean", "max_abs": 4.66e-10, "max_ulp": 1, "cause": "compute"}
    assert verdicts.where_text(ev) == "from step 15, first at buffer:bn.running_mean"
    assert verdicts.magnitude_text(ev) == "max |Δ| 4.66e-10 (1 ULP)"
    assert verdicts.first_difference(ev) == "step 15, buffer:bn.running_mean, |Δ| 4.66e-10 (1 ULP)"
    assert verdicts.where_text({"step": 0, "tensor": "param:w", "cause": "init"}) == \
        "before the first step, first at param:w"
    assert verdicts.where_text({"step": None}) == "from the final state"
    assert verdicts.magnitude_text({"step": 3}) == ""



def test_an_op_in_a_child_of_a_sequential_is_named_as_a_module_not_a_bare_number():
    """An nn.Sequential's children are named 0, 1, 2: "in 1 at model.py:41" would read as a count."""
    op = {"found": True, "op": "aten::relu", "module": "1", "source": "model.py:41 (forward)", "phase": "forward"}
    assert verdicts.op_text(op) == "aten::relu in module 1 at model.py:41 (forward), forward pass"
    assert verdicts.op_text({**op, "module": "encoder.1"}).startswith("aten::relu in encoder.1 at model.py:41")

def test_drift_shows_the_golden_comparisons_evidence_and_failures_their_own():
    golden_ev, own_ev = {"step": 3, "tensor": "param:a"}, {"step": 1, "tensor": "grad:b"}
    drifted = {"verdict": verdicts.UPGRADE_CHANGED, "evidence": own_ev, "golden": {"evidence": golden_ev}}
    failed = {"verdict": verdicts.NONDETERMINISTIC, "evidence": own_ev, "golden": {"evidence": golden_ev}}
    assert verdicts.verdict_evidence(drifted) is golden_ev and verdicts.verdict_evidence(failed) is own_ev


def test_the_evidence_reads_by_attribute_and_is_written_as_it_was_read():
    from reproci import typed
    from reproci.entry_sections import ErrorView, EvidenceView, RunSummaryView

    ev = {"comparison": "A vs B", "step": 4, "tensor": "grad:fc.weight", "cause": "controls",
          "op": {"found": True, "op": "aten::mm", "aside": {"op": "aten::relu", "module": "act"}},
          "controls": [{"control": "cudnn.benchmark", "where": "model.py:9", "step": 0}], "newer": [1]}
    entry = {"verdict": verdicts.NONDETERMINISTIC, "evidence": ev, "runs": {"A": {"final_sha256": "ab", "wall_s": 1.5}},
             "error": {"kind": "oom", "message": "out of memory"}}
    view = EvidenceView.of(entry)
    assert view is not None and view.op is not None and view.op.aside is not None and view.controls
    assert (view.step, view.op.op, view.op.aside.module, view.controls[0].where) == (4, "aten::mm", "act", "model.py:9")
    assert typed.dump(view) == ev and list(typed.dump(view)) == list(ev)
    assert verdicts.first_difference(view) == verdicts.first_difference(ev) == "controls off at model.py:9"
    assert verdicts.evidence(entry) == view and EvidenceView.of({"evidence": {}}) is None
    assert RunSummaryView.of(entry)["A"].wall_s == 1.5 and RunSummaryView.of({}) == {}
    error = ErrorView.of(entry)
    assert error is not None and error.kind == "oom" and ErrorView.of({"error": None}) is None


def test_the_webhook_names_failing_and_drifting_models_most_serious_first():
    msg = webhook.slack_message(doc(verdicts.ENV_CHANGED, verdicts.PASS, verdicts.ERROR), STAGES)
    assert msg["text"].splitlines() == ["reproci: 2 model(s) need attention on image img",
                                        "• *m2*: ERROR: message 2", "• *m0*: ENV_CHANGED: message 0"]


def test_the_table_cell_says_a_tensor_exists_on_one_side_or_outside_the_checkpoint():
    from reproci.verdicts import first_difference

    assert first_difference({"step": 6, "tensor": "grad:branch.bias", "only_in": "C"}) == "step 6, grad:branch.bias (only in C)"
    assert first_difference({"step": 6, "tensor": "after_step.<ema>", "cause": "census"}) == (
        "step 6, after_step.<ema> (outside the checkpoint)")
