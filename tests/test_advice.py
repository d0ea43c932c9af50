"""Every command reproci prints as advice works when run as printed (real CLI, real runs)."""

from __future__ import annotations

import re
import shlex

import pytest

from reproci import errors

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
    from reproci.models import resolve
    from reproci.options import RunOptions

    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "net.py").write_text("def build(ctx):\n    pass\n")
    model = resolve(f"{tmp_path / 'models' / 'net.py'}:build")
    inside = RunOptions(models=(model,), project_root=tmp_path)
    assert update_command(inside) == "reproci golden update --image local -m models/net.py:build"
    elsewhere = RunOptions(models=(model,), project_root=Path("/nonexistent"))
    assert update_command(elsewhere) == f"reproci golden update --image local -m {tmp_path / 'models' / 'net.py'}:build"
