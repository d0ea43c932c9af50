"""The portability probes (``reproci/stages/probes/`` and the worker's ``perturb`` and
``inspection``): each dependency found in a model as users write it, none in its fixed
twin, and ``--probes-fail``."""

from __future__ import annotations

import json
import subprocess
import sys

import torch

from reproci import errors, plugins, verdicts
from reproci.stages import probes
from reproci.worker import inspection, perturb
from reproci.worker.contract import ModelContext
from reproci.worker.data import loader
from reproci.worker.determinism import deterministic_mode
from tests.helpers import PLUGINS, ROOT, model_entry

sys.path.insert(0, str(PLUGINS))
import portability  # noqa: E402

CTX = ModelContext(profile="quick", device=torch.device("cpu"), seed=0)


def test_listings_come_reversed_through_every_api(tmp_path) -> None:
    for name in "bdaec":
        (tmp_path / f"{name}.txt").write_text("")
    code = ("import glob, json, os, pathlib, sys\n"
            "d = sys.argv[1]\n"
            "def show(): return [os.listdir(d), [e.name for e in os.scandir(d)], [os.path.basename(p) for p in glob.glob(d + '/*')],"
            " [p.name for p in pathlib.Path(d).iterdir()], next(os.walk(d))[2]]\n"
            "before = show()\n"
            "from reproci.worker.perturb import reverse_listings\n"
            "calls = reverse_listings()\n"
            "print(json.dumps([before, show(), calls['listings']]))")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(ROOT)}).stdout
    before, after, calls = json.loads(out)
    assert all(a == list(reversed(b)) for a, b in zip(after, before)) and calls == 5


def test_workers_rebuilt_keep_the_sampler_that_set_epoch_reaches() -> None:
    setup = portability.clean(CTX)
    sampler = setup.loader.sampler
    assert perturb.with_workers(setup, -1) == {"applicable": True, "num_workers": [0, 2]}
    assert setup.loader.num_workers == 2 and setup.loader.sampler is sampler
    for hook in loader.epoch_hooks(setup.loader):
        hook(3)
    assert sampler.epoch == 3
    plain = portability._pooled(CTX, torch.nn.Identity())
    plain.loader = list(plain.loader)
    assert perturb.with_workers(plain, -1)["applicable"] is False


def test_inspection_finds_the_repeated_epoch_order_and_the_batch_dependence() -> None:
    """With the worker's controls (one intra-op thread): which kernels a batch size picks
    depends on the thread count too."""
    with deterministic_mode(seed=0, threads=1):
        leaky, clean = portability.leaky(CTX), portability.clean(CTX)
        order, batch = inspection.epoch_order(leaky)
        assert order["same"] and not order["sequential"]
        assert inspection.batch_invariance(leaky, batch, torch.device("cpu"))["differs_at"]
        order, batch = inspection.epoch_order(clean)
        assert not order["same"]
        assert inspection.batch_invariance(clean, batch, torch.device("cpu"))["differs_at"] == []


def _doc(depends: list[str], probes_fail: bool) -> dict:
    return {"options": {"probes_fail": probes_fail},
            "models": [{"model": "m", "verdict": verdicts.NOT_CHECKED, "probes": {"depends": depends, "rows": []}}]}


def test_a_dependency_fails_only_with_probes_fail() -> None:
    stages = plugins.stages()
    assert verdicts.document_exit_code(_doc(["threads"], False), stages) == errors.EXIT_PASS
    assert verdicts.document_exit_code(_doc(["threads"], True), stages) == errors.EXIT_REPRO_FAILURE
    assert verdicts.document_exit_code(_doc([], True), stages) == errors.EXIT_PASS


def test_each_dependency_of_a_leaky_model_is_named_and_its_twin_is_clean(reproci) -> None:
    plugin = PLUGINS / "portability.py"
    r = reproci("run", "--stage", "probes", "-m", f"{plugin}:leaky", "-m", f"{plugin}:clean", "--steps", "5",
                "-j", "2", "--probes-fail",
                env={"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(reproci.cwd / "summary.md")})
    assert r.returncode == errors.EXIT_REPRO_FAILURE, r.stderr
    doc = reproci.latest()
    rows = {m: {row["probe"]: row for row in model_entry(doc, m)["probes"]["rows"]}
            for m in ("portability.leaky", "portability.clean")}
    assert {p: row["status"] for p, row in rows["portability.leaky"].items()} == dict.fromkeys(probes.PROBES, probes.DEPENDS)
    assert {p: row["status"] for p, row in rows["portability.clean"].items()} == dict.fromkeys(probes.PROBES, probes.INDEPENDENT)
    leaky = rows["portability.leaky"]
    assert "PYTHONHASHSEED (0 → 1): from step 1" in leaky["hash-seed"]["message"]
    assert "different batch" in leaky["listing-order"]["message"]
    assert "num_workers (2 → 0)" in leaky["num-workers"]["message"]
    assert "aten::convolution_backward in conv at portability.py:" in leaky["threads"]["message"]
    assert "epoch 2 visits the samples in the same order as epoch 1" in leaky["epoch-order"]["message"]
    assert "batch of 8, 16" in leaky["batch-size"]["message"]
    assert "Portability probes" in r.stdout and "--probes-fail is set" in r.stdout
    assert "::error title=reproci portability.leaky on local%3A depends on PYTHONHASHSEED" in r.stdout
    summary = (reproci.cwd / "summary.md").read_text()
    assert "(exit 1)" in summary and "### Portability probes" in summary and "| portability.leaky | hash-seed | depends |" in summary
    md = reproci("report", "--format", "json")
    report = json.loads(md.stdout)
    assert len(next(m for m in report["models"] if m["model"] == "portability.leaky")["probes"]) == len(probes.PROBES)


def test_the_webhook_says_which_dependency_failed_the_run() -> None:
    from reproci.reports import webhook

    doc = _doc(["hash-seed"], True)
    doc["models"][0]["probes"]["rows"] = [{"probe": "hash-seed", "factor": "PYTHONHASHSEED", "status": probes.DEPENDS,
                                           "message": "depends on PYTHONHASHSEED (0 → 1): from step 1"}]
    msg = webhook.slack_message(doc, plugins.stages())
    assert msg["text"].startswith("reproci: 1 model(s) need attention")
    assert "• *m*: depends on PYTHONHASHSEED (0 → 1)" in msg["text"]


def test_the_table_shows_a_status_it_has_no_colour_for_as_plain_text() -> None:
    """A results.json from a later release may carry a probe status this one does not know:
    its table still renders, the status shown as written (it raised MarkupError)."""
    from rich.console import Console

    from reproci.stages.probes import report

    row = {"model": "m", "probe": "threads", "status": "skipped [later]", "message": "not run"}
    doc = {"models": [{"model": "m", "verdict": verdicts.NOT_CHECKED, "probes": {"depends": [], "rows": [row]}}]}
    console = Console(record=True, width=120, color_system=None)
    console.print(report.table(doc))
    assert "skipped [later]" in console.export_text()
