"""``reproci report``: Markdown, self-contained HTML with charts, JSON, and history trends,
from real runs (one with the determinism and throughput stages, one throughput-only)."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
from pathlib import Path

import html5lib
import pytest

from pipeline.reports import build as report_build
from pipeline.reports import html as html_report

from .helpers import Cli, model_entry

pytestmark = pytest.mark.slow
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Cli, list[dict]]:
    cli = Cli(tmp_path_factory.mktemp("reports"))
    docs = []
    for stages, reps in ((("-s", "determinism", "-s", "throughput"), "2"), (("-s", "throughput"), "1")):
        r = cli("run", "-m", "embedding", *stages, "--steps", "8", "--resume-at", "4", "--repetitions", reps)
        assert r.returncode == 0, r.stdout + r.stderr
        docs.append(cli.latest())
    return cli, docs


def _images(tree) -> list[bytes]:
    ns = "{http://www.w3.org/1999/xhtml}"
    out = []
    for img in tree.iter(f"{ns}img"):
        src = img.get("src")
        assert src.startswith("data:image/png;base64,"), "charts are embedded, not linked"
        out.append(base64.b64decode(src.split(",", 1)[1]))
    return out


def test_markdown_shows_rates_slowdown_interval_top_ops_and_verdict(two_runs):
    cli, docs = two_runs
    md = report_build.render(cli.cwd / "results" / docs[0]["run_id"], "md", None)
    t = model_entry(docs[0], "embedding")["throughput"]
    assert "### Cost of strict determinism" in md
    row = next(line for line in md.splitlines() if line.startswith("| embedding |"))
    assert model_entry(docs[0], "embedding")["verdict"] in row  # the determinism verdict beside the cost
    assert f"{t['slowdown']['median']:.3f}× [{t['slowdown']['ci_low']:.3f}, {t['slowdown']['ci_high']:.3f}]" in row
    assert f"{t['modes']['strict']['steps_per_s']:.1f}" in row
    assert t["top_ops"][0]["op"] in md
    assert "### Slowdown over time" in md  # the history beside the results is picked up


def test_html_is_self_contained_parses_strictly_and_has_every_chart(two_runs):
    cli, docs = two_runs
    out = cli.cwd / "report.html"
    r = cli("report", "--format", "html", "--output", str(out))  # default: results/, its latest run
    assert r.returncode == 0, r.stderr
    text = out.read_text()
    tree = html5lib.HTMLParser(strict=True, namespaceHTMLElements=True).parse(text)
    images = _images(tree)
    # latest run is throughput-only: slowdown bars + history; no loss curves without runs A/B/C
    assert len(images) == 2 and all(i.startswith(PNG) and len(i) > 5000 for i in images)
    assert "http://" not in text.replace("http://www.w3.org", "") and "<script" not in text

    r = cli("report", str(cli.cwd / "results" / docs[0]["run_id"]), "--format", "html", "--output", str(out))
    assert r.returncode == 0, r.stderr
    tree = html5lib.HTMLParser(strict=True).parse(out.read_text())
    images = _images(tree)
    assert len(images) == 3  # slowdown bars, loss curves of A/B/C, slowdown history
    assert 'id="losses"' in out.read_text() and 'id="history"' in out.read_text()


def test_html_renders_in_a_headless_browser(two_runs, tmp_path: Path):
    """A real browser draws the page (skipped where Debian's chromium is not installed)."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("chromium is not installed")
    cli, _ = two_runs
    page = tmp_path / "report.html"
    assert cli("report", "--format", "html", "--output", str(page)).returncode == 0
    shot = tmp_path / "shot.png"
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    f"--screenshot={shot}", "--window-size=1200,1600", page.as_uri()],
                   capture_output=True, timeout=120)
    assert shot.is_file() and shot.read_bytes().startswith(PNG)
    import matplotlib.image

    pixels = matplotlib.image.imread(str(shot))
    assert pixels.std() > 0.05  # not a blank page


def test_loss_curves_overlay_the_golden_only_when_it_differs(two_runs):
    cli, docs = two_runs
    run_dir = cli.cwd / "results" / docs[0]["run_id"]
    entry = model_entry(docs[0], "embedding")
    series = html_report.loss_series(run_dir, entry, None)
    assert set(series) == {"A", "B", "C"}
    steps_c, _ = series["C"]
    assert steps_c[0] == 5  # C resumes after step 4
    same = list(series["A"][1])
    assert "golden" not in html_report.loss_series(run_dir, entry, same)
    assert "golden" in html_report.loss_series(run_dir, entry, [v + 1e-3 for v in same])


