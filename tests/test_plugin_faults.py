"""A plugin or a toolchain that fails, as a user meets it through the real CLI: a syntax error
is refused before any run (``reproci/settings/models.py``), a factory that raises says where in the
plugin and where the traceback is (``reproci/worker/process/failure.py``, ``runner``), and a
C++ compiler that does not work is one line naming it (``reproci/worker/execution.py``)."""

from __future__ import annotations

import json
from pathlib import Path

from reproci import errors
from reproci.settings.models import resolve
from reproci.worker.__main__ import _classify, _message
from reproci.worker.process.exitcodes import EXIT_CRASH, EXIT_NO_DEVICE
from reproci.worker.process.failure import compiler_failure
from tests.helpers import PLUGINS, said

TINY = f"{PLUGINS / 'culprits.py'}:tiny"
RAISES = '''import torch


def _width(n):
    raise ValueError(f"width {n} is not supported")


def build(ctx):
    return _width(3)
'''


def test_a_plugin_with_a_syntax_error_is_refused_before_any_run(reproci) -> None:
    (reproci.cwd / "broken.py").write_text("import torch\n\ndef build(ctx)\n    return None\n")
    package = reproci.cwd / "lib" / "mine"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "models.py").write_text("def build(ctx):\n    return (1,\n")
    for model, where, env in [("broken.py:build", "broken.py:3: SyntaxError: expected ':'", None),
                              ("mine.models:build", f"{package / 'models.py'}:2: SyntaxError: '(' was never closed",
                               {"PYTHONPATH": f"{reproci.cwd / 'lib'}"})]:
        r = reproci("run", "-m", model, "--steps", "2", env=env)
        assert r.returncode == errors.EXIT_USAGE, r.stdout + r.stderr
        assert said(r.stderr) == [f"error: {where} (the plugin of --model {model}, compiled with Python "
                                  f"{'.'.join(map(str, __import__('sys').version_info[:2]))}); fix the file, then run "
                                  "again"], r.stderr
        assert "started" not in r.stderr and not (reproci.cwd / "results").exists()  # no run was launched


def test_a_plugin_whose_libraries_are_missing_here_is_not_refused_by_the_syntax_check(tmp_path: Path) -> None:
    """Its source is compiled, not imported: the libraries may exist only where the runs execute."""
    (tmp_path / "elsewhere.py").write_text("import no_such_library_here\n\ndef build(ctx):\n    return None\n")
    assert resolve(f"{tmp_path / 'elsewhere.py'}:build").plugin


def test_a_factory_that_raises_names_its_own_frames_and_where_the_traceback_is(reproci) -> None:
    (reproci.cwd / "raises.py").write_text(RAISES)
    r = reproci("run", "-m", "raises.py:build", "--steps", "2")
    assert r.returncode == errors.EXIT_RUN_ERROR, r.stdout + r.stderr
    entry = reproci.latest()["models"][0]
    run_dir = f"results/{reproci.latest()['run_id']}"
    expected = (f"run A: ValueError: width 3 is not supported (at raises.py:5 in _width, from raises.py:9 in build); "
                f"traceback in {run_dir}/raises/record-A.json")
    assert entry["verdict"] == "ERROR" and entry["message"] == expected
    assert f"raises: ERROR: {expected}" in " ".join(r.stdout.split())
    record = json.loads((reproci.cwd / run_dir / "raises" / "record-A.json").read_text())
    assert 'raise ValueError(f"width {n} is not supported")' in record["traceback"]


def test_a_compiled_run_with_a_broken_cxx_compiler_is_one_line_naming_it(reproci) -> None:
    r = reproci("run", "-m", TINY, "--compile", "--steps", "2", env={"CXX": "/bin/false"})
    assert r.returncode == errors.EXIT_INFRA, r.stdout + r.stderr
    assert said(r.stderr) == [
        "error: torch.compile on the CPU builds inductor's C++ kernels with CXX=/bin/false, and that compiler does "
        "not work (`/bin/false --version` exited with 1): set CXX to a working C++ compiler (CXX=g++) where the runs "
        "execute, or drop --compile"], r.stderr
    assert not list((reproci.cwd / "results").glob("2*"))  # nothing half-written


def test_inductor_failing_with_its_compiler_is_said_in_one_line_naming_it(monkeypatch) -> None:
    """The compiler failures inductor raises past the check before tracing (real torch classes)."""
    from torch._inductor.exc import CppCompileError, InductorError, InvalidCxxCompiler

    monkeypatch.setenv("CXX", "/opt/cc/bin/g++")
    none_works = InductorError(InvalidCxxCompiler(), None)
    assert _classify(none_works) == ("no-device", EXIT_NO_DEVICE)
    assert _message(none_works, "no-device") == (
        "torch.compile found no working C++ compiler to build inductor's kernels with (CXX=/opt/cc/bin/g++): set "
        "CXX to a working C++ compiler (CXX=g++) where the runs execute, or drop --compile")
    build = InductorError(CppCompileError(["/opt/cc/bin/g++", "-O3", "k.cpp"], "\ncc1plus: internal compiler error\n"), None)
    assert _classify(build) == ("crash", EXIT_CRASH)
    assert _message(build, "crash").startswith(
        "inductor could not build a C++ kernel with /opt/cc/bin/g++ (cc1plus: internal compiler error): set CXX")
    assert compiler_failure(ValueError("g++ is fine")) is None
