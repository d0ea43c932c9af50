"""``reproci merge``: per-image shards of the CI matrix merged into one verdict.

The shards are real results files: two real ``reproci run`` invocations (the first records
a golden, the second is compared against it), plus copies edited to stand for other images
that drifted or failed (those need a GPU image to happen for real).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from reproci import errors, results, verdicts
from reproci.cluster import merge_shards
from tests.helpers import artifact_layout, run_step, write_shard
from tests.workflow_helpers import load as load_workflow
from tests.workflow_helpers import step_named


def test_the_fixture_runs_are_real_and_compared_to_a_real_golden(files: dict[str, Path]) -> None:
    recorded, compared = (results.load(files[k]) for k in ("recorded", "compared"))
    assert recorded["golden"]["updated"] is True and recorded["models"][0]["verdict"] == verdicts.NEW
    golden = compared["models"][0]["golden"]
    assert compared["models"][0]["verdict"] == verdicts.PASS
    assert golden["golden_final_sha256"] == recorded["models"][0]["final_sha256"]


def test_passing_shards_merge_to_exit_0_with_a_versioned_document(files, cli, tmp_path: Path) -> None:
    drifted_doc = json.loads(files["drifted"].read_text())
    drifted_doc["models"][0]["verdict"] = verdicts.PASS
    files_pass = tmp_path / "pass.json"
    files_pass.write_text(json.dumps({**drifted_doc, "summary": {**drifted_doc["summary"], "exit_code": 0}}))
    code, out, err = cli("merge", str(files["compared"]), str(files_pass), "--output", str(tmp_path / "m.json"))
    assert code == 0, err
    merged = merge_shards.load_merged(tmp_path / "m.json")
    assert merged["schema"] == "reproci.merged" and merged["version"] == merge_shards.VERSION
    assert [s["image"]["name"] for s in merged["shards"]] == ["cpu-torch2.13", "cuda12.6-torch2.7"]
    assert merged["summary"] == {"verdicts": {"PASS": 2}, "images": 2, "models": 2, "missing": 0, "exit_code": 0,
                                 "recorded": 0}
    assert "::" not in out and "exit 0" in out


def test_merged_to_stdout_the_output_is_the_document_alone(files, cli, tmp_path: Path) -> None:
    """``-o -`` writes the merged document to stdout; merge's own lines go to stderr, so that the
    document can be piped (they used to be mixed into it)."""
    code, out, err = cli("merge", str(files["recorded"]), "--output", "-", "--annotations")
    assert code == 0, err
    assert json.loads(out)["schema"] == "reproci.merged"
    assert "merged 1 image(s)" in err


def test_a_shard_that_recorded_its_golden_is_said_to_have_recorded_it(files, cli, tmp_path: Path) -> None:
    code, out, err = cli("merge", str(files["recorded"]), "--output", str(tmp_path / "m.json"))
    assert code == 0, err
    assert "NEW 1 (1 golden recorded by these runs)" in out


def test_most_serious_shard_wins_with_annotations_and_a_summary(files, cli, tmp_path: Path) -> None:
    shards = artifact_layout(tmp_path / "shards", files, "compared", "drifted", "failed")
    summary = tmp_path / "summary.md"
    summary.write_text("# earlier step\n")
    code, out, err = cli("merge", str(shards), "--output", str(tmp_path / "m.json"), "--summary", str(summary),
                         "--annotations")
    assert code == errors.EXIT_REPRO_FAILURE  # 1 (not reproducible) outranks 3 (drift)
    merged = json.loads((tmp_path / "m.json").read_text())
    assert merged["summary"]["verdicts"] == {"NONDETERMINISTIC": 1, "PASS": 1, "UPGRADE_CHANGED": 1}
    lines = out.splitlines()
    error = next(line for line in lines if line.startswith("::error "))
    assert error.startswith("::error title=reproci embedding on cuda12.4-torch2.5%3A NONDETERMINISTIC::")
    assert "%0A" in error and "\n" not in error  # a multi-line message stays one workflow command
    assert "step 2" in error and "grad:mlp.0.weight" in error
    warning = next(line for line in lines if line.startswith("::warning ") and "UPGRADE_CHANGED" in line)
    assert "cuda12.6-torch2.7" in warning and "param:tables.0.weight" in warning
    # a shard's warnings ride along into the merge: the coverage note of its run is annotated too
    assert any(line.startswith("::warning ") and "warning (coverage.note)" in line for line in lines), lines
    text = summary.read_text()
    assert text.startswith("# earlier step\n")  # appended, as GitHub's step summary is
    assert "## reproci: ❌ not reproducible (exit 1)" in text
    assert "| `cuda12.6-torch2.7` | embedding | ⚠️ UPGRADE_CHANGED | step 3, `param:tables.0.weight`, |Δ| 2.38e-07 (2 ULP)" \
        .replace("|Δ|", "\\|Δ\\|") in text
    assert "1.234× [1.200, 1.260]" in text
    assert "torch 2.7.0 → 2.7.1" in text and "triton ∅ → 3.3.1" in text


def test_drift_alone_exits_3(files, cli, tmp_path: Path) -> None:
    code, out, _ = cli("merge", str(files["compared"]), str(files["drifted"]), "--output", str(tmp_path / "m.json"))
    assert code == errors.EXIT_DRIFT
    assert "UPGRADE_CHANGED 1" in out


def test_a_missing_shard_is_an_infrastructure_failure(files, cli, tmp_path: Path) -> None:
    matrix = json.dumps({"include": [{"image": "cpu-torch2.13", "tag": "reproci/cpu-torch2.13:1"},
                                     {"image": "cuda12.6-torch2.7", "tag": "reproci/cuda12.6-torch2.7:1"}]})
    summary = tmp_path / "s.md"
    code, out, _ = cli("merge", str(files["compared"]), "--matrix", matrix, "--output", str(tmp_path / "m.json"),
                       "--summary", str(summary), "--annotations")
    assert code == errors.EXIT_INFRA
    assert "::error title=reproci cuda12.6-torch2.7::no results from image cuda12.6-torch2.7" in out
    assert "**No results from:** `cuda12.6-torch2.7`" in summary.read_text()
    assert json.loads((tmp_path / "m.json").read_text())["missing"] == ["cuda12.6-torch2.7"]


def test_nothing_arrived_at_all(cli, tmp_path: Path) -> None:
    (tmp_path / "shards").mkdir()
    matrix = tmp_path / "matrix.json"
    matrix.write_text(json.dumps({"include": [{"image": "cpu-torch2.13", "tag": "t"}]}))
    code, _, _ = cli("merge", str(tmp_path / "shards"), "--matrix", str(matrix), "--output", str(tmp_path / "m.json"))
    assert code == errors.EXIT_INFRA
    code, _, err = cli("merge", str(tmp_path / "shards"), "--output", str(tmp_path / "m.json"))
    assert code == errors.EXIT_USAGE and "no results.json under" in err


def test_the_newest_run_of_an_image_wins(files, cli, tmp_path: Path) -> None:
    older = json.loads(files["failed"].read_text())
    older["created"] = "2000-01-01T00:00:00+00:00"
    older_path = write_shard(tmp_path, "old", older)
    newer = json.loads(files["drifted"].read_text())
    newer["image"]["name"] = "cuda12.4-torch2.5"
    newer_path = write_shard(tmp_path, "new", newer)
    code, _, err = cli("merge", str(older_path), str(newer_path), "--output", str(tmp_path / "m.json"))
    assert code == errors.EXIT_DRIFT
    assert f"ignored older {older_path}" in err


def test_shards_of_another_format_version_are_refused(files, cli, tmp_path: Path) -> None:
    doc = json.loads(files["compared"].read_text())
    doc["version"] = 99
    bad = write_shard(tmp_path, "bad", doc)
    code, _, err = cli("merge", str(bad), "--output", str(tmp_path / "m.json"))
    assert code == errors.EXIT_USAGE and "version 99" in err and "upgrade reproci" in err
    assert not (tmp_path / "m.json").exists()


def test_bad_matrix_and_missing_paths_are_usage_errors(files, cli, tmp_path: Path) -> None:
    code, _, err = cli("merge", str(files["compared"]), "--matrix", '{"jobs": 1}', "--output", str(tmp_path / "m.json"))
    assert code == errors.EXIT_USAGE and "reproci matrix" in err
    code, _, err = cli("merge", str(tmp_path / "nope"), "--output", str(tmp_path / "m.json"))
    assert code == errors.EXIT_USAGE and "does not exist" in err


def test_merged_files_of_another_version_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"schema": merge_shards.SCHEMA, "version": 2}))
    with pytest.raises(errors.ResultsError, match="run `reproci merge`"):
        merge_shards.load_merged(path)


@pytest.mark.parametrize("codes, worst", [([], 0), ([0, 3], 3), ([3, 1, 0], 1), ([1, 4, 3], 4), ([4, 5], 5),
                                          ([6, 4], 6), ([0, 2], 2)])
def test_most_serious_code(codes: list[int], worst: int) -> None:
    assert errors.most_serious(codes) == worst


def test_the_workflow_merge_step_runs_on_downloaded_artifacts(files, tmp_path: Path) -> None:
    """The merge step of reproci-check.yml (which reproci.yml calls), run as GitHub's bash runs
    it, with the real CLI on PATH and the environment the runner gives it ($GITHUB_STEP_SUMMARY,
    $GITHUB_ACTIONS)."""
    artifact_layout(tmp_path / "shards", files, "compared", "drifted")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "reproci").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m reproci.cli "$@"\n')
    (bin_dir / "reproci").chmod(0o755)
    matrix = json.dumps({"include": [{"image": "cpu-torch2.13", "tag": "reproci/cpu-torch2.13:1"},
                                     {"image": "cuda12.6-torch2.7", "tag": "reproci/cuda12.6-torch2.7:1"}]})
    step = step_named(load_workflow("reproci-check"), "merge", "Merge into one verdict (summary, annotations, exit code)")
    summary = tmp_path / "step-summary.md"
    out, _ = run_step(step, {"MATRIX": matrix, "GITHUB_STEP_SUMMARY": str(summary), "GITHUB_ACTIONS": "true"},
                      tmp_path, bin_dir, tmp_path)
    assert out.returncode == errors.EXIT_DRIFT, out.stderr
    assert "::warning title=reproci embedding on cuda12.6-torch2.7%3A UPGRADE_CHANGED::" in out.stdout
    assert "## reproci: ⚠️ golden drift (exit 3)" in summary.read_text()
    assert json.loads((tmp_path / "merged.json").read_text())["summary"]["images"] == 2
