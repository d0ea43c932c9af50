"""The variance stage with real training runs (one small plugin, 6 steps, 3 seeds): a real
difference (another learning rate) is outside seed noise, the same model again (with other
thread counts) is inside, and the results, the golden, the reports and the pull-request body
carry it. Plus the worker's eval_fn contract, in-process."""

from __future__ import annotations

import json
import statistics
import time
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from reproci.worker.contract import ContractError, TrainSetup
from reproci.worker.evaluate import evaluate
from tests.helpers import PLUGINS, Cli, model_entry

PLUGIN = f"{PLUGINS / 'lr_env.py'}:build"
COMMON = ("run", "-m", PLUGIN, "--steps", "6", "--resume-at", "3", "--seeds", "3", "-j", "2", "--goldens-dir", "goldens")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Three real invocations: the golden (determinism + variance), the same model again with
    2 threads, and the model with another learning rate (variance only)."""
    cli = Cli(tmp_path_factory.mktemp("variance"))
    t0 = time.monotonic()
    out = {"cli": cli,
           "base": cli(*COMMON, "--stage", "determinism", "--stage", "variance", "--update-golden", "--results-dir", "base"),
           "again": cli(*COMMON, "--stage", "variance", "--threads", "2", "--results-dir", "again"),
           "changed": cli(*COMMON, "--stage", "variance", "--results-dir", "changed", env={"REPROCI_TEST_LR": "0.001"})}
    out["seconds"] = time.monotonic() - t0
    for name in ("base", "again", "changed"):
        assert out[name].returncode == 0, (name, out[name].stdout, out[name].stderr)
    return out


def results(runs: dict[str, Any], name: str) -> dict[str, Any]:
    return json.loads((runs["cli"].cwd / name / "latest.json").read_text())


@pytest.mark.slow
def test_each_seed_is_a_strict_run_and_the_spread_is_recorded(runs: dict[str, Any]) -> None:
    entry = model_entry(results(runs, "base"), "lr_env")
    assert entry["verdict"] == "NEW"  # the determinism stage ran as well, and passed
    v = entry["variance"]
    assert v["k"] == 3 and v["seeds"] == [0, 1, 2] and v["error"] is None
    assert sorted(v["metrics"]) == ["eval_loss", "final_loss", "r2"]
    for name, m in v["metrics"].items():
        assert len(m["values"]) == 3 and len(set(m["values"])) == 3, name  # the seeds differ
        assert m["mean"] == pytest.approx(statistics.fmean(m["values"]))
        assert m["std"] == pytest.approx(statistics.stdev(m["values"]))
    assert v["metrics"]["r2"]["lower_is_better"] is False and v["metrics"]["eval_loss"]["lower_is_better"] is True
    record = json.loads(next((runs["cli"].cwd / "base").glob("*/lr_env/record-variance-seed1.json")).read_text())
    assert record["mode"] == "strict" and record["seed"] == 1 and record["eval"]["r2"] == v["metrics"]["r2"]["values"][1]
    golden = (runs["cli"].cwd / "goldens" / "local.yaml").read_text()
    assert "variance:" in golden and "eval_loss:" in golden
    # the determinism stage's run A is seed 0 (evaluated at its end), not trained a second time
    run_dir = next((runs["cli"].cwd / "base").glob("*/lr_env"))
    assert not (run_dir / "record-variance-seed0.json").exists()
    assert v["records"][0] == "lr_env/record-A.json" and v["final_sha256"][0] == entry["final_sha256"]
    assert json.loads((run_dir / "record-A.json").read_text())["eval"]["r2"] == v["metrics"]["r2"]["values"][0]
    # without the determinism stage, seed 0 is a run of its own
    again = next((runs["cli"].cwd / "again").glob("*/lr_env"))
    assert (again / "record-variance-seed0.json").is_file()


@pytest.mark.slow
def test_the_same_model_again_is_inside_seed_noise(runs: dict[str, Any]) -> None:
    again = runs["again"].stdout
    assert "lr_env: eval_loss ↓ over 3 seeds:" in again
    assert again.count("against the golden: inside seed noise (Δ = ") == 3, again
    code = runs["cli"]("compare", "goldens/local.yaml", "again")
    assert code.returncode == 0 and code.stdout.count(": inside seed noise (Δ = ") == 3, code.stdout
    assert "Welch's t" in code.stdout


@pytest.mark.slow
def test_another_learning_rate_is_outside_seed_noise(runs: dict[str, Any]) -> None:
    p = runs["cli"]("compare", "base", "changed", "--json")
    assert p.returncode == 0, p.stderr
    judged = {c["metric"]: c for c in json.loads(p.stdout)["comparisons"]}
    assert judged["eval_loss"]["inside"] is False and judged["eval_loss"]["sentence"].startswith(
        "outside seed noise: B is worse by ")
    assert judged["r2"]["inside"] is False and judged["r2"]["sentence"].startswith("outside seed noise: B is worse by ")
    body = runs["cli"]("pr-body", "changed/latest.json")
    assert "### Did the metrics move? (variance stage)" in body.stdout
    assert "| lr_env | `eval_loss` |" in body.stdout and "outside seed noise: B is worse" in body.stdout


class VarianceImages(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.section: str | None = None
        self.alts: list[str | None] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "section":
            self.section = dict(attrs).get("id")
        elif tag == "img" and self.section == "variance":
            self.alts.append(dict(attrs).get("alt"))


@pytest.mark.slow
def test_the_html_report_shows_the_strip_chart(runs: dict[str, Any], tmp_path: Path) -> None:
    p = runs["cli"]("report", "changed", "--format", "html", "--output", str(tmp_path / "r.html"))
    assert p.returncode == 0, p.stderr
    parser = VarianceImages()
    parser.feed((tmp_path / "r.html").read_text())
    assert parser.alts == ["seed strip chart of lr_env"]
    print(f"variance test runs took {runs['seconds']:.1f} s")


def setup_with(eval_fn: Any) -> TrainSetup:
    model = nn.Sequential(nn.Linear(2, 1), nn.Dropout(0.5))
    return TrainSetup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), loader=[],
                      loss_fn=lambda m, b: m(b).sum(), eval_fn=eval_fn)


def test_eval_fn_runs_in_eval_mode_without_grad_and_train_mode_comes_back() -> None:
    seen: dict[str, Any] = {}

    def eval_fn(model: nn.Module) -> dict[str, float]:
        seen.update(training=model.training, grad=torch.is_grad_enabled())
        return {"accuracy": torch.tensor(0.75), "eval_loss": 1}

    setup = setup_with(eval_fn)
    assert evaluate(setup, "p.py:build") == {"accuracy": 0.75, "eval_loss": 1.0}
    assert seen == {"training": False, "grad": False} and setup.model.training
    assert evaluate(setup_with(None), "p.py:build") is None


def test_an_eval_fn_that_breaks_the_contract_says_what_to_fix() -> None:
    with pytest.raises(ContractError, match="eval_fn returned list, not a dict of metric name -> number"):
        evaluate(setup_with(lambda m: [1.0]), "p.py:build")
    with pytest.raises(ContractError, match="eval_fn's metric 'accuracy' is 'high', not a number"):
        evaluate(setup_with(lambda m: {"accuracy": "high"}), "p.py:build")


def test_a_failed_seed_run_makes_the_model_an_error() -> None:
    from reproci.stages import variance
    from reproci.stages.variance.result import VarianceResult
    from reproci.typed import Error

    entry = {"model": "conv", "verdict": "PASS", "message": "A = B = C", "seconds": 1.0, "records": {"A": "a.json"}}
    variance.attach(entry, VarianceResult(k=3, seconds=2.0, records=["conv/record-variance-seed0.json"],
                                          error=Error(kind="crash", message="run variance-seed1 died with exit code 1")),
                    ("determinism", "variance"))
    assert entry["verdict"] == "ERROR" and entry["seconds"] == 3.0 and entry["records"] == {"A": "a.json"}
    assert entry["message"] == "variance stage: run variance-seed1 died with exit code 1 (determinism: PASS)"
    from reproci.stages.variance import report

    assert report.terminal_lines({"models": [entry]}) == [
        "conv: variance stage failed: run variance-seed1 died with exit code 1"]


@pytest.mark.parametrize("workflow, step, job, variance, stages", [
    ("reproci", "Run the models in the image", "image", "false", []),  # push, pull request, nightly
    ("reproci", "Run the models in the image", "image", "true", ["determinism", "variance"]),
    ("golden-update", "Run the strict stage (and its cost) and record the golden", "record", "false",
     ["determinism", "throughput"]),
    ("golden-update", "Run the strict stage (and its cost) and record the golden", "record", "true",
     ["determinism", "throughput", "variance"]),
])
def test_the_workflows_run_the_variance_stage_only_on_request(tmp_path: Path, workflow: str, step: str, job: str,
                                                              variance: str, stages: list[str]) -> None:
    """A manual run's boolean input, passed to the called workflow as it is (false on any other
    event), which gives the run step its stages."""
    from tests.helpers import run_step, triggers
    from tests.workflow_helpers import CALLS, load, step_named

    doc = load(workflow)
    assert triggers(doc)["workflow_dispatch"]["inputs"]["variance"] == {
        "description": triggers(doc)["workflow_dispatch"]["inputs"]["variance"]["description"],
        "required": False, "default": False, "type": "boolean"}
    (call,) = doc["jobs"].values()
    assert call["with"]["variance"] == "${{ inputs.variance == true }}"  # no inputs on a push: false
    called = load(CALLS[workflow])
    assert triggers(called)["workflow_call"]["inputs"]["variance"]["default"] is False
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "reproci").write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$STUB_ARGS"\n')
    (bin_dir / "reproci").chmod(0o755)
    env = {"IMAGE": "cuda12.6-torch2.7", "DEVICE": "cuda", "GPUS": "", "PROFILE": "full", "REPROCI_WEBHOOK": "",
           "VARIANCE": variance, "STUB_ARGS": str(tmp_path / "args")}
    out, _ = run_step(step_named(called, job, step), env, tmp_path, bin_dir, tmp_path)
    assert out.returncode == 0, out.stderr
    args = (tmp_path / "args").read_text().split("\n")
    assert [args[i + 1] for i, a in enumerate(args) if a == "--stage"] == stages


def test_seeds_come_from_the_flag_or_reproci_yaml_and_one_is_refused(tmp_path: Path, cli) -> None:
    from reproci import plugins
    from reproci.stages.variance.options import VarianceOptions

    config = tmp_path / "reproci.yaml"
    config.write_text("stages: [variance]\nseeds: 4\n")
    built = plugins.build_options({"config": config})
    assert built.of(VarianceOptions).seeds == 4 and built.stages == ("variance",)
    assert plugins.build_options({"config": config, "seeds": 7}).of(VarianceOptions).seeds == 7
    code, _, err = cli("run", "--stage", "variance", "--seeds", "1")
    assert code == 2 and err == ("error: --seeds must be at least 2 for a spread (got 1); `reproci compare` needs "
                                 "at least 3 on each side")
    code, _, err = cli("run", "--stage", "variance", "--update-golden")
    assert code == 2 and "add --stage determinism" in err
