"""A stage defined in one module (here, this test module) runs through ``reproci run``, its
results and its reports once it is registered: no other file names it. It trains nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console

from reproci.settings import options
from reproci.stages import registry
from reproci.stages.base import Stage, StageRun


class Fake(Stage):
    """Counts each model's name's letters: a stage whose work is trivial."""

    name = "fake"

    def run(self, run: StageRun, entries: list[dict[str, Any]]) -> None:
        for entry in entries:
            entry[self.name] = {"letters": len(entry["model"])}

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
    monkeypatch.setattr(registry, "STAGES", registry.STAGES)  # restored after the test, with the names below
    monkeypatch.setattr(options, "STAGES", options.STAGES)
    registry.register(Fake())

    code, out, _ = cli("run", "--stage", "fake", "-m", "conv", "--results-dir", str(tmp_path / "results"),
                       "--goldens-dir", str(tmp_path / "goldens"), "--no-ci")
    assert code == 0, out
    assert "conv: fake counted 4 letters" in out
    results = next((tmp_path / "results").glob("*/results.json"))
    document = json.loads(results.read_text())
    assert document["options"]["stages"] == ["fake"]
    assert document["models"][0]["fake"] == {"letters": 4}

    code, md, _ = cli("report", str(results), "--format", "md")
    assert code == 0 and "### Fake stage\n\n- conv: 4 letters" in md
    code, html, _ = cli("report", str(results), "--format", "html")
    assert code == 0 and '<p class="fake">conv: 4 letters</p>' in html
