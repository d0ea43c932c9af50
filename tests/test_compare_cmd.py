"""``reproci compare``, the variance sections of the reports and the pull-request body, and
goldens with and without variance, on results documents written here (no training runs;
tests/test_variance.py makes the real runs)."""

from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from reproci import errors, plugins, results, typed
from reproci.golden import store
from reproci.reports import build, github, jsonexport, prbody
from reproci.stages import variance
from reproci.stages.variance.result import VarianceResult


def variance_result(losses: list[float], accuracy: list[float], seed: int = 0) -> dict[str, Any]:
    from reproci import stats

    return {"version": 1, "k": len(losses), "seeds": list(range(seed, seed + len(losses))), "steps": 30,
            "error": None, "seconds": 1.0, "records": [],
            "metrics": {"final_loss": {**stats.describe(losses), "lower_is_better": True},
                        "accuracy": {**stats.describe(accuracy), "lower_is_better": False}}}


def write_results(folder: Path, name: str, image: str = "local", **models: dict[str, Any]) -> Path:
    doc = results.new_document(run_id=name, created=f"2026-11-30T00:00:0{len(name) % 10}+00:00", image={"name": image},
                               options={"stages": ["variance"]},
                               models=[{"model": m, "verdict": "NOT_CHECKED", "message": "", "variance": v}
                                       for m, v in models.items()],
                               summary={"exit_code": 0})
    path = folder / name / "results.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(doc))
    return path


BASE = variance_result([2.00, 2.05, 1.95, 2.02, 1.98], [0.50, 0.52, 0.48, 0.51, 0.49])
SAME = variance_result([2.01, 2.04, 1.96, 2.00, 1.99], [0.51, 0.50, 0.49, 0.52, 0.48])
WORSE = variance_result([2.40, 2.45, 2.38, 2.42, 2.44], [0.40, 0.41, 0.39, 0.42, 0.40])


def test_inside_and_outside_seed_noise(cli, tmp_path: Path) -> None:
    a = write_results(tmp_path, "a", conv=BASE)
    code, out, _ = cli("compare", str(a), str(write_results(tmp_path, "b", conv=SAME)))
    assert code == 0
    assert "Welch's t" in out
    assert "conv final_loss ↓: A 2 ± 0.0381 (K=5), B 2 ± 0.0292 (K=5): inside seed noise (Δ = 0, 95 % CI [-0.0501, 0.0501])" in out
    assert "conv accuracy ↑:" in out and out.count(": inside seed noise (") == 2
    code, out, _ = cli("compare", str(a), str(write_results(tmp_path, "c", conv=WORSE)))
    assert code == 0
    assert ("conv final_loss ↓: A 2 ± 0.0381 (K=5), B 2.42 ± 0.0286 (K=5): outside seed noise: "
            "B is worse by 0.418 (95 % CI [0.368, 0.468])") in out
    assert ("conv accuracy ↑: A 0.5 ± 0.0158 (K=5), B 0.404 ± 0.0114 (K=5): outside seed noise: "
            "B is worse by 0.096 (95 % CI [-0.116, -0.0755])") in out  # accuracy fell: worse, too


def test_fail_worse_gates_on_a_worse_b_only(cli, tmp_path: Path) -> None:
    a = write_results(tmp_path, "a", conv=BASE)
    worse = write_results(tmp_path, "w", conv=WORSE)
    assert cli("compare", str(a), str(write_results(tmp_path, "s", conv=SAME)), "--fail-worse")[0] == 0
    code, out, _ = cli("compare", str(a), str(worse), "--fail-worse")
    assert code == errors.EXIT_DRIFT and "outside seed noise: B is worse" in out
    assert cli("compare", str(worse), str(a), "--fail-worse")[0] == 0  # B better than A: not a failure
    assert json.loads(cli("compare", str(a), str(worse), "--json")[1])["worse"] == ["conv final_loss", "conv accuracy"]


def test_json_output_and_notes(cli, tmp_path: Path) -> None:
    a = write_results(tmp_path, "a", conv=BASE, embedding=BASE)
    b = write_results(tmp_path, "b", conv=WORSE, transformer=BASE)
    code, out, _ = cli("compare", str(a), str(b), "--json")
    assert code == 0
    report = json.loads(out)
    assert report["schema"] == "reproci.compare" and report["inside"] is False
    loss = next(c for c in report["comparisons"] if c["metric"] == "final_loss")
    assert loss["model"] == "conv" and loss["inside"] is False and loss["lower_is_better"] is True
    assert loss["ci_low"] == pytest.approx(0.368, abs=1e-3) and loss["k_a"] == loss["k_b"] == 5
    assert report["notes"] == ["embedding: only in A", "transformer: only in B"]


def test_too_few_seeds_is_refused_with_its_own_exit_code(cli, tmp_path: Path) -> None:
    a = write_results(tmp_path, "a", conv=BASE)
    b = write_results(tmp_path, "b", conv=variance_result([2.0, 2.1], [0.5, 0.6]))
    code, out, err = cli("compare", str(a), str(b))
    assert code == errors.EXIT_TOO_FEW_SEEDS == 7 and out == ""
    assert err == ("error: too few seeds to tell a change from seed noise (conv: A has 5, B has 2): Welch's interval "
                   "needs at least 3 per side; re-run with --seeds 3 or more")


def test_bad_input_is_one_line_with_exit_2(cli, tmp_path: Path) -> None:
    a = write_results(tmp_path, "a", conv=BASE)
    none = write_results(tmp_path, "none")
    code, _, err = cli("compare", str(a), str(none))
    assert code == 2 and err == f"error: {none} holds no variance results; run `reproci run --stage variance` first"
    code, _, err = cli("compare", str(a), str(write_results(tmp_path, "other", embedding=BASE)))
    assert code == 2 and "no model has variance results on both sides" in err
    code, _, err = cli("compare", str(a))
    assert code == 2 and "compare needs two sides" in err
    code, _, err = cli("compare", str(a), str(tmp_path / "goldens" / "nope.yaml"))
    assert code == 2 and "golden file" in err and "does not exist" in err


