"""Each option of ``reproci run`` is declared once (``reproci.settings.declared``): the
declaration alone gives its flag, its reproci.yaml key and check, its value and its place
in the results' recorded options. No training run here."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from reproci import cli as cli_module
from reproci import errors, orchestrate
from reproci.commands.run import run_options
from reproci.settings import config_file, declared, options
from reproci.settings.declared import INTEGER, Option

# what results.json recorded before the options were declared in one table: its keys, in this order
RECORDED = ["stages", "profile", "steps", "resume_at", "seed", "threads", "world_size", "device", "cpu_isa", "fault",
            "ci", "slowdown_fails", "probes_fail", "fork_server", "compile", "compile_mode", "amp"]


@pytest.fixture
def knob(monkeypatch):
    """A stage's knob, declared while the test runs and nowhere else."""
    o = Option(name="warm_steps", group="throughput", type=int, yaml=INTEGER, default=2, convert=int,
               refuse=lambda v: None if v >= 1 else f"must be at least 1 (got {v})", record=True,
               help="Throughput stage: steps each process takes before its timed ones (default 2).")
    monkeypatch.setattr(declared, "OPTIONS", [*declared.OPTIONS, o])
    return o


def test_a_declared_option_is_a_flag_a_yaml_key_a_value_and_a_recorded_option(knob, tmp_path, monkeypatch):
    command = click.command("run")(run_options(lambda **kw: print(options.build(kw, env={}).knob("warm_steps"))))
    shown = CliRunner().invoke(command, ["--help"], terminal_width=200).output
    assert "--warm-steps INTEGER" in shown and "steps each process takes" in shown
    assert CliRunner().invoke(command, ["--warm-steps", "7"]).output == "7\n"

    monkeypatch.chdir(tmp_path)
    (tmp_path / "reproci.yaml").write_text("warm_steps: 5\n")
    built = options.build({}, env={})
    assert built.knob("warm_steps") == 5
    assert list(built.recorded())[-1] == "warm_steps" and built.recorded()["warm_steps"] == 5
    document = orchestrate._document(built, "run", {}, None, [], None, 0.0)
    assert document["options"]["warm_steps"] == 5
    assert options.build({"warm_steps": 3}, env={}).knob("warm_steps") == 3  # the command line over the file

    (tmp_path / "reproci.yaml").write_text("warm_steps: many\n")
    with pytest.raises(errors.ConfigError, match=r"^reproci.yaml: warm_steps: expected an integer, got 'many'; fix"):
        options.build({}, env={})
    (tmp_path / "reproci.yaml").write_text("warm_steps: 0\n")
    with pytest.raises(errors.UsageError, match=r"^reproci.yaml: warm_steps must be at least 1 \(got 0\)$"):
        options.build({}, env={})
    (tmp_path / "reproci.yaml").write_text("")
    assert options.build({}, env={}).knob("warm_steps") == 2  # its default


def test_the_results_record_the_options_they_always_recorded_in_their_order():
    o = options.build({"compile_": True, "slowdown_fails": True}, env={})
    assert list(o.recorded()) == RECORDED
    assert o.recorded()["compile"] == ["conv", "transformer", "embedding"] and o.recorded()["stages"] == ["determinism"]
    assert o.recorded()["slowdown_fails"] is True and o.recorded()["probes_fail"] is False
    assert o.recorded()["fork_server"] is True  # as the local backend takes it when not given


def test_every_option_of_the_command_line_is_one_declaration():
    run = cli_module.cli.commands["run"]
    assert [p.name for p in run.params] == [o.key for o in declared.options()]
    assert set(config_file.config_keys()) == {k for o in declared.options() if o.yaml for k in (o.name, *o.aliases)}


def test_bisect_reads_reproci_yaml_once(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "reproci.yaml").write_text("models: [conv]\nsteps: 1\n")
    reads = []
    real = config_file.load_config
    monkeypatch.setattr(config_file, "load_config", lambda path: reads.append(path) or real(path))
    result = CliRunner().invoke(cli_module.cli, ["bisect"])
    assert isinstance(result.exception, errors.UsageError) and "steps must be at least 2" in str(result.exception)
    assert reads == [None]


def test_the_python_api_builds_options_without_importing_the_stages_itself(tmp_path) -> None:
    """A script that builds the run's options, as the Python API's users and the backends' own
    tests do, gets every stage's knobs without importing the registry first."""
    import subprocess
    import sys

    script = ("import sys\nfrom reproci.settings import options\nbuilt = options.build({}, env={})\n"
              "print(built.knob('repetitions'), 'reproci.stages.registry' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[1] == "True"
