"""``reproci report``: Markdown, self-contained HTML with charts, JSON, and history trends,
from real runs (one with the determinism and throughput stages, one throughput-only); and
every warning a result carries, in every channel that shows its verdict."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
from pathlib import Path

import html5lib
import pytest

from reproci import plugins
from reproci.reports import build as report_build
from reproci.reports import html as html_report

from .helpers import Cli, model_entry, run_record, unavailable

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


@pytest.mark.slow
def test_markdown_shows_rates_slowdown_interval_top_ops_and_verdict(two_runs):
    cli, docs = two_runs
    md = report_build.render(cli.cwd / "results" / docs[0]["run_id"], "md", None, plugins.stages())
    t = model_entry(docs[0], "embedding")["throughput"]
    assert "### Cost of strict determinism" in md
    row = next(line for line in md.splitlines() if line.startswith("| embedding |"))
    assert model_entry(docs[0], "embedding")["verdict"] in row  # the determinism verdict beside the cost
    assert f"{t['slowdown']['median']:.3f}× [{t['slowdown']['ci_low']:.3f}, {t['slowdown']['ci_high']:.3f}]" in row
    assert f"{t['modes']['strict']['steps_per_s']:.1f}" in row
    assert t["top_ops"][0]["op"] in md
    assert "### Slowdown over time" in md  # the history beside the results is picked up


@pytest.mark.slow
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


@pytest.mark.slow
def test_html_renders_in_a_headless_browser(two_runs, tmp_path: Path):
    """A real browser draws the page (skipped where Debian's chromium is not installed, unless
    REPROCI_REQUIRE_BROWSER=1)."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        unavailable("BROWSER", "chromium is not installed (`apt-get install chromium` installs Debian's)")
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_json_report_and_history_trend_across_two_runs(two_runs):
    cli, docs = two_runs
    data = json.loads(report_build.render(cli.cwd / "results", "json", None, plugins.stages()))
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_reports_are_readable_by_others_as_shared_files_are(two_runs, tmp_path: Path):
    cli, _ = two_runs
    out = tmp_path / "report.md"
    r = cli("report", "--format", "md", "--output", str(out))
    assert r.returncode == 0, r.stderr
    assert out.stat().st_mode & 0o777 == 0o666 & ~_umask()
    assert (cli.cwd / "results" / "latest.json").stat().st_mode & 0o044  # group and others can read


def _umask() -> int:
    from reproci.atomic import umask

    return umask()


@pytest.mark.slow
def test_error_messages_keep_square_brackets(cli):
    """A message is plain text, not markup: `pip install 'reproci[report]'` keeps its extra."""
    code, _, err = cli("run", "-m", "models[report].py:build")
    assert code == 2 and "models[report].py" in err


def test_on_an_80_column_terminal_the_verdict_is_never_cut():
    """A 60-character plugin name used to squeeze the verdict to `MODEL_CHANG…` and the hash,
    first difference and seconds to nothing: now the name wraps and the verdict stays whole."""
    import io

    from rich.console import Console

    from reproci.reports.terminal import verdict_table

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
    from reproci.reports.html import prose

    assert prose("record one with `reproci golden update --image local` <now>") == (
        "record one with <code>reproci golden update --image local</code> &lt;now&gt;")
    assert prose("an `unpaired backtick") == "an `unpaired backtick"


def test_a_run_that_recorded_its_golden_says_so(files):
    """It used to say "no golden file ...; record one with `reproci golden update`" right after recording it."""
    from reproci import results

    doc = results.load(files["recorded"])
    for m in doc["models"]:
        assert "golden recorded in" in m["message"] and "record one with" not in m["message"], m["message"]
        assert m["golden"]["recorded"] is True


# --- warnings: one list (``verdicts.warnings``), every channel that shows a verdict ---

# Every field of a model entry that is not a warning: data, a verdict, or a section with its own
# table (a section named here whole holds no warning at any depth). A new field of
# ``results.ModelEntry`` fails the test below until it is named here or typed
# ``results.WarningText``, which puts it in every channel at once.
NOT_WARNINGS = {
    "model", "ref", "plugin", "description", "source", "code_sha256", "steps", "resume_at", "seed", "fault",
    "verdict", "message", "final_sha256", "config", "config_sha256", "batch_size", "attestation", "evidence",
    "golden", "execution", "world_size",
    "coverage.epochs", "coverage.batches_per_epoch", "coverage.resume_at", "coverage.resume_epoch", "runs", "records",
    "across_nodes", "error", "seconds", "state_census.differences", "state_census.errors",
}


def _fields(kind: type, prefix: str = "") -> set[str]:
    """Every field of a typed dict, and of the typed dicts it holds, as 'coverage.note'; a section
    named whole in ``NOT_WARNINGS`` as itself."""
    from typing import get_type_hints

    from reproci import results

    out: set[str] = set()
    for name, hint in get_type_hints(kind, include_extras=True).items():
        inner = [] if prefix + name in NOT_WARNINGS else results.sections(hint)
        out |= set().union(*(_fields(t, f"{prefix}{name}.") for t in inner)) if inner else {prefix + name}
    return out


def test_every_field_of_a_model_entry_is_a_warning_or_said_not_to_be_one():
    from reproci import results

    warnings = {".".join(path) for path in results.WARNING_FIELDS}
    assert {"shared_batches", "epoch_order", "coverage.note", "throughput_regression"} <= warnings
    assert _fields(results.ModelEntry) - warnings == NOT_WARNINGS
    # a section said whole not to hold warnings holds none
    assert not [w for w in warnings if any(w.startswith(f"{s}.") for s in NOT_WARNINGS)]


def _sentence(path: tuple[str, ...]) -> str:
    """The stage's own sentence where one function makes it; otherwise one with rich markup and
    HTML to escape."""
    from reproci.stages.determinism import epochs, replicas

    if path == ("shared_batches",):
        return replicas.shared_batches(run_record(batch_fingerprints=[7, 8]), {1: {"A": run_record(batch_fingerprints=[7, 8])}})
    if path == ("epoch_order",):
        return epochs.repeated(1, "first 2 batches compared")
    return f"{'.'.join(path)} says [bold]this[/] & <that>: run `reproci run --steps 16`"


def _warned(path: tuple[str, ...], text: str, verdict: str = "PASS", message: str = "A = B = C") -> dict:
    """A results document of one model whose result carries the warning at ``path``."""
    entry: dict = {"model": "ddp.unsharded", "verdict": verdict, "message": message, "final_sha256": "ab" * 32,
                   "seconds": 1.0, "runs": {r: {"final_sha256": "ab" * 32} for r in "ABC"}}
    node = entry
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = text
    return {"run_id": "r1", "image": {"name": "local", "backend": "local"}, "options": {"stages": ["determinism"]},
            "golden": {"updated": True}, "summary": {"exit_code": 0}, "models": [entry]}


def _terminal(doc: dict) -> tuple[str, str]:
    """stdout and stderr of ``reproci run``'s report, with consoles as ``reproci.console`` makes them."""
    import io

    from rich.console import Console

    from reproci.reports import terminal

    out, err = (Console(file=io.StringIO(), width=400, soft_wrap=True, highlight=False) for _ in range(2))
    terminal.print_report(doc, out, err)
    return out.file.getvalue(), err.file.getvalue()


def _html_warnings(text: str) -> list[str]:
    tree = html5lib.HTMLParser(strict=True, namespaceHTMLElements=False).parse(text)
    return ["".join(li.itertext()) for li in tree.findall(".//section[@id='warnings']/ul/li")]


def _channels(doc: dict) -> dict[str, str]:
    from reproci.reports import github, prbody

    stages = plugins.stages()
    return {"terminal": _terminal(doc)[1], "markdown": report_build.markdown_report(doc, stages),
            "summary": github.summary_markdown(doc, stages), "pr body": prbody.render(doc, stages),
            "html": "\n".join(_html_warnings(report_build.html_report(doc, stages))),
            "annotations": "\n".join(github.run_annotations(doc, stages))}


@pytest.mark.parametrize("path", __import__("reproci.results").results.WARNING_FIELDS, ids=".".join)
def test_every_warning_is_shown_wherever_the_verdict_is(path):
    """Each warning field of the results type, set alone: the terminal (stderr), the Markdown
    report, the HTML report, the step summary, the PR body and an annotation all say it."""
    from reproci.reports import github, jsonexport

    text = _sentence(path)
    doc = _warned(path, text)
    shown = _channels(doc)
    label = "notice" if path[-1] == "notice" else "warning"  # a notice is said as one: it never fails
    assert f"{label}: ddp.unsharded: {text}" in shown["terminal"]
    for channel in ("markdown", "summary", "pr body"):
        assert f"- ⚠️ **ddp.unsharded**: {text}" in shown[channel].split("### Warnings", 1)[-1], channel
    assert shown["html"] == f"ddp.unsharded: {text}".replace("`", "")  # a `code span` is <code> there
    assert github.annotation("warning", f"reproci ddp.unsharded on local: warning ({'.'.join(path)})", text) in (
        shown["annotations"])
    assert json.loads(jsonexport.render(doc, plugins.stages()))["models"][0]["warnings"] == [{"kind": ".".join(path), "text": text}]


def test_a_result_without_warnings_shows_no_warnings_section():
    doc = _warned(("shared_batches",), "")
    for channel, text in _channels(doc).items():
        assert "warning" not in text.lower() and "Warnings" not in text, channel


def test_a_warning_the_message_already_says_is_said_once_on_the_terminal():
    """A failing verdict's message carries its warnings (the determinism stage appends them):
    the terminal says it there, on stdout; a drift's message is the golden's, without them."""
    text = _sentence(("shared_batches",))
    failed = _warned(("shared_batches",), text, "NONDETERMINISTIC", f"A ≠ B from step 3; warning: {text}")
    out, err = _terminal(failed)
    assert out.count(text) == 1 and text not in err
    out, err = _terminal(_warned(("shared_batches",), text, "UPGRADE_CHANGED", "the golden differs from step 1"))
    assert text not in out and f"warning: ddp.unsharded: {text}" in err


def test_the_webhook_adds_the_warnings_its_message_lacks():
    from reproci.reports import webhook

    text = _sentence(("shared_batches",))
    msg = webhook.slack_message(_warned(("shared_batches",), text, "ENV_CHANGED", "the golden differs"), plugins.stages())
    assert f"• *ddp.unsharded*: ENV_CHANGED: the golden differs; warning: {text}" in msg["text"]
