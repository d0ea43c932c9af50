"""The bisection (``reproci/stages/bisect/``): on four models each nondeterministic for one
reason (``tests/plugins/culprits.py``), ``reproci bisect`` names that reason; a drifting
golden is bisected over the factors the golden's run set; the text of each outcome."""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path

import pytest

from reproci import verdicts
from reproci.stages import bisect
from reproci.stages.bisect.result import Bisect
from tests.helpers import PLUGINS, model_entry

CULPRITS = f"{PLUGINS / 'culprits.py'}"


def _bisected(reproci, factory: str, *flags: str) -> dict:
    r = reproci("bisect", "-m", f"{CULPRITS}:{factory}", "--steps", "4", *flags)
    assert r.returncode == 1, r.stderr  # the check still fails: the bisection explains it
    entry = model_entry(reproci.latest(), f"culprits.{factory}")
    assert entry["verdict"] == verdicts.NONDETERMINISTIC
    assert "Bisection: the first factor whose removal restores equality" in r.stdout
    return entry["bisect"]


def test_workers_seeded_from_the_clock_are_named(reproci) -> None:
    b = _bisected(reproci, "clock_workers")
    assert b["culprit"] == "workers" and b["check"] == "A vs B" and b["steps"] == 2
    assert b["message"] == ("culprits.clock_workers: NONDETERMINISTIC with num_workers=2; equal with num_workers=0 "
                            "(compile and AMP were already off): the data loader's workers are the cause")
    assert [s["status"] for s in b["stages"]] == ["already off", "already off", "turned off"]
    assert b["runs"] == 2  # only the workers stage ran, to the first differing step + 1


def test_stochastic_rounding_under_autocast_is_named(reproci) -> None:
    b = _bisected(reproci, "autocast_rounding", "--amp", "bf16")
    assert b["culprit"] == "amp"
    assert "NONDETERMINISTIC with bf16 autocast; equal with fp32 (compile was already off)" in b["message"]
    assert b["message"].endswith("mixed precision (autocast) is the cause")


def test_a_compiled_path_drawing_from_an_unseeded_source_is_named(reproci) -> None:
    """The probe replays, compiled afresh, do not reproduce the runs' checksums: the verdict
    gives no magnitude measured on them as the runs' own (it said "max |Δ| 0 (0 ULP)")."""
    b = _bisected(reproci, "compiled_jitter", "--compile")
    assert b["culprit"] == "compile"
    assert "NONDETERMINISTIC with torch.compile (inductor); equal with eager" in b["message"]
    entry = model_entry(reproci.latest(), "culprits.compiled_jitter")
    ev = entry["evidence"]
    assert ev["magnitude_source"] == "not reproduced by the replay (compiled kernels vary from run to run)", ev
    assert ev["max_abs"] is None or ev["max_abs"] > 0, ev  # never a zero from replays that agreed
    assert "|Δ| 0 (" not in entry["message"] and "(compiled kernels vary from run to run)" in entry["message"]
    said = ("|Δ| not measured: not reproduced by the replay" if ev["max_abs"] is None
            else "between replays that did not reproduce the runs")
    assert f"first at {ev['tensor']}, {said}" in entry["message"], entry["message"]


def test_noise_from_os_urandom_is_the_models_code(reproci) -> None:
    b = _bisected(reproci, "urandom_noise", "--threads", "2")
    assert b["culprit"] is None
    assert [s["factor"] for s in b["stages"] if s["status"] == "turned off"] == ["threads"]
    assert "none of threads restores equality (compile, AMP, workers and ranks were already off): " \
           "the cause is in the model's code; first differing op: aten::mul in UrandomNoise" in b["message"]


def test_the_bisection_lands_in_the_reports(reproci, tmp_path: Path) -> None:
    summary = tmp_path / "summary.md"
    r = reproci("run", "-m", f"{CULPRITS}:clock_workers", "--steps", "4", "--bisect",
                env={"GITHUB_STEP_SUMMARY": str(summary)})
    assert r.returncode == 1
    doc = reproci.latest()
    assert doc["options"]["stages"] == ["determinism", "bisect"]
    text = summary.read_text()
    assert "### Bisection" in text and "the data loader's workers are the cause" in text
    for fmt in ("md", "html"):
        assert reproci("report", "--format", fmt, "-o", str(tmp_path / f"r.{fmt}")).returncode == 0
    assert "the data loader's workers are the cause" in (tmp_path / "r.md").read_text()

    class Sections(HTMLParser):
        ids: list[str] = []

        def handle_starttag(self, tag, attrs):
            if tag == "section":
                self.ids.append(dict(attrs).get("id"))

    parser = Sections()
    parser.feed((tmp_path / "r.html").read_text())
    assert "bisect" in parser.ids


