"""The throughput-cost stage: statistics, op attribution, regression checks, and real runs."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from reproci import plugins, verdicts
from reproci.plugins import build_options
from reproci.settings.models import resolve_all
from reproci.settings.options import RunOptions
from reproci.stages import throughput
from reproci.stages.throughput import sampling
from reproci.stages.throughput.options import ThroughputOptions
from reproci.stages.throughput.result import SampledSlowdown, ThroughputSummary
from reproci.worker.process.spec import PROFILE_STEPS, WorkerSpec

from .helpers import Cli, model_entry, undeclared


def test_bootstrap_interval_brackets_the_median_and_is_repeatable():
    ratios = [1.10, 1.12, 1.08, 1.11, 1.30, 1.09, 1.10, 1.11, 1.12]
    med, low, high = throughput.bootstrap_median(ratios)
    assert med == pytest.approx(1.11)
    assert low <= med <= high
    assert high < 1.30  # the median resists the one outlier
    assert throughput.bootstrap_median(ratios) == (med, low, high)  # same data, same interval


def test_a_wide_interval_is_flagged_noisy_and_a_tight_one_is_not():
    tight = throughput.slowdown([1.100, 1.102, 1.098, 1.101, 1.099])
    wide = throughput.slowdown([0.9, 1.3, 1.0, 1.5, 1.1])
    assert not tight.noisy and tight.relative_width < 0.01
    assert wide.noisy and wide.ci_high - wide.ci_low > 0.1
    assert throughput.slowdown([1.1, 1.1]).noisy  # two repetitions cannot vouch for an interval


def _ops(**times: float) -> list[dict]:
    return [{"name": k.replace("__", "::"), "calls": 1, "self_cpu_us": v, "self_device_us": 0.0} for k, v in times.items()]


def test_top_ops_name_the_op_that_grew_with_its_share_of_the_slowdown():
    ops = {
        "strict": [_ops(aten__index_add_=140, aten__mm=50, aten__sort=20), _ops(aten__index_add_=140, aten__mm=50, aten__sort=20)],
        "default": [_ops(aten__index_add_=100, aten__mm=50), _ops(aten__index_add_=100, aten__mm=50)],
    }
    top = throughput.attribute_ops(ops, device="cpu")
    assert [t.op for t in top] == ["aten::index_add_", "aten::sort"]
    assert top[0].growth == pytest.approx(0.40)
    assert top[0].share == pytest.approx(40 / 60)  # of all the time that grew
    assert top[0].strict_ms == pytest.approx(0.14) and top[0].default_ms == pytest.approx(0.10)
    assert top[1].growth is None  # runs only in strict mode
    assert throughput.attribute_ops({"strict": ops["strict"], "default": []}, device="cpu") == []


def _summary(median: float, low: float, high: float, steps_per_s: float = 100.0, device: str = "cpu") -> ThroughputSummary:
    """What a golden keeps, as its YAML has it."""
    return ThroughputSummary.from_json({
        "device": device, "threads": 1,
        "modes": {"strict": {"steps_per_s": steps_per_s}, "default": {"steps_per_s": steps_per_s * median}},
        "slowdown": {"strict": {"median": median, "ci_low": low, "ci_high": high}}})


def test_regression_beyond_the_factor_warns_in_one_line():
    golden = _summary(1.10, 1.08, 1.12)
    worse = _summary(1.60, 1.55, 1.65)
    msg = throughput.check_regression(worse, golden, 1.25)
    assert msg is not None and "\n" not in msg
    assert "1.600" in msg and "1.100" in msg and "1.25" in msg
    assert throughput.check_regression(golden, golden, 1.25) is None
    # the median is past the limit but the interval reaches back inside it: noise, not a regression
    assert throughput.check_regression(_summary(1.40, 1.30, 1.50), golden, 1.25) is None
    # strict mode itself got much slower on the same machine, with an unchanged ratio
    slower = _summary(1.10, 1.08, 1.12, steps_per_s=50.0)
    assert "throughput regressed" in (throughput.check_regression(slower, golden, 1.25) or "")
    assert throughput.check_regression(_summary(1.10, 1.08, 1.12, 50.0, device="cuda"), golden, 1.25) is None
    assert throughput.check_regression(ThroughputSummary.from_json({}), golden, 1.25) is None


def test_plan_runs_each_mode_in_its_own_process_interleaved_abba():
    opts = RunOptions(models=resolve_all(("embedding",)), stages=("throughput",), steps=12,
                      staged={"throughput": ThroughputOptions(repetitions=4)})
    groups = throughput.plan(opts, opts.models[0], project_commit=None, image={},
                             modes=("strict", "default", "bookkeeping"))
    assert [[s.role for s in g] for g in groups[:2]] == [
        ["throughput-strict-1", "throughput-default-1", "throughput-bookkeeping-1"],
        ["throughput-bookkeeping-2", "throughput-default-2", "throughput-strict-2"]]
    specs = [s for g in groups for s in g]
    assert len({s.output for s in specs}) == len({s.lockstep for s in specs}) == len(specs) == 12
    assert all(not s.fingerprints and s.warmup_steps >= 3 for s in specs)
    # a group takes turns: every member runs the same number of steps
    assert all(len({s.steps for s in g}) == 1 for g in groups)
    profiled = [s for s in specs if s.profile_ops]
    assert {s.role.rsplit("-", 1)[1] for s in profiled} == {str(r) for r in range(1, throughput.PROFILED_REPS + 1)}
    # profiled steps come on top of the timed ones; time sets how many a pair times (the sampler
    # ends it), --steps when it was given, and always for runs that cannot take turns
    extra = [PROFILE_STEPS + 1 if s.profile_ops else 0 for s in specs]
    assert [s.steps - s.warmup_steps for s in specs] == [throughput.TIMED_STEPS_CAP + e for e in extra]
    for given, paired in ((True, True), (False, False)):
        o = replace(opts, steps_given=given)
        again = [s for g in throughput.plan(o, o.models[0], project_commit=None, image={}, paired=paired) for s in g]
        assert all(s.steps == s.warmup_steps + 12 + (PROFILE_STEPS + 1 if s.profile_ops else 0) for s in again)


def test_repetitions_below_one_are_a_usage_error(reproci: Cli):
    r = reproci("run", "--stage", "throughput", "--repetitions", "0")
    assert r.returncode == 2
    assert "repetitions" in r.stderr


@pytest.fixture(scope="module")
def throughput_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Cli, object, dict]:
    cli = Cli(tmp_path_factory.mktemp("throughput"))
    r = cli("run", "--stage", "throughput", "-m", "embedding", "--repetitions", "2", "--steps", "12", "--time-budget", "60")
    return cli, r, cli.latest()


@pytest.mark.slow
def test_throughput_only_run_prints_slowdown_interval_and_top_ops(throughput_run):
    cli, r, doc = throughput_run
    assert r.returncode == 0, r.stderr
    assert undeclared(doc) == []  # every key the stage writes is declared (its result.ThroughputResult)
    assert "cost of strict determinism" in r.stdout
    assert "×  [" in r.stdout.replace("× [", "×  [")  # "1.02× [0.99, 1.05]"
    assert "determinism not checked" in r.stdout
    entry = model_entry(doc, "embedding")
    assert entry["verdict"] == verdicts.NOT_CHECKED  # no reproducibility claim without that stage
    run_dir = cli.cwd / "results" / doc["run_id"]
    entry["throughput_batch"] = json.loads((run_dir / entry["throughput"]["records"][0]).read_text())["batch_size"]
    assert doc["summary"]["exit_code"] == 0
    t = entry["throughput"]
    assert t["error"] is None and t["repetitions"] == 2 and t["timed_steps"] == 12
    for mode in ("strict", "default"):
        m = t["modes"][mode]
        assert m["steps_per_s"] > 0 and len(m["steps_per_s_reps"]) == 2
        assert m["samples_per_s"] == pytest.approx(m["steps_per_s"] * entry["throughput_batch"], rel=0.01)
        assert m["peak_memory_bytes"] > 50 * 2**20 and m["peak_memory_kind"] == "ru_maxrss"
    sd = t["slowdown"]
    assert sd["ci_low"] <= sd["median"] <= sd["ci_high"] and len(sd["ratios"]) == 2
    assert sd["pairs"] == sum(sd["pairs_per_repetition"]) >= 2 * sampling.MIN_ROUNDS  # settling takes at most 3 of 12
    assert f"{sd['pairs']} pairs" in r.stdout and "embedding: 2 repetitions" in r.stdout  # why it stopped, said
    assert t["time_budget_s"] == sd["time_budget_s"] == 60.0 and t["run_length"] == "steps"  # --steps given: a cap
    assert f"{sd['pairs']} pairs, {sd['how_stopped']}" in r.stdout and sd["stop"] in ("settled", "cap")
    assert t["top_ops"] and all(op["delta_ms"] > 0 for op in t["top_ops"])


@pytest.mark.slow
def test_each_repetition_is_a_fresh_process_with_its_mode_attested(throughput_run):
    cli, _, doc = throughput_run
    run_dir = cli.cwd / "results" / doc["run_id"]
    records = [json.loads((run_dir / rel).read_text()) for rel in model_entry(doc, "embedding")["throughput"]["records"]]
    assert [r["role"] for r in records] == ["throughput-strict-1", "throughput-default-1",
                                            "throughput-default-2", "throughput-strict-2"]
    import os

    for rec in records:
        assert rec["attestation"]["ok"] and rec["attestation"]["strict"] == (rec["mode"] == "strict")
        # warm-up and profiled steps untimed; the timing ends once the slowdown is known (at most 12)
        rep = int(rec["role"].rsplit("-", 1)[1]) - 1
        sd = model_entry(doc, "embedding")["throughput"]["slowdown"]
        timed = sd["pairs_per_repetition"][rep] + sd["warmup_rounds_dropped"][rep]
        assert len(rec["step_times_s"]) == len(rec["data_times_s"]) == timed <= 12
        assert rec["steps_per_s"] > 0
        assert rec["cpus"] == sorted(os.sched_getaffinity(0))[:1]  # a pair takes its turns on one CPU
        assert rec["steady_allocator"] is True
    assert not list((run_dir / "embedding").glob("turn-*"))  # the FIFOs are gone
    profiled = [r for r in records if r["ops"]]
    assert {r["role"] for r in profiled} == {r["role"] for r in records
                                             if int(r["role"].rsplit("-", 1)[1]) <= throughput.PROFILED_REPS}
    assert profiled[0]["profiled_steps"] == PROFILE_STEPS
    assert any(op["name"].startswith("aten::") for op in profiled[0]["ops"])
    strict = next(r for r in records if r["mode"] == "strict")
    default = next(r for r in records if r["mode"] == "default")
    assert strict["attestation"]["checks"]["deterministic_algorithms"]["actual"] is True
    assert "deterministic_algorithms" not in default["attestation"]["checks"]


@pytest.mark.slow
def test_the_run_is_recorded_in_the_history_with_image_and_commit_in_the_name(throughput_run):
    cli, _, doc = throughput_run
    files = list((cli.cwd / "results" / "history").glob("*.json"))
    assert len(files) == 1
    assert doc["run_id"] in files[0].name and "local" in files[0].name
    assert files[0].name.endswith(f"-{(doc['project_commit'] or 'nocommit')[:12]}.json")
    entry = json.loads(files[0].read_text())
    assert entry["schema"] == "reproci.history" and entry["version"] == 1
    summary = ThroughputSummary.from_json(entry["models"][0]["throughput"])
    assert summary == throughput.throughput_summary(model_entry(doc, "embedding"))
    assert throughput.check_regression(summary, summary, 1.1) is None


@pytest.mark.slow
def test_bookkeeping_mode_sets_only_the_cheap_controls(tmp_path: Path):
    """One worker in bookkeeping mode: seeds and the cuBLAS variable, no deterministic kernels."""
    from reproci.backends.local import LocalBackend

    spec = WorkerSpec(model_ref="embedding", model_name="embedding", role="throughput-bookkeeping-1", steps=8,
                      mode="bookkeeping", output="record.json", fingerprints=False, warmup_steps=3)
    spec_file = tmp_path / "spec.json"
    spec.write(spec_file)
    result = LocalBackend(build_options({}, env={})).launch(spec, spec_file, timeout=300)
    assert result.returncode == 0, result.log_tail
    rec = json.loads((tmp_path / "record.json").read_text())
    checks = rec["attestation"]["checks"]
    assert rec["attestation"]["ok"]
    assert checks["CUBLAS_WORKSPACE_CONFIG"]["actual"] == ":4096:8"
    assert checks["deterministic_algorithms"]["actual"] is False
    assert checks["cudnn_benchmark"]["actual"] is False
    assert len(rec["step_times_s"]) == 5 and rec["ops"] is None


CRASH_IN_STRICT = """
import torch
from reproci.reference_models.embedding import build as base


