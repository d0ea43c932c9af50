"""Each option of ``reproci run`` is declared once (``reproci.settings.declared``): the
declaration alone gives its flag, its reproci.yaml key and check, its value and its place
in the results' recorded options. No training run here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import click
import pytest
from click.testing import CliRunner

from reproci import cli as cli_module
from reproci import errors, orchestrate, plugins
from reproci.commands.run import run_command
from reproci.settings import config_file, declared
from reproci.settings.declared import INTEGER, setting
from reproci.stages.base import Stage

# what results.json recorded before the options were declared in one table: its keys, in this order
RECORDED = ["stages", "profile", "steps", "resume_at", "seed", "threads", "world_size", "device", "cpu_isa", "fault",
            "ci", "slowdown_fails", "probes_fail", "fork_server", "compile", "compile_mode", "amp"]


@dataclass(frozen=True, kw_only=True)
class WarmOptions:
    warm_steps: int = setting(2, type=int, yaml=INTEGER, convert=int, record=True,
                              refuse=lambda v: None if v >= 1 else f"must be at least 1 (got {v})",
                              help="Warm stage: steps each process takes before its timed ones (default 2).")


class Warm(Stage):
    name = "warm"
    options = WarmOptions


@pytest.fixture
def warm(monkeypatch):
    """A stage with an option of its own, composed while the test runs and nowhere else."""
    composed = plugins.compose(extra=(Warm(),))
    monkeypatch.setattr(plugins, "stages", lambda: composed)
    return composed


def test_a_declared_option_is_a_flag_a_yaml_key_a_value_and_a_recorded_option(warm, tmp_path, monkeypatch):
    @run_command("run")
    def command(**kw: Any) -> None:
        print(plugins.build_options(kw, env={}).of(WarmOptions).warm_steps)

    shown = CliRunner().invoke(command, ["--help"], terminal_width=200, obj=warm).output
    assert "--warm-steps INTEGER" in shown and "steps each process takes" in shown
    assert CliRunner().invoke(command, ["--warm-steps", "7"], obj=warm).output == "7\n"

    monkeypatch.chdir(tmp_path)
    (tmp_path / "reproci.yaml").write_text("warm_steps: 5\n")
    built = plugins.build_options({}, env={})
    assert built.of(WarmOptions).warm_steps == 5
    assert list(built.recorded())[-1] == "warm_steps" and built.recorded()["warm_steps"] == 5
    document = orchestrate._document(built, "run", {}, None, [], None, 0.0)
    assert document["options"]["warm_steps"] == 5
    assert plugins.build_options({"warm_steps": 3}, env={}).of(WarmOptions).warm_steps == 3  # the command line over the file

    (tmp_path / "reproci.yaml").write_text("warm_steps: many\n")
    with pytest.raises(errors.ConfigError, match=r"^reproci.yaml: warm_steps: expected an integer, got 'many'; fix"):
        plugins.build_options({}, env={})
    (tmp_path / "reproci.yaml").write_text("warm_steps: 0\n")
    with pytest.raises(errors.UsageError, match=r"^reproci.yaml: warm_steps must be at least 1 \(got 0\)$"):
        plugins.build_options({}, env={})
    (tmp_path / "reproci.yaml").write_text("")
    assert plugins.build_options({}, env={}).of(WarmOptions).warm_steps == 2  # its default


def test_an_option_of_a_stage_left_out_of_the_composition_is_no_option(tmp_path, monkeypatch):
    """Without its stage, an option is neither a key of reproci.yaml nor a flag; a stage's code that
    reads it from options made without the stage gets its default."""
    monkeypatch.chdir(tmp_path)
    assert plugins.build_options({}, env={}).of(WarmOptions).warm_steps == 2
    (tmp_path / "reproci.yaml").write_text("warm_steps: 5\n")
    with pytest.raises(errors.ConfigError, match="warm_steps"):
        plugins.build_options({}, env={})
    code = cli_module.main(["run", "--warm-steps", "5"])
    assert code == errors.EXIT_USAGE


def test_the_results_record_the_options_they_always_recorded_in_their_order():
    o = plugins.build_options({"compile_": True, "slowdown_fails": True}, env={})
    assert list(o.recorded()) == RECORDED
    assert o.recorded()["compile"] == ["conv", "transformer", "embedding"] and o.recorded()["stages"] == ["determinism"]
    assert o.recorded()["slowdown_fails"] is True and o.recorded()["probes_fail"] is False
    assert o.recorded()["fork_server"] is True  # as the local backend takes it when not given


def test_every_option_of_the_command_line_is_one_declaration():
    run = cli_module.cli.commands["run"]
    table = plugins.catalog().options()
    ctx = click.Context(run, obj=plugins.stages())
    assert [p.name for p in run.get_params(ctx) if p is not run.get_help_option(ctx)] == [o.key for o in table]
    assert set(plugins.catalog().config_keys()) == {k for o in table if o.yaml for k in (o.name, *o.aliases)}
    for stage in plugins.stages():  # each stage's options, from its options dataclass, in its group
        assert [o for o in table if o.group == stage.name] == list(declared.declared_by(stage.name, stage.options))


def test_golden_update_takes_the_options_of_the_stages_that_record_a_golden():
    """The stages that explain a failure (``in_golden_update`` False: bisect, blame) keep their
    options to their own commands."""
    update = cli_module.cli.commands["golden"].commands["update"]
    names = {p.name for p in update.get_params(click.Context(update, obj=plugins.stages()))}
    left_out = [s for s in plugins.stages() if not s.in_golden_update]
    assert {s.name for s in left_out} == {"bisect", "blame"}
    assert not names & {o.name for s in left_out for o in declared.declared_by(s.name, s.options)}
    assert {"seeds", "repetitions", "probes_fail", "image"} <= names


def test_bisect_reads_reproci_yaml_once(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "reproci.yaml").write_text("models: [conv]\nsteps: 1\n")
    reads = []
    real = config_file.load_config
    monkeypatch.setattr(config_file, "load_config", lambda path, catalog: reads.append(path) or real(path, catalog))
    result = CliRunner().invoke(cli_module.cli, ["bisect"])
    assert isinstance(result.exception, errors.UsageError) and "steps must be at least 2" in str(result.exception)
    assert reads == [None]


@pytest.mark.parametrize("first", ["reproci.plugins", "reproci.commands.run", "reproci.stages.bisect.stage"])
def test_the_python_api_builds_options_with_every_stage_whatever_is_imported_first(tmp_path, first) -> None:
    """A script that builds the run's options, as the Python API's users and the backends' own
    tests do, gets every stage's options from ``plugins.build_options``, whichever module of the
    composition (the stages, their commands, the commands' helpers) it imported first."""
    import subprocess
    import sys

    script = (f"import {first}\nfrom reproci import plugins\n"
              "from reproci.stages.throughput.options import ThroughputOptions\n"
              "built = plugins.build_options({'repetitions': 3}, env={})\n"
              "print(built.of(ThroughputOptions).repetitions, *built.stages)")
    out = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["3", "determinism"]
