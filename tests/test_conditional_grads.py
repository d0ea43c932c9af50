"""Gradients that exist at some steps only (``tests/plugins/conditional.py``) through the real
CLI: Whisper with LayerDrop, a branch taken every other step, and two bugs that live in such a
gradient; and the comparison of such rows, old records included.

One ``reproci run`` of 8 steps resumed at 5 for every model: run A's first step is 1 and C's
is 6, which take different layers and branches, so A and C start with different gradients.
With no golden recorded, a model whose runs agree and resume exactly is NEW with "A = B = C".
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from reproci import plugins
from reproci.golden import store
from reproci.golden.divergence import ABSENT, FINGERPRINT_SCHEME, first_divergence, step_rows

from .helpers import PLUGINS, Cli, model_entry

PLUGIN = PLUGINS / "conditional.py"
HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None
FACTORIES = ("branch_every_other_step", "branch_noisy_gradient", "branch_counter_unsaved") + (
    ("whisper_layerdrop",) if HAS_TRANSFORMERS else ())
AGREE = "A = B = C: bitwise reproducible, resume exact"


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One real run of every factory: its results document and its run directory."""
    cli = Cli(tmp_path_factory.mktemp("conditional"))
    p = cli("run", "--steps", "8", "--resume-at", "5", "--jobs", "2", *[a for f in FACTORIES for a in ("-m", f"{PLUGIN}:{f}")])
    assert (cli.cwd / "results" / "latest.json").is_file(), p.stdout + p.stderr
    doc = cli.latest()
    return {"doc": doc, "dir": cli.cwd / "results" / doc["run_id"]}


def entry(run: dict, factory: str) -> dict:
    return model_entry(run["doc"], f"conditional.{factory}")


def records(run: dict, factory: str) -> dict[str, dict]:
    e = entry(run, factory)
    return {role: json.loads((Path(run["dir"]) / path).read_text()) for role, path in e["records"].items()}


def present_grads(record: dict, step: int) -> set[str]:
    return {n for n, v in step_rows(record)[step].items() if n.startswith("grad:") and v != ABSENT}


def assert_agrees(m: dict) -> None:
    assert m["verdict"] == "NEW" and m["message"].startswith(AGREE), (m["model"], m["verdict"], m["message"])


@pytest.mark.slow
@pytest.mark.skipif(not HAS_TRANSFORMERS, reason="needs transformers")
def test_whisper_with_layerdrop_resumes_exactly(run):
    """A user trains Whisper with encoder and decoder LayerDrop: the layers a step skips have
    no gradient there, and run C's first step (6) skips other layers than A's first (1). The
    runs agree and resume exactly: no RESUME_BROKEN from gradients one run did not record."""
    recs = records(run, "whisper_layerdrop")
    a, c = recs["A"], recs["C"]
    assert present_grads(a, 1) != present_grads(a, 6), "the check needs first steps that skip other layers"
    assert set(a["tensor_names"]) == set(c["tensor_names"]) and a["fingerprint_scheme"] == FINGERPRINT_SCHEME
    assert step_rows(a)[6]["grad:model.encoder.embed_positions.weight"] == ABSENT  # frozen: never a gradient
    assert_agrees(entry(run, "whisper_layerdrop"))


@pytest.mark.slow
def test_a_branch_taken_every_other_step_resumes_exactly(run):
    """The branch runs on even steps: A's first step has no gradient for it, C's first step (6)
    has one. Every step's gradients are compared name for name, and the runs pass."""
    a = records(run, "branch_every_other_step")["A"]
    assert "grad:branch.weight" not in present_grads(a, 1) and "grad:branch.weight" in present_grads(a, 6)
    assert_agrees(entry(run, "branch_every_other_step"))


@pytest.mark.slow
def test_noise_in_a_gradient_that_exists_every_other_step_is_named(run):
    """The branch's gradient gets noise from an unseeded generator on the steps the branch
    runs (never step 1): A and B part at step 2, first at that very gradient, with its size."""
    m = entry(run, "branch_noisy_gradient")
    ev = m["evidence"]
    assert m["verdict"] == "NONDETERMINISTIC", m["message"]
    assert (ev["comparison"], ev["step"], ev["tensor"]) == ("A vs B", 2, "grad:branch.weight"), ev
    assert ev["max_abs"] and ev["max_abs"] > 0 and ev["only_in"] is None, ev
    assert "from step 2, first at grad:branch.weight, max |Δ|" in m["message"], m["message"]


