"""A stage defined in one module (here, this test module) runs through ``reproci run``, its
results and its reports once it is registered, its knob an option of ``reproci run`` and a key
of reproci.yaml: no other file names it. It trains nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console

from reproci.settings import declared
from reproci.settings.declared import INTEGER, Option
from reproci.stages import registry
from reproci.stages.base import Stage, StageRun


class Fake(Stage):
    """Counts each model's name's letters: a stage whose work is trivial."""

    name = "fake"
    options = (Option(name="fake_times", group="fake", type=int, yaml=INTEGER, default=1, convert=int, record=True,
                      help="Fake stage: what the letters are multiplied by (default 1)."),)

    def run(self, run: StageRun, entries: list[dict[str, Any]]) -> None:
        for entry in entries:
            entry[self.name] = {"letters": len(entry["model"]) * run.options.knob("fake_times")}

    def terminal(self, document: dict[str, Any], out: Console, err: Console) -> None:
        for m in document["models"]:
            out.print(f"{m['model']}: fake counted {m['fake']['letters']} letters", highlight=False)

    def markdown(self, document: dict[str, Any]) -> list[str]:
        found = [m for m in document["models"] if "fake" in m]
        return ["### Fake stage", "", *(f"- {m['model']}: {m['fake']['letters']} letters" for m in found), ""] if found else []

    def html(self, document: dict[str, Any]) -> str:
        found = [m for m in document["models"] if "fake" in m]
        return "".join(f'<p class="fake">{m["model"]}: {m["fake"]["letters"]} letters</p>' for m in found)


def test_a_registered_stage_runs_through_the_cli_results_and_reports(cli, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(registry, "STAGES", registry.STAGES)  # restored after the test, with the stages the
    monkeypatch.setattr(declared, "STAGES", declared.STAGES)  # options know
    registry.register(Fake())

    (tmp_path / "reproci.yaml").write_text("fake_times: 2\n")
    common = ("--stage", "fake", "-m", "conv", "--goldens-dir", str(tmp_path / "goldens"), "--no-ci",
              "--config", str(tmp_path / "reproci.yaml"))
    code, out, _ = cli("run", *common, "--results-dir", str(tmp_path / "results"))
    assert code == 0, out
    assert "conv: fake counted 8 letters" in out
    results = next((tmp_path / "results").glob("*/results.json"))
    document = json.loads(results.read_text())
    assert document["options"]["stages"] == ["fake"] and document["options"]["fake_times"] == 2
    assert document["models"][0]["fake"] == {"letters": 8}
    code, out, _ = cli("run", *common, "--results-dir", str(tmp_path / "flag"), "--fake-times", "3")
    assert code == 0 and "conv: fake counted 12 letters" in out  # the command line over reproci.yaml
    assert json.loads(next((tmp_path / "flag").glob("*/results.json")).read_text())["options"]["fake_times"] == 3

    code, md, _ = cli("report", str(results), "--format", "md")
    assert code == 0 and "### Fake stage\n\n- conv: 8 letters" in md
    code, html, _ = cli("report", str(results), "--format", "html")
    assert code == 0 and '<p class="fake">conv: 8 letters</p>' in html