def test_images_mean_their_latest_results(cli, tmp_path: Path) -> None:
    write_results(tmp_path, "old-x", image="x", conv=WORSE)
    write_results(tmp_path, "new-x1", image="x", conv=BASE)  # newer "created": the one that counts
    write_results(tmp_path, "y", image="y", conv=SAME)
    code, out, _ = cli("compare", "--image", "x", "--image", "y", "--results-dir", str(tmp_path))
    assert code == 0 and "new-x1" in out and out.count(": inside seed noise (") == 2
    code, _, err = cli("compare", "--image", "x", "--image", "z", "--results-dir", str(tmp_path))
    assert code == 2 and "no results of image 'z'" in err


def golden_doc(entry_variance: dict[str, Any] | None) -> tuple[dict[str, Any], dict[str, Any]]:
    model: dict[str, Any] = {"model": "conv", "ref": "conv", "steps": 30, "seed": 0, "code_sha256": "c" * 64,
                             "config_sha256": "d" * 64}
    if entry_variance is not None:
        model["variance"] = entry_variance
    doc = {"run_id": "r", "image": {"name": "img"}, "options": {"profile": "quick", "device": "cpu", "threads": 1},
           "environment": {}, "packages": {}, "models": [model]}
    return doc, {"conv": {"final_sha256": "a" * 64, "losses": [1.0], "tensor_sha256": {}}}


def test_goldens_keep_the_variance_and_older_goldens_still_load(cli, tmp_path: Path) -> None:
    doc, records = golden_doc(None)
    store.write(tmp_path, "old", doc, records, {}, plugins.stages())
    old = store.load(tmp_path, "old")
    assert old is not None and "variance" not in old.models["conv"].entry  # recorded before the stage existed
    doc, records = golden_doc(BASE)
    store.write(tmp_path, "img", doc, records, {}, plugins.stages())
    kept = store.load(tmp_path, "img").models["conv"].entry["variance"]  # type: ignore[union-attr]
    assert kept["k"] == 5 and kept["metrics"]["final_loss"]["values"] == BASE["metrics"]["final_loss"]["values"]
    code, out, _ = cli("compare", str(tmp_path / "img.yaml"), str(write_results(tmp_path, "b", conv=WORSE)))
    assert code == 0 and "outside seed noise: B is worse by 0.418" in out
    code, out, _ = cli("golden", "show", "img", "--goldens-dir", str(tmp_path))
    assert code == 0 and "conv: over 5 seeds: final_loss ↓ 2 ± 0.0381, accuracy ↑ 0.5 ± 0.0158" in out
    code, _, err = cli("compare", str(tmp_path / "old.yaml"), str(tmp_path / "img.yaml"))
    assert code == 2 and "old.yaml holds no variance results; record one with" in err


def judged_doc(current: dict[str, Any]) -> dict[str, Any]:
    v = dict(current)
    v["against_golden"] = typed.dump(variance.against(VarianceResult.from_json(BASE), VarianceResult.from_json(current),
                                                      "conv", run_id="g"))
    return {"run_id": "r", "image": {"name": "img", "backend": "local"}, "options": {"stages": ["variance"]},
            "summary": {"exit_code": 0}, "golden": {}, "models": [{"model": "conv", "verdict": "NOT_CHECKED",
                                                                    "message": "m", "variance": v}]}


def test_reports_and_the_pr_body_say_whether_the_metrics_moved() -> None:
    doc = judged_doc(WORSE)
    stages = plugins.stages()
    md = build.markdown_report(doc, stages)
    assert "### Seed-to-seed spread (variance stage)" in md
    assert "| conv | final_loss ↓ | 5 | 2.42 ± 0.0286 | 2.4, 2.45, 2.38, 2.42, 2.44 | outside seed noise: B is worse" in md
    body = prbody.render(doc, stages)
    assert "### Did the metrics move? (variance stage)" in body
    assert "| conv | `final_loss` | 2 ± 0.0381 (K=5) | 2.42 ± 0.0286 (K=5) | outside seed noise: B is worse by 0.418" in body
    assert "inside seed noise" in prbody.render(judged_doc(SAME), stages)
    assert "outside seed noise: B is worse by 0.418" in github.summary_markdown(doc, stages)  # the job's step summary
    exported = json.loads(jsonexport.render(doc, stages))
    assert exported["models"][0]["variance"]["metrics"]["accuracy"]["mean"] == pytest.approx(0.404)
    few = judged_doc(variance_result([2.0, 2.1], [0.5, 0.6]))
    assert "not compared: 5 seed(s) in the golden, 2 in this run" in prbody.render(few, stages)


class Images(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.images: list[dict[str, str | None]] = []
        self.section: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "section":
            self.section = dict(attrs).get("id")
        if tag == "img" and self.section == "variance":
            self.images.append(dict(attrs))


def test_the_html_report_draws_a_strip_chart_per_model() -> None:
    doc = judged_doc(WORSE)
    doc["models"].append({**doc["models"][0], "model": "embedding"})
    parser = Images()
    parser.feed(build.html_report(doc, plugins.stages()))
    assert [i["alt"] for i in parser.images] == ["seed strip chart of conv", "seed strip chart of embedding"]
    assert all(str(i["src"]).startswith("data:image/png;base64,") and len(str(i["src"])) > 2000 for i in parser.images)
