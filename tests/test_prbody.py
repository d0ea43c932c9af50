"""``reproci pr-body``: the evidence of a golden update, rendered for the pull request.

Uses the real results files of tests/test_merge.py (a real run that recorded a golden, a
real run compared against it, and copies edited to stand for a drifted and a failed
image). Tables are read back with a real Markdown parser (markdown-it-py, rich's own).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from markdown_it import MarkdownIt

from reproci import errors, plugins, results
from reproci.reports import prbody
from tests.helpers import run_record, write_shard


def tables(markdown: str) -> dict[str, list[dict[str, str]]]:
    """Every table of a Markdown text, by the heading above it: a list of {column: cell}."""
    tokens = MarkdownIt("commonmark").enable("table").parse(markdown)
    found: dict[str, list[dict[str, str]]] = {}
    heading, header, rows, row, in_head = "", [], [], [], False
    for i, tok in enumerate(tokens):
        if tok.type == "heading_open":
            heading = tokens[i + 1].content
        elif tok.type == "thead_open":
            header, rows, in_head = [], [], True
        elif tok.type == "thead_close":
            in_head = False
        elif tok.type == "tr_open":
            row = []
        elif tok.type in ("th_open", "td_open"):
            inline = tokens[i + 1]  # the cell's text as a reader sees it (code spans unwrapped)
            text = "".join(c.content for c in inline.children or [] if c.type in ("text", "code_inline"))
            (header if in_head else row).append(text)
        elif tok.type == "tr_close" and not in_head:
            rows.append(dict(zip(header, row)))
        elif tok.type == "table_close":
            found[heading] = rows
    return found


def render(path: Path) -> str:
    return prbody.render(results.load(path), plugins.stages())


def test_a_first_golden_from_a_real_run(files: dict[str, Path], cli, tmp_path: Path) -> None:
    out_file = tmp_path / "body.md"
    code, out, err = cli("pr-body", str(files["recorded"]), "--output", str(out_file), "--require-reproducible")
    assert code == 0, err
    assert str(out_file) in out
    body = out_file.read_text()
    doc = results.load(files["recorded"])
    assert body.startswith("## Golden update for `cpu-torch2.13`")
    assert "✅ Every model reproduced itself in this image (A = B = C, 1 model(s))." in body
    assert "No earlier golden for this image: this is its first." in body
    assert "(written by this run)" in body
    assert "No earlier golden to compare packages with." in body
    assert "The throughput stage did not run" in body
    (model,) = tables(body)["Models"]
    assert model["model"] == "embedding" and model["verdict"] == "NEW"
    assert model["final sha256 (golden → new)"] == f"- → {doc['models'][0]['final_sha256'][:12]}"
    assert f"torch {doc['environment']['torch']}" in body


def test_a_run_compared_with_its_golden_shows_both_hashes(files: dict[str, Path]) -> None:
    body = render(files["compared"])
    doc = results.load(files["compared"])
    sha = doc["models"][0]["final_sha256"][:12]
    (model,) = tables(body)["Models"]
    assert model["verdict"] == "PASS" and model["final sha256 (golden → new)"] == f"{sha} → {sha}"
    assert "No package changes." in body


def test_an_upgrade_carries_digests_packages_evidence_and_slowdown(files: dict[str, Path]) -> None:
    body = render(files["drifted"])
    t = tables(body)
    image = {row[""]: row for row in t["Image"]}
    assert image["digest"]["current golden"] == "sha256:" + "a" * 64
    assert image["digest"]["this run"] == "sha256:" + "b" * 64
    assert image["reference"]["current golden"] == "reproci/cuda12.6-torch2.7:0"
    packages = {row["package"]: (row["golden"], row["this run"]) for row in t["Package changes"]}
    assert packages == {"nvidia-cudnn-cu12": ("9.5.1.17", "9.7.0.66"), "torch": ("2.7.0", "2.7.1"),
                        "triton": ("(absent)", "3.3.1")}
    assert t["Environment changes"] == [{"key": "gpu.driver", "golden": "550.54", "this run": "570.86"}]
    (model,) = t["Models"]
    assert model["verdict"] == "UPGRADE_CHANGED"
    assert model["final sha256 (golden → new)"].startswith("c" * 12 + " → ")
    assert (model["first differing step"], model["first tensor"], model["max abs diff"], model["max ULP"],
            model["loss agrees to (digits)"]) == ("3", "param:tables.0.weight", "2.38e-07", "2", "6")
    (cost,) = t["Cost of strict determinism"]
    assert cost == {"model": "embedding", "strict steps/s": "41.50", "default steps/s": "51.20",
                    "slowdown (median [95% CI])": "1.234× [1.200, 1.260]",
                    "most slowed op": "aten::index_add_ 3.10 ms strict vs 1.20 ms"}


@pytest.mark.parametrize("change, reason", [
    ("failed", "NONDETERMINISTIC"),
    ("tampered", "did not all finish with one final hash"),
    ("throughput-only", "determinism stage did not run"),
    ("refused", "the golden was not recorded: runs disagree"),
    ("not-recorded", "the golden was not recorded: this run had no --update-golden"),
])
def test_an_unreproducible_run_is_refused(files: dict[str, Path], cli, tmp_path: Path, change: str,
                                          reason: str) -> None:
    if change == "failed":
        path = files["failed"]
    else:
        doc: dict[str, Any] = json.loads(files["compared"].read_text())
        if change == "tampered":
            doc["models"][0]["runs"]["C"]["final_sha256"] = "f" * 64
        elif change == "throughput-only":
            doc["options"]["stages"] = ["throughput"]
        elif change == "not-recorded":
            doc["golden"] = {"file": "goldens/cpu-torch2.13.yaml", "updated": False}
        else:
            doc["golden"] = {"file": "goldens/cpu-torch2.13.yaml", "updated": False, "refused": "runs disagree"}
        path = write_shard(tmp_path, change, doc)
    out_file = tmp_path / "body.md"
    code, _, err = cli("pr-body", str(path), "--output", str(out_file), "--require-reproducible")
    assert code == errors.EXIT_REPRO_FAILURE
    assert reason in err and "not recording a golden" in err
    assert not out_file.exists()
    # Without --require-reproducible the body still renders, and says why it must not land.
    code, out, _ = cli("pr-body", str(path))
    assert code == 0 and "must not become a golden" in out and reason.split(":")[0] in out


def test_a_reproducible_run_without_update_golden_is_not_headlined_not_reproducible(files: dict[str, Path], cli,
                                                                                   tmp_path: Path) -> None:
    """A real run of A = B = C that had no --update-golden: the body says its models reproduced
    themselves and that it recorded no golden, not that it was not reproducible; the refusal
    says the same and what to run."""
    code, body, _ = cli("pr-body", str(files["compared"]))
    assert code == 0
    assert "✅ Every model reproduced itself in this image (A = B = C, 1 model(s))." in body
    assert "not reproducible" not in body
    assert items(body, "Golden update for `cpu-torch2.13`") == [
        "the golden was not recorded: this run had no --update-golden"]
    assert "**⚠️ This run recorded no golden; it must not become a golden update:**" in body
    code, _, err = cli("pr-body", str(files["compared"]), "--require-reproducible")
    assert code == errors.EXIT_REPRO_FAILURE and len(err.strip().splitlines()) == 1
    assert "did not reproduce" not in err and "recorded none" in err and "reproci golden update" in err


def test_results_without_golden_or_throughput_keys_render(files: dict[str, Path], tmp_path: Path) -> None:
    doc = json.loads(files["compared"].read_text())
    doc.pop("golden", None)
    for m in doc["models"]:
        m.pop("golden", None)
        m.pop("throughput", None)
    body = prbody.render(doc, plugins.stages())
    assert tables(body)["Models"][0]["verdict"] == "PASS"
    assert "The throughput stage did not run" in body


def test_huge_package_diffs_stay_under_githubs_body_limit(files: dict[str, Path]) -> None:
    doc = json.loads(files["drifted"].read_text())
    doc["models"][0]["golden"]["package_diff"] = {f"package-{i:04d}": ["1.0", "2.0"] for i in range(2000)}
    body = prbody.render(doc, plugins.stages())
    assert len(body) < 65536
    assert len(tables(body)["Package changes"]) == prbody.MAX_ROWS
    assert "1800 more rows" in body


def test_missing_results_file_is_a_usage_error(cli, tmp_path: Path) -> None:
    code, _, err = cli("pr-body", str(tmp_path / "results.json"))
    assert code == errors.EXIT_USAGE and "does not exist" in err


def items(markdown: str, heading: str) -> list[str]:
    """The list items under a heading, as a reader sees them."""
    tokens = MarkdownIt("commonmark").parse(markdown)
    found, under = [], False
    for i, tok in enumerate(tokens):
        if tok.type == "heading_open":
            under = tokens[i + 1].content == heading
        elif under and tok.type == "inline" and [t.type for t in tokens[i - 2:i]] == ["list_item_open", "paragraph_open"]:
            found.append(tok.content)
    return found


def test_ranks_that_share_their_batches_are_a_warning_the_reviewer_sees() -> None:
    """The Models list shows the golden's message, which does not carry the determinism stage's
    warnings: the body lists them under their own heading, beside a reproducible verdict."""
    from reproci.stages.determinism import replicas

    said = replicas.shared_batches(run_record(batch_fingerprints=[7, 8]), {1: {"A": run_record(batch_fingerprints=[7, 8])}})
    assert said
    doc = {"run_id": "r1", "image": {"name": "local"}, "options": {"stages": ["determinism"]},
           "golden": {"updated": True, "file": "goldens/local.yaml"},
           "models": [{"model": "ddp.unsharded", "verdict": "NEW", "message": f"A = B = C; warning: {said}",
                       "shared_batches": said,
                       "golden": {"verdict": "NEW", "message": "golden recorded in goldens/local.yaml"},
                       "runs": {r: {"final_sha256": "ab" * 32} for r in "ABC"}, "final_sha256": "ab" * 32}]}
    body = prbody.render(doc, plugins.stages())
    assert "✅ Every model reproduced itself in this image" in body
    assert items(body, "Models") == ["**ddp.unsharded**: golden recorded in goldens/local.yaml"]
    assert items(body, "Warnings") == [f"⚠️ **ddp.unsharded**: {said}"]