def test_json_report_and_history_trend_across_two_runs(two_runs):
    cli, docs = two_runs
    data = json.loads(report_build.render(cli.cwd / "results", "json", None))
    assert data["schema"] == "reproci.report" and data["version"] == 1
    assert data["run"]["run_id"] == docs[1]["run_id"]
    points = data["trends"]["local"]["embedding"]
    assert [p["run_id"] for p in points] == [d["run_id"] for d in docs]
    assert all(p["slowdown"] > 0 for p in points)

    r = cli("report", "--history", str(cli.cwd / "results" / "history"))  # trends only
    assert r.returncode == 0, r.stderr
    row = next(line for line in r.stdout.splitlines() if line.startswith("| local | embedding |"))
    assert "| 2 |" in row and "%" in row
    assert "Cost of strict determinism" not in r.stdout


def test_history_of_another_format_version_fails_with_what_to_do(two_runs, tmp_path: Path):
    cli, _ = two_runs
    hist = tmp_path / "history"
    shutil.copytree(cli.cwd / "results" / "history", hist)
    newer = json.loads(next(hist.glob("*.json")).read_text())
    newer["version"] = 99
    (hist / "future.json").write_text(json.dumps(newer))
    r = cli("report", "--history", str(hist))
    assert r.returncode == 2
    assert "version 99" in r.stderr and "upgrade reproci" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_missing_results_fail_with_one_line(reproci: Cli):
    r = reproci("report", "--format", "md")
    assert r.returncode == 2
    assert "run `reproci run` first" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_reports_are_readable_by_others_as_shared_files_are(two_runs, tmp_path: Path):
    cli, _ = two_runs
    out = tmp_path / "report.md"
    r = cli("report", "--format", "md", "--output", str(out))
    assert r.returncode == 0, r.stderr
    assert out.stat().st_mode & 0o777 == 0o666 & ~_umask()
    assert (cli.cwd / "results" / "latest.json").stat().st_mode & 0o044  # group and others can read


def _umask() -> int:
    from pipeline.atomic import umask

    return umask()


def test_error_messages_keep_square_brackets(cli):
    """A message is plain text, not markup: `pip install 'reproci[report]'` keeps its extra."""
    code, _, err = cli("run", "-m", "models[report].py:build")
    assert code == 2 and "models[report].py" in err


def test_on_an_80_column_terminal_the_verdict_is_never_cut():
    """A 60-character plugin name used to squeeze the verdict to `MODEL_CHANG…` and the hash,
    first difference and seconds to nothing: now the name wraps and the verdict stays whole."""
    import io

    from rich.console import Console

    from pipeline.reports.terminal import verdict_table

    name = "a_very_long_plugin_module_name.with_a_factory_name_that_goes_on"
    doc = {"image": {"name": "local", "backend": "local"},
           "models": [{"model": name, "verdict": "MODEL_CHANGED", "final_sha256": "0123456789abcdef", "seconds": 12.3},
                      {"model": "conv", "verdict": "NONDETERMINISTIC", "final_sha256": "abcdefabcdef12", "seconds": 3.0,
                       "evidence": {"step": 3, "tensor": "grad:head.weight", "max_abs": 1e-3, "max_ulp": 12}}]}
    console = Console(file=io.StringIO(), width=80)
    console.print(verdict_table(doc))
    text = console.file.getvalue()
    assert "MODEL_CHANGED" in text and "NONDETERMINISTIC" in text and "…" not in text
    assert "0123456789ab" in text and "12.3" in text and "3.0" in text
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "".join(line.split("│")[1].strip() for line in text.splitlines() if line.startswith("│")).endswith(
        name.replace(" ", ""))


def test_code_in_a_message_is_code_in_the_html_report():
    from pipeline.reports.html import prose

    assert prose("record one with `reproci golden update --image local` <now>") == (
        "record one with <code>reproci golden update --image local</code> &lt;now&gt;")
    assert prose("an `unpaired backtick") == "an `unpaired backtick"


def test_a_run_that_recorded_its_golden_says_so(files):
    """It used to say "no golden file ...; record one with `reproci golden update`" right after recording it."""
    from pipeline import results

    doc = results.load(files["recorded"])
    for m in doc["models"]:
        assert "golden recorded in" in m["message"] and "record one with" not in m["message"], m["message"]
        assert m["golden"]["recorded"] is True
