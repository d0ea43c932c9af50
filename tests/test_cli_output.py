"""What a CI log shows: output through a pipe at 80 columns and under GITHUB_ACTIONS=true is
never cut, progress comes as one line per run start and end on stderr, and the verbs that
print goldens print nothing undefined."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from rich.console import Console

from reproci import console as console_mod
from reproci import errors, plugins, verdicts
from reproci.golden.environment import affects_results, split_packages
from reproci.reports import goldens
from reproci.reports.terminal import print_run
from reproci.stages.throughput import report as throughput_report

from .helpers import model_entry, undeclared

LONG_OP = "aten::_scaled_dot_product_flash_attention_for_cpu_backward"


def throughput_document() -> dict:
    top = [{"op": LONG_OP, "growth": 0.4, "delta_ms": 0.12, "share": 0.35},
           {"op": "aten::embedding_dense_backward", "growth": None, "delta_ms": 0.05, "share": 0.2}]
    return {"models": [{"model": "transformer", "verdict": verdicts.PASS, "throughput": {
        "modes": {"strict": {"steps_per_s": 41.5, "peak_memory_bytes": 3 << 20},
                  "default": {"steps_per_s": 51.2, "peak_memory_bytes": 3 << 20}},
        "slowdown": {"median": 1.234, "ci_low": 1.2, "ci_high": 1.26, "noisy": False}, "top_ops": top}}]}


def log_console(monkeypatch: pytest.MonkeyPatch, *, github: bool = False) -> tuple[Console, io.StringIO]:
    """The CLI's stdout console as it is built when stdout is a pipe, with COLUMNS=80."""
    stream = io.StringIO()
    monkeypatch.setattr("sys.stdout", stream)
    monkeypatch.setenv("COLUMNS", "80")
    if github:
        monkeypatch.setenv("GITHUB_ACTIONS", "true")
    else:
        monkeypatch.delenv("GITHUB_ACTIONS", raising=False)
    return console_mod.stdout(), stream


@pytest.mark.parametrize("github", [False, True])
def test_the_throughput_table_never_cuts_an_op_name_in_a_log(monkeypatch, github):
    out, stream = log_console(monkeypatch, github=github)
    throughput_report.terminal(throughput_document(), out)
    text = stream.getvalue()
    assert LONG_OP in text and "aten::embedding_dense_backward" in text
    assert "…" not in text
    assert max(len(line) for line in text.splitlines()) > 80  # full width, not squeezed


def test_a_terminal_keeps_its_own_width(monkeypatch):
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr("sys.stdout", Tty())
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.delenv("GITHUB_ACTIONS", raising=False)
    assert console_mod.stdout().width == 80
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    assert console_mod.stdout().width == console_mod.LOG_WIDTH


def test_golden_environment_line_says_only_what_was_recorded():
    cpu = {"torch": "2.13.0+cpu", "cuda": None, "cudnn": None, "nccl": None, "gpu": {"names": [], "driver": None},
           "threads": {"intra_op": 1}, "python": "3.11.2"}
    assert goldens.environment_line(cpu) == "torch 2.13.0+cpu · no GPU · threads 1 · Python 3.11.2"
    gpu = {**cpu, "cuda": "13.0", "cudnn": 91900, "gpu": {"names": ["NVIDIA H200"], "driver": "580.159.04"}}
    assert goldens.environment_line(gpu) == ("torch 2.13.0+cpu · CUDA 13.0 · cuDNN 91900 · GPU NVIDIA H200 "
                                             "(driver 580.159.04) · threads 1 · Python 3.11.2")


def test_golden_diff_leads_with_the_packages_that_can_change_results():
    diff = {"torch": ["2.7.0", "2.7.1"], "nvidia-cudnn-cu12": ["9.5", "9.7"], "pytest": ["8.0", None],
            "zizmor": [None, "1.0"], "reproci": ["0.1.0", "0.2.0"]}
    relevant, other = split_packages(diff)
    assert list(relevant) == ["torch", "nvidia-cudnn-cu12"] and set(other) == {"pytest", "zizmor", "reproci"}
    assert affects_results("triton") and affects_results("numpy") and not affects_results("rich")
    out = Console(record=True, width=80, file=io.StringIO(), soft_wrap=True)
    goldens.print_diff("a", "b", {"env_diff": {}, "package_diff": diff, "models": {}}, out)
    text = out.export_text()
    assert "package torch: 2.7.0 → 2.7.1" in text and "package pytest" not in text
    assert "3 other package(s) changed (none of them computes results): pytest, zizmor, reproci" in text


@pytest.mark.slow
def test_a_piped_run_shows_progress_lines_and_uncut_evidence(reproci):
    """Through a pipe, at 80 columns, under GitHub Actions (the width rule itself is tested
    above for a pipe without it)."""
    env = {"COLUMNS": "80", "GITHUB_ACTIONS": "true"}
    p = reproci("run", "-m", "conv", "--steps", "6", "--resume-at", "3", "--fault", "buffer-drift", env=env)
    assert p.returncode == 1, p.stderr
    entry = model_entry(reproci.latest(), "conv")
    where = verdicts.first_difference(verdicts.verdict_evidence(entry))
    assert entry["evidence"]["tensor"] and entry["evidence"]["tensor"] in where
    assert where in p.stdout  # the whole evidence on one line of the table, at 80 columns
    assert "…" not in p.stdout
    assert f"conv: NONDETERMINISTIC: {entry['message']}" in p.stdout  # results, ERROR and failures too, on stdout
    for role in ("A", "B", "C"):
        assert re.search(rf"^\[\s*\d+\.\d s\] conv: run {role} started \(6 steps", p.stderr, re.M), p.stderr
    assert re.search(r"^\[\s*\d+\.\d s\] conv: run A done: 6 steps, [\d.]+ steps/s, [\d.]+ s$", p.stderr, re.M)
    assert re.search(r"conv: run C done: 3 steps", p.stderr)  # C resumed at 3
    assert "::error title=reproci conv on local%3A NONDETERMINISTIC::" in p.stdout


