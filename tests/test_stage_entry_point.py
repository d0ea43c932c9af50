"""A stage that another package adds by an entry point (group ``reproci.stages``), with no edit
to reproci: its option is a flag of ``reproci run`` and a key of reproci.yaml, its result is in
results.json, its parts are in what ``reproci run`` prints, every report, the PR body, the
annotations, the run history, the golden and ``reproci golden show``, and a merged matrix's
summary. The package is installed as pip installs one: a folder on the path holding the module
and its ``.dist-info`` with ``entry_points.txt``. It runs the real CLI, a conv model of 4 steps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.helpers import ROOT, Cli

STAGE = '''
from dataclasses import dataclass

from reproci import results
from reproci.settings.declared import INTEGER, setting
from reproci.stages.base import Stage


@dataclass(frozen=True, kw_only=True)
class LettersOptions:
    letter_weight: int = setting(1, type=int, yaml=INTEGER, convert=int, record=True,
                                 refuse=lambda v: None if v >= 1 else f"must be at least 1 (got {v})",
                                 help="Letters stage: what each letter of a model's name weighs (default 1).")


def _rows(document):
    return [(m["model"], m["letters"]["weight"]) for m in document["models"] if "letters" in m]


class Letters(Stage):
    """Weighs each model's name: a stage whose work is trivial."""

    name = "letters"
    options = LettersOptions
    matrix_columns = (("letter weight", lambda m: str((m.get("letters") or {}).get("weight", "-"))),)

    def run(self, run, entries):
        weight = run.options.of(LettersOptions).letter_weight
        for entry in entries:
            results.add_section(entry, self.name, {"weight": len(entry["model"]) * weight})

    def terminal(self, document, out, err):
        for model, weight in _rows(document):
            out.print(f"{model} weighs {weight} letters", highlight=False)

    def markdown(self, document):
        rows = _rows(document)
        return ["### Letters", "", *(f"- {m}: weighs {w}" for m, w in rows), ""] if rows else []

    def html(self, document):
        return "".join(f'<p class="letters">{m} weighs {w}</p>' for m, w in _rows(document))

    def pr_body(self, document):
        return [f"letters of {m}: {w}" for m, w in _rows(document)]

    def annotations(self, document):
        return [f"::notice title=letters::{m} weighs {w}" for m, w in _rows(document)]

    def golden_summary(self, entry):
        return entry.get("letters")

    def golden_lines(self, name, entry):
        return [f"{name} weighed {entry['letters']['weight']} letters"] if entry.get("letters") else []

    def history(self, entry):
        return {"letters": entry.get("letters")}

    def export(self, entry):
        return {"letters": entry.get("letters")}


STAGE = Letters()
'''


def install(site: Path, module: str, text: str, entry: str) -> None:
    """What ``pip install`` of a package with that entry point leaves on the path."""
    site.mkdir(parents=True, exist_ok=True)
    (site / f"{module}.py").write_text(text)
    info = site / f"{module}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[reproci.stages]\n{entry}\n")


@pytest.fixture
def letters(tmp_path: Path) -> dict[str, str]:
    site = tmp_path / "site"
    install(site, "reproci_letters", STAGE, "letters = reproci_letters:STAGE")
    return {"PYTHONPATH": f"{site}:{ROOT}"}


def test_a_stage_added_by_an_entry_point_appears_in_every_channel(reproci: Cli, letters: dict[str, str]) -> None:
    help_text = reproci("run", "--help", env=letters).stdout
    assert "--letter-weight" in help_text and "letters" in help_text.split("-s, --stage")[1].split("Repeatable")[0]
    (reproci.cwd / "reproci.yaml").write_text("letter_weight: 3\n")
    summary = reproci.cwd / "summary.md"
    run = reproci("run", "-m", "conv", "--steps", "4", "--stage", "determinism", "--stage", "letters",
                  "--update-golden", env={**letters, "GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(summary)})
    assert run.returncode == 0, run.stderr
    assert "conv weighs 12 letters" in run.stdout  # len("conv") * 3, from reproci.yaml
    assert "::notice title=letters::conv weighs 12" in run.stdout
    assert "### Letters" in summary.read_text()
    doc = reproci.latest()
    assert doc["options"]["letter_weight"] == 3 and doc["options"]["stages"] == ["determinism", "letters"]
    assert doc["models"][0]["letters"] == {"weight": 12}
    golden = yaml.safe_load((reproci.cwd / "goldens" / "local.yaml").read_text())
    assert golden["models"]["conv"]["letters"] == {"weight": 12}
    shown = reproci("golden", "show", "local", env=letters)
    assert "conv weighed 12 letters" in shown.stdout, shown.stderr
    history = json.loads(next((reproci.cwd / "results" / "history").glob("*.json")).read_text())
    assert history["models"][0]["letters"] == {"weight": 12}

    results = reproci.cwd / "results" / "latest.json"
    md = reproci("report", str(results), "--format", "md", env=letters).stdout
    assert "### Letters\n\n- conv: weighs 12" in md
    html = reproci("report", str(results), "--format", "html", env=letters).stdout
    assert '<p class="letters">conv weighs 12</p>' in html
    exported = json.loads(reproci("report", str(results), "--format", "json", env=letters).stdout)
    assert exported["models"][0]["letters"] == {"weight": 12}
    body = reproci("pr-body", str(results), env=letters).stdout
    assert "letters of conv: 12" in body
    merged_summary = reproci.cwd / "merged.md"
    merged = reproci("merge", str(results), "-o", str(reproci.cwd / "merged.json"), "--summary", str(merged_summary),
                     env=letters)
    assert merged.returncode == 0, merged.stderr
    assert "letter weight" in merged_summary.read_text() and "| 12 |" in merged_summary.read_text()

    flag = reproci("run", "-m", "conv", "--steps", "4", "--stage", "letters", "--letter-weight", "2",
                   "--results-dir", "flag", env=letters)
    assert flag.returncode == 0 and "conv weighs 8 letters" in flag.stdout  # the command line over reproci.yaml
    refused = reproci("run", "-m", "conv", "--stage", "letters", "--letter-weight", "0", env=letters)
    assert refused.returncode == 2 and "--letter-weight must be at least 1 (got 0)" in refused.stderr
    without = reproci("run", "--help")  # without the package: no such stage, no such option
    assert "--letter-weight" not in without.stdout


def test_a_broken_stage_entry_point_is_one_line_naming_its_package(reproci: Cli, tmp_path: Path) -> None:
    site = tmp_path / "broken"
    install(site, "reproci_broken", "import no_such_module_here\n", "broken = reproci_broken:STAGE")
    install(site, "reproci_clash", STAGE.replace('name = "letters"', 'name = "throughput"'), "clash = reproci_clash:STAGE")
    out = reproci("run", "--help", env={"PYTHONPATH": f"{site}:{ROOT}"})
    assert out.returncode == 2, out.stdout
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "reproci_broken" in lines[0] and "does not load" in lines[0], out.stderr
    (site / "reproci_broken-0.1.dist-info" / "entry_points.txt").unlink()
    out = reproci("run", "--help", env={"PYTHONPATH": f"{site}:{ROOT}"})
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 2 and len(lines) == 1 and "'throughput'" in lines[0], out.stderr
