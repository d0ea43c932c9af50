"""Every command reproci prints as advice works when run as printed (real CLI, real runs)."""

from __future__ import annotations

import re
import shlex

import pytest

from reproci import errors, plugins, verdicts

SHORT = ("-m", "embedding", "--steps", "6", "--resume-at", "3")


def advice(text: str, verb: str) -> list[str]:
    """The `reproci VERB ...` command quoted in a message, as argv without `reproci`."""
    found = re.search(rf"`(reproci {verb}[^`]*)`", text)
    assert found, text
    return shlex.split(found.group(1))[1:]


@pytest.mark.slow
def test_a_corrupt_golden_says_how_to_re_record_it_and_that_works(reproci):
    goldens = reproci.cwd / "goldens"
    goldens.mkdir()
    (goldens / "local.yaml").write_text("version: 1\nmodels: [not, a, mapping\n")
    p = reproci("run", *SHORT)
    assert p.returncode == errors.EXIT_GOLDEN, p.stderr
    q = reproci(*advice(p.stderr, "golden update"), *SHORT)
    assert q.returncode == 0, q.stdout + q.stderr
    r = reproci("run", *SHORT)
    assert r.returncode == 0 and reproci.latest()["models"][0]["verdict"] == "PASS"


@pytest.mark.slow
def test_report_without_results_says_to_run_first_and_that_works(reproci):
    p = reproci("report")
    assert p.returncode == errors.EXIT_USAGE and len(p.stderr.strip().splitlines()) == 1, p.stderr
    q = reproci(*advice(p.stderr, "run"), *SHORT)
    assert q.returncode == 0, q.stderr
    r = reproci("report")
    assert r.returncode == 0 and "## reproci · local (local)" in r.stdout


def test_a_missing_golden_lists_the_known_ones(cli, tmp_path):
    goldens = tmp_path / "goldens"
    goldens.mkdir()
    (goldens / "cpu-a.yaml").write_text("version: 1\nmodels: {}\n")
    code, _, err = cli("golden", "show", "nosuch", "--goldens-dir", str(goldens))
    assert code == errors.EXIT_USAGE and "known: cpu-a" in err


def test_a_plugin_file_under_the_working_directory_is_named_by_its_path_from_there(tmp_path):
    """The command is run where it was printed: `-m model.py:build`, not a path of the machine."""
    from pathlib import Path

    from reproci.golden.advice import update_command
    from reproci.settings.models import resolve
    from reproci.settings.options import RunOptions

    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "net.py").write_text("def build(ctx):\n    pass\n")
    model = resolve(f"{tmp_path / 'models' / 'net.py'}:build")
    inside = RunOptions(models=(model,), project_root=tmp_path)
    assert update_command(inside) == "reproci golden update --image local -m models/net.py:build"
    elsewhere = RunOptions(models=(model,), project_root=Path("/nonexistent"))
    assert update_command(elsewhere) == f"reproci golden update --image local -m {tmp_path / 'models' / 'net.py'}:build"


def _compared(tmp_path, *, ci: bool, **entry_changes):
    """One model's golden section after `check.apply`: a golden recorded with 5 steps, seed 0,
    compared with a run whose entry differs from the golden's by ``entry_changes``."""
    import json

    from reproci.golden import check, store
    from reproci.settings.models import resolve
    from reproci.settings.options import RunOptions

    from .test_golden import fake_run

    document, records, states = fake_run(1)
    store.write(tmp_path / "goldens", "local", document, records, states, plugins.stages())
    run_dir = tmp_path / "results" / "run-2"
    (run_dir / "m").mkdir(parents=True)
    (run_dir / "m" / "record-A.json").write_text(json.dumps(records["m"]))
    document["models"] = [{**document["models"][0], **entry_changes, "verdict": "PASS", "message": "A = B = C",
                           "records": {"A": "m/record-A.json"}}]
    document["options"] = {**document["options"], "ci": ci}
    steps = entry_changes.get("steps", 5)
    options = RunOptions(models=(resolve("embedding"),), steps=steps, resume_at=steps // 2, resume_at_auto=False,
                         goldens_dir=tmp_path / "goldens", ci=ci)
    check.apply(options, document, run_dir, store.load(tmp_path / "goldens", "local"), plugins.stages())
    return document


def test_a_run_with_other_steps_is_told_to_run_as_the_golden_was_recorded_not_to_replace_it(tmp_path):
    """An ad-hoc `--steps 8` beside a golden of 5 steps: the advice runs with the golden's steps
    (so the next default run does not advise the opposite re-record); replacing is the second
    choice. A changed model is still told to re-record."""
    entry = _compared(tmp_path, ci=False, steps=8)["models"][0]
    assert entry["verdict"] == verdicts.MODEL_CHANGED
    assert advice(entry["message"], "run")[:7] == ["run", "--image", "local", "-m", "embedding", "--steps", "5"]
    assert "steps 5 in the golden, 8 here" in entry["message"]
    assert "to make these settings the golden's instead, re-record with `reproci golden update" in entry["message"]
    changed = _compared(tmp_path / "changed", ci=False, config_sha256="e" * 64)["models"][0]
    assert changed["verdict"] == verdicts.MODEL_CHANGED and "`reproci run" not in changed["message"]
    assert advice(changed["message"], "golden update")[:2] == ["golden", "update"]


def test_ci_fails_on_a_golden_it_cannot_compare_and_names_the_fix(tmp_path):
    """With CI=true, MODEL_CHANGED compared nothing: exit 3 (drift, as NEW is), and it says so."""
    for ci, code in ((False, errors.EXIT_PASS), (True, errors.EXIT_DRIFT)):
        document = _compared(tmp_path / str(ci), ci=ci, seed=1)
        assert verdicts.document_exit_code(document, plugins.stages()) == code
        assert document["models"][0]["message"].endswith(" (CI mode: this fails)") is ci
        assert "--seed" not in advice(document["models"][0]["message"], "run")  # the golden's seed, 0