@pytest.mark.slow
def test_golden_update_help_lists_the_run_options(reproci):
    p = reproci("golden", "update", "--help")
    assert p.returncode == 0
    for option in ("--image", "--model", "--steps", "--resume-at", "--goldens-dir", "--threads"):
        assert option in p.stdout


def test_json_of_a_results_file_is_the_typed_document(files):
    """Every key a real run writes, at any depth, is declared (results.ResultsDocument, its
    ModelEntry and their sections): the type checker reads the document by those declarations."""
    from reproci import results

    for name in ("recorded", "compared"):
        doc = results.load(files[name])
        assert undeclared(doc) == [], name
        assert json.loads(json.dumps(doc)) == doc


def test_a_throughput_regression_is_one_warning_line_whichever_stages_ran():
    """With the determinism stage, its report says every warning, the regression among them;
    the throughput table does not repeat it. Throughput alone: ``print_run`` says them once."""
    doc = throughput_document()
    doc["models"][0]["throughput_regression"] = "strict 1.40× slower than the golden's 1.10× [slowdown-factor]"

    def shown(stages: tuple[str, ...]) -> str:
        out, err = (Console(file=io.StringIO(), width=400, soft_wrap=True) for _ in range(2))
        print_run({**doc, "options": {"stages": list(stages)}}, plugins.stages(), out, err, Path("results.json"))
        return err.file.getvalue()

    line = "warning: transformer: strict 1.40× slower than the golden's 1.10× [slowdown-factor]"
    assert shown(("determinism", "throughput")).count(line) == 1
    assert shown(("throughput",)).count(line) == 1


def test_help_says_what_each_command_takes(cli):
    """-s lists every composed stage; bisect's -m and blame's --image say they are
    required (no "default: all", no "omit for the local backend"); golden update has no
    --bisect or --blame, which explain a failure rather than record a golden, and refuses them."""
    def help_of(*command: str) -> str:
        code, out, _ = cli(*command, "--help")
        assert code == 0
        return " ".join(out.split())

    for command in (("run",), ("bisect",), ("blame",), ("golden", "update")):
        text = help_of(*command)
        assert all(s.name in text.split("-s, --stage TEXT")[1].split("Repeatable")[0] for s in plugins.stages()), command
    bisect_m = help_of("bisect").split("-m, --model TEXT")[1].split("-s, --stage")[0]
    assert "required" in bisect_m and "Default: all" not in bisect_m
    blame_image = help_of("blame").split("--image TEXT")[1].split("--backend")[0]
    assert "required" in blame_image and "Omit for the local backend" not in blame_image
    update = help_of("golden", "update")
    assert "--bisect" not in update and "--blame" not in update
    assert "--bisect" in help_of("run") and "--blame" in help_of("run")
    for flag in ("--bisect", "--blame"):
        code, _, err = cli("golden", "update", flag)
        assert code == errors.EXIT_USAGE and f"No such option '{flag}'" in err, err


def test_help_says_where_config_results_and_goldens_are_found(cli):
    """reproci.yaml is searched for upward and results/goldens live beside it: --config,
    --results-dir and --goldens-dir say so (not ./...); blame, which runs images only, offers
    no local backend."""
    for command in (("run",), ("bisect",), ("blame",), ("golden", "update")):
        code, out, _ = cli(*command, "--help")
        text = " ".join(out.split())
        assert code == 0 and "./" not in text, command
        assert "reproci.yaml in this directory or the nearest folder above it" in text.split("--config PATH")[1]
        for flag, folder in (("--results-dir PATH", "results"), ("--goldens-dir PATH", "goldens")):
            assert f"(default: {folder} in this directory, or beside a reproci.yaml found above it)" in \
                text.split(flag)[1].split("--")[0], (command, flag)
    _, out, _ = cli("blame", "--help")
    backend = " ".join(out.split()).split("--backend [local|docker|ray|slurm]")[1].split("--address")[0]
    assert "local (no --image)" not in backend and "docker (the default" in backend


@pytest.mark.parametrize("argv, command", [
    (("run", "-s"), "reproci run"), (("blame", "-m"), "reproci blame"),
    (("golden", "show", "--goldens-dir"), "reproci golden show"), (("nosuch",), "reproci"),
])
def test_a_flag_without_its_value_points_to_its_commands_help(cli, argv, command):
    """``reproci run -s`` points to ``reproci run --help``, which lists the stages, not to
    ``reproci --help``, which does not."""
    code, _, err = cli(*argv)
    assert code == errors.EXIT_USAGE and err.endswith(f"see `{command} --help`"), err
    if argv == ("run", "-s"):
        _, out, _ = cli("run", "--help")
        assert "determinism (default), throughput" in " ".join(out.split())


def test_a_users_text_is_printed_as_typed_never_as_an_emoji(cli):
    """rich turns ``:x:`` into an emoji by default; an error quoting a user's ``--gres gpu:x:y:z``
    (or a path, a model's message) must show what was typed."""
    code, _, err = cli("run", "--backend", "slurm", "--gres", "gpu:x:y:z", "-m", "conv")
    assert code == errors.UsageError.return_code
    assert "gpu:x:y:z" in err and "❌" not in err
