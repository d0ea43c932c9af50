"""A stage defined in one module (here, this test module) runs through ``reproci run``, its
results and its reports once it is composed with this package's stages (``plugins.compose``), its
option a flag of ``reproci run`` and a key of reproci.yaml: no other file names it. It trains
nothing. (``test_stage_entry_point.py`` installs one as a package's entry point.)"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
from rich.console import Console

from reproci import plugins, results
from reproci.results import ModelEntry, ResultsDocument
from reproci.settings.declared import INTEGER, setting
from reproci.stages.base import Stage, StageRun


@dataclass(frozen=True, kw_only=True)
class FakeOptions:
    fake_times: int = setting(1, type=int, yaml=INTEGER, convert=int, record=True,
                              help="Fake stage: what the letters are multiplied by (default 1).")


class Fake(Stage):
    """Counts each model's name's letters: a stage whose work is trivial."""

    name = "fake"
    options = FakeOptions

    def run(self, run: StageRun, entries: list[ModelEntry]) -> None:
        for entry in entries:
            results.add_section(entry, self.name, {"letters": len(entry["model"]) * run.options.of(FakeOptions).fake_times})

    def terminal(self, document: ResultsDocument, out: Console, err: Console) -> None:
        for m in document["models"]:
            out.print(f"{m['model']}: fake counted {m['fake']['letters']} letters", highlight=False)

    def markdown(self, document: ResultsDocument) -> list[str]:
        found = [m for m in document["models"] if "fake" in m]
        return ["### Fake stage", "", *(f"- {m['model']}: {m['fake']['letters']} letters" for m in found), ""] if found else []

    def html(self, document: ResultsDocument) -> str:
        found = [m for m in document["models"] if "fake" in m]
        return "".join(f'<p class="fake">{m["model"]}: {m["fake"]["letters"]} letters</p>' for m in found)


@pytest.fixture
def composed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Fake stage after this package's, as an installed package's entry point would add it."""
    stages = plugins.compose(extra=(Fake(),))
    monkeypatch.setattr(plugins, "stages", lambda: stages)


def test_a_composed_stage_runs_through_the_cli_results_and_reports(composed, cli, tmp_path: Path) -> None:
    (tmp_path / "reproci.yaml").write_text("fake_times: 2\n")
    common = ("--stage", "fake", "-m", "conv", "--goldens-dir", str(tmp_path / "goldens"), "--no-ci",
              "--config", str(tmp_path / "reproci.yaml"))
    code, out, _ = cli("run", *common, "--results-dir", str(tmp_path / "results"))
    assert code == 0, out
    assert "conv: fake counted 8 letters" in out
    written = next((tmp_path / "results").glob("*/results.json"))
    document = json.loads(written.read_text())
    assert document["options"]["stages"] == ["fake"] and document["options"]["fake_times"] == 2
    assert document["models"][0]["fake"] == {"letters": 8}
    code, out, _ = cli("run", *common, "--results-dir", str(tmp_path / "flag"), "--fake-times", "3")
    assert code == 0 and "conv: fake counted 12 letters" in out  # the command line over reproci.yaml
    assert json.loads(next((tmp_path / "flag").glob("*/results.json")).read_text())["options"]["fake_times"] == 3

    code, md, _ = cli("report", str(written), "--format", "md")
    assert code == 0 and "### Fake stage\n\n- conv: 8 letters" in md
    code, html, _ = cli("report", str(written), "--format", "html")
    assert code == 0 and '<p class="fake">conv: 8 letters</p>' in html


def test_a_stage_left_out_of_the_composition_is_no_stage_and_its_option_no_flag(cli) -> None:
    code, _, err = cli("run", "--stage", "fake", "-m", "conv")
    assert code == 2 and "unknown stage 'fake'" in err
    code, _, err = cli("run", "--fake-times", "3")
    assert code == 2 and "No such option '--fake-times'" in err