@pytest.mark.slow
def test_a_branch_schedule_the_checkpoint_misses_is_told_by_which_run_has_the_gradient(run):
    """The branch counts its steps in a Python attribute: resumed, run C counts from 0 again and
    takes the branch at step 6, where A did not. The message says which run has the gradient
    (there is no magnitude for a tensor on one side only), never "|Δ| 0"."""
    m = entry(run, "branch_counter_unsaved")
    ev = m["evidence"]
    assert m["verdict"] == "RESUME_BROKEN", m["message"]
    assert (ev["comparison"], ev["step"], ev["only_in"]) == ("A vs C", 6, "C"), ev
    assert ev["tensor"] in ("grad:branch.weight", "grad:branch.bias") and ev["max_abs"] is None, ev
    assert f"first at {ev['tensor']}, which exists in C at that step, not in A" in m["message"], m["message"]
    assert ev["presence"] == f"{ev['tensor']} exists in C at step 6, not in A"
    assert "|Δ| 0" not in m["message"]


@pytest.mark.slow
def test_a_golden_keeps_absent_gradients_and_compares_them(run, tmp_path):
    """A golden recorded from run A keeps the rows' scheme and their absent gradients: run C
    agrees with it over the steps both have, and a gradient missing from C at a step where the
    golden has one is named as such."""
    factory = "whisper_layerdrop" if HAS_TRANSFORMERS else "branch_every_other_step"
    name, recs = entry(run, factory)["model"], records(run, factory)
    doc = {**run["doc"], "models": [entry(run, factory)]}
    store.write(tmp_path, "conditional", doc, {name: recs["A"]}, {name: {}}, plugins.stages())
    golden = store.load(tmp_path, "conditional").models[name].as_record()
    assert golden.fingerprint_scheme == FINGERPRINT_SCHEME and ABSENT in sum(golden.fingerprints, [])
    assert first_divergence(golden, recs["C"]) is None
    c = json.loads(json.dumps(recs["C"]))
    step, grad = next((s, g) for s in (7, 8) for g in sorted(present_grads(c, s)))
    c["fingerprints"][step - c["start_step"] - 1][c["tensor_names"].index(grad)] = ABSENT
    d = first_divergence(golden, c)
    assert (d.step, d.tensor, d.only_in) == (step, grad, "a"), d


# -- comparing rows, old records included -------------------------------------------------------

def _record(rows: list[list[int]], *, names: tuple[str, ...] = ("param:w", "grad:w", "grad:v"), start: int = 0,
            scheme: str | None = FINGERPRINT_SCHEME) -> dict:
    rec = {"tensor_names": list(names), "fingerprints": rows, "start_step": start, "losses": [1.0] * len(rows),
           "batch_fingerprints": [0] * len(rows), "final_sha256": "f", "tensor_sha256": {}}
    return {**rec, "fingerprint_scheme": scheme} if scheme else rec


def test_a_gradient_on_one_side_only_is_a_difference_that_says_which_side():
    a = _record([[1, 2, ABSENT], [3, 4, 5]])
    c = _record([[3, 4, ABSENT]], start=1)
    d = first_divergence(a, c)
    assert (d.step, d.tensor, d.only_in, d.max_abs) == (2, "grad:v", "a", None)
    assert first_divergence(c, a).only_in == "b"


def test_an_absent_gradient_differs_from_an_all_zero_one():
    d = first_divergence(_record([[1, 0, 7]]), _record([[1, ABSENT, 7]]))
    assert d is not None and (d.tensor, d.only_in) == ("grad:w", "a")  # a has it (all zero), b has none


def test_a_name_one_record_lacks_is_a_tensor_that_run_never_had():
    a = _record([[1, 2, 3]])
    b = _record([[1, 2]], names=("param:w", "grad:w"))
    assert first_divergence(a, b).tensor == "grad:v"
    assert first_divergence(_record([[1, 2, ABSENT]]), b) is None


def test_an_old_record_compares_over_the_names_both_carry_with_absent_as_zero():
    """Records written before the scheme took their gradient columns from their first step
    (here without grad:v, which that step lacked) and read 0 for a missing gradient."""
    old_a = _record([[1, 2], [3, 0]], names=("param:w", "grad:w"), scheme=None)
    new_c = _record([[3, ABSENT, 6]], start=1)
    assert first_divergence(old_a, new_c) is None and first_divergence(new_c, old_a) is None
    old_c = _record([[3, 0, 6]], start=1, scheme=None)
    assert first_divergence(old_a, old_c) is None
    assert first_divergence(old_a, _record([[4, ABSENT, 6]], start=1)).tensor == "param:w"
