"""Runs whose every tensor agrees, but whose extra state or held-out metrics do not
(``reproci/stages/determinism/beyond_tensors.py``): nondeterminism or a checkpoint gap outside the hashed tensors."""

from __future__ import annotations

import dataclasses

from reproci import verdicts
from reproci.stages.determinism import _decide, beyond_tensors
from reproci.worker.run_record import Launched

from .helpers import run_record


def _rec(**kw):
    return run_record(**{"tensor_names": ["param:w"], "fingerprints": [[1]], "start_step": 0, "batch_fingerprints": [0],
                         "losses": [1.0], "final_sha256": "f", "tensor_sha256": {}, **kw})


def test_a_held_out_metric_that_differs_after_the_resume_is_a_resume_bug_naming_the_metric():
    a, c = _rec(eval={"ema_loss": 1.25, "acc": 0.5}), _rec(eval={"ema_loss": 1.5, "acc": 0.5})
    verdict, pair, div = _decide({"A": a, "B": a, "C": c})
    assert verdict == verdicts.RESUME_BROKEN and pair == ("A", "C") and div.cause == "eval"
    text = beyond_tensors.describe(div, pair)
    assert text.startswith("A = C in every fingerprinted tensor, but held-out metric ema_loss differs (A 1.25, C 1.5)")
    assert "TrainSetup.state_modules" in text


def test_extra_state_that_differs_between_a_and_b_is_nondeterministic():
    verdict, pair, div = _decide({"A": _rec(extra_state_sha256={"end": "a" * 64}),
                                  "B": _rec(extra_state_sha256={"end": "b" * 64}),
                                  "C": _rec(extra_state_sha256={"end": "a" * 64})})
    assert verdict == verdicts.NONDETERMINISTIC and div.cause == "extra"
    assert "the extra state (get_extra_state) differs at the end" in beyond_tensors.describe(div, pair)


def test_equal_metrics_and_extra_state_pass():
    r = _rec(eval={"loss": 0.5}, extra_state_sha256={"end": "a" * 64})
    assert _decide({"A": r, "B": dataclasses.replace(r), "C": dataclasses.replace(r)})[0] == verdicts.PASS


def test_a_models_seconds_start_when_its_first_run_starts():
    """With --jobs, a model's runs may wait for slots other models hold: that wait is not its time."""
    from reproci.stages.determinism import own_start

    def at(t: float) -> Launched:
        return Launched(wall_s=1.0, start_wait_s=0.0, how=None, at=t)

    assert own_start({"A": _rec(launched=at(12.0)), "B": _rec(launched=at(10.5)), "C": _rec()}, 3.0) == 10.5
    assert own_start({}, 3.0) == 3.0