def build(ctx):
    setup = base(ctx)
    inner, calls = setup.loss_fn, [0]

    def loss_fn(model, batch):
        calls[0] += 1
        if calls[0] > 6 and torch.are_deterministic_algorithms_enabled():
            raise RuntimeError("strict-only failure at step 7")
        return inner(model, batch)

    setup.loss_fn = loss_fn
    return setup
"""


@pytest.mark.slow
def test_a_run_that_dies_during_its_turns_fails_the_pair_with_its_own_message(reproci: Cli):
    plugin = reproci.cwd / "crashy.py"
    plugin.write_text(CRASH_IN_STRICT)
    r = reproci("run", "--stage", "throughput", "-m", f"{plugin}:build", "--repetitions", "1", "--steps", "12",
                timeout=180)  # its partner must not wait for turns that never come
    assert r.returncode == 4, r.stdout + r.stderr
    entry = model_entry(reproci.latest(), "crashy")
    assert entry["verdict"] == "ERROR"
    assert "strict-only failure at step 7" in entry["message"]
    assert "throughput failed" in r.stdout


def test_every_report_says_how_the_sampling_stopped_beside_the_figure():
    """The terminal table and the Markdown report show the one sentence of ``how_stopped``."""
    from reproci.reports import build
    from reproci.stages.throughput import report

    sd = {"median": 1.1, "ci_low": 1.05, "ci_high": 1.15, "pairs": 94, "target_half_width": 0.02,
          "within_target": False, "stop": "budget", "how_stopped": sampling.how_stopped("budget", 0.041)}
    t = {"modes": {"strict": {"steps_per_s": 10.0}, "default": {"steps_per_s": 11.0}}, "slowdown": sd,
         "slowdowns": {"strict": sd}, "order": "step-by-step turns", "time_budget_s": 15.0, "run_length": "time"}
    doc = {"image": {"name": "local"}, "options": {}, "summary": {}, "models": [
        {"model": "conv", "verdict": verdicts.NOT_CHECKED, "throughput": t}]}
    assert report.slowdown_text(SampledSlowdown(**sd)) == ("1.100× [1.050, 1.150], 94 pairs, budget spent at ±4.1 % "
                                                          "(wider than the ±2.0% target)")
    md = build.markdown_report(doc, plugins.stages())
    assert "94 pairs, budget spent at ±4.1 %" in next(line for line in md.splitlines() if line.startswith("| conv |"))
    assert "or the time budget of 15 s a model is spent" in md


@pytest.mark.slow
def test_the_throughput_stage_alone_compares_its_cost_with_the_golden(tmp_path: Path):
    """A nightly cost job runs ``--stage throughput`` alone: its cost is compared with the golden's
    run as when the determinism stage runs beside it (the comparison used to run inside the
    determinism stage's golden check, so a cost job never compared). The golden's strict
    slowdown is set to 0.5× here, so this run's is past the factor: a warning, and exit 3 with
    --slowdown-fails."""
    import yaml

    cli = Cli(tmp_path)
    short = ("-m", "embedding", "--steps", "12", "--repetitions", "2", "--time-budget", "60")
    update = cli("golden", "update", "--stage", "determinism", "--stage", "throughput", *short)
    assert update.returncode == 0, update.stdout + update.stderr
    path = tmp_path / "goldens" / "local.yaml"
    header = "".join(line for line in path.read_text().splitlines(True) if line.startswith("#"))
    data = yaml.safe_load(path.read_text())
    data["models"]["embedding"]["throughput"]["slowdown"]["strict"]["median"] = 0.5
    path.write_text(header + yaml.safe_dump(data, sort_keys=False))
    cost = cli("run", "--stage", "throughput", *short, "--slowdown-fails")
    entry = model_entry(cli.latest(), "embedding")
    assert entry["verdict"] == verdicts.NOT_CHECKED, entry["message"]
    assert "against the golden's 0.500x" in entry["throughput_regression"], entry
    assert cost.returncode == 3 and "strict-mode slowdown regressed" in cost.stderr, cost.stdout + cost.stderr