def test_a_drift_in_the_thread_count_is_bisected_to_it(reproci) -> None:
    """A golden recorded at one thread; the run at two drifts (ENV_CHANGED); the bisection puts
    the golden's thread count back and the golden's checksums return."""
    assert reproci("golden", "update", "-m", "conv", "--steps", "4").returncode == 0
    r = reproci("run", "-m", "conv", "--steps", "4", "--threads", "2", "--bisect")
    entry = model_entry(reproci.latest(), "conv")
    assert entry["verdict"] == verdicts.ENV_CHANGED, r.stderr
    b = entry["bisect"]
    assert b["check"] == "A vs the golden" and b["culprit"] == "--threads 1"
    assert "with the golden's --threads 1 it matches the golden bit for bit" in b["message"]


@pytest.mark.parametrize(("verdicts_", "line"), [
    ({"conv": "PASS", "m": "NEW"}, "nothing to bisect: every check passed"),
    ({"conv": "PASS", "m": "ERROR"}, "nothing to bisect: no check failed, but m could not run (ERROR): fix what its "
                                     "message says first"),
    ({"ddp": "REPLICAS_DIVERGE"}, "nothing to bisect: ddp REPLICAS_DIVERGE: the bisection compares two runs or a run "
                                  "and its golden, not ranks"),
    ({"conv": "NOT_CHECKED"}, "nothing to bisect: no determinism check ran (add --stage determinism)"),
])
def test_nothing_to_bisect_says_why(verdicts_, line) -> None:
    doc = {"options": {"stages": ["determinism", "bisect"]}, "models": [{"model": m, "verdict": v} for m, v in verdicts_.items()]}
    assert bisect.nothing(doc) == line
    assert bisect.nothing({**doc, "options": {"stages": ["determinism"]}}) is None  # no bisection asked for
    doc["models"][0]["bisect"] = {"message": "..."}
    assert bisect.nothing(doc) is None  # a model was bisected: its row says the rest


def test_bisect_needs_a_model(cli) -> None:
    code, _, err = cli("bisect")
    assert code == 2 and "reproci bisect needs the model that failed: -m MODEL, or models: in reproci.yaml" in err


def test_bisect_takes_the_models_of_reproci_yaml_and_a_passing_model_is_not_bisected(reproci) -> None:
    """A repository whose reproci.yaml names its model bisects it as ``reproci run`` would run it;
    that model passes: it is not bisected, and that is said."""
    (reproci.cwd / "reproci.yaml").write_text(f"models: ['{CULPRITS}:tiny']\nsteps: 3\n")
    r = reproci("bisect")
    assert r.returncode == 0, r.stderr
    entry = model_entry(reproci.latest(), "culprits.tiny")
    assert entry["verdict"] in (verdicts.PASS, verdicts.NEW)
    assert "bisect" not in entry and "Bisection" not in r.stdout
    *_, said, results_line = r.stdout.strip().splitlines()  # the results file is always the report's last line
    assert said == "nothing to bisect: every check passed" and results_line.startswith("results: ")


@pytest.mark.parametrize(("evidence", "pair"), [
    ({"comparison": "A vs B"}, ("A", "B")), ({"comparison": "A vs W"}, ("A", "W")),
    ({"comparison": None, "cause": "controls"}, None), ({"comparison": "run A: rank 0 vs rank 1", "rank": 1}, None),
])
def test_the_failing_pair_is_read_from_the_evidence(evidence, pair) -> None:
    assert bisect.pair_of({"evidence": evidence}) == pair


def test_stages_read_in_order() -> None:
    row = {"stages": [{"factor": "compile", "status": "already off"},
                      {"factor": "amp", "status": "turned off", "from": "bf16 autocast", "to": "fp32", "equal": False},
                      {"factor": "workers", "status": "turned off", "from": "num_workers=2", "to": "num_workers=0",
                       "equal": True}], "runs": 4, "steps": 3, "seconds": 5.0}
    assert bisect.stages_text(Bisect.from_json(row)) == (
        "compile: already off · amp: bf16 autocast → fp32, still differs · "
        "workers: num_workers=2 → num_workers=0, equal (4 runs to step 3, 5 s)")
    out = Bisect.from_json({**row, "verdict": "NONDETERMINISTIC", "culprit": "workers"})
    assert bisect._message("m", {}, out) == ("m: NONDETERMINISTIC with num_workers=2; still unequal with AMP off; equal "
                                             "with num_workers=0 (compile was already off): the data loader's workers "
                                             "are the cause")
