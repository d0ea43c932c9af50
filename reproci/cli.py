"""The command line: the ``reproci`` group and ``main``, the only place that turns errors
into exit codes. Each verb's click code is in ``reproci/commands/<verb>.py``, and each stage's
own (``reproci bisect``, ``reproci compare``) in its package (``stages.base.Stage.commands``): the
group takes them from the stages ``reproci.plugins`` composes, and hands those stages down to every
command as the click context's object.

Ctrl-C is honoured from the first moment: ``_interrupt`` (Python's own handler but for two
kinds of place where raising breaks the interpreter) is installed before the heavy imports,
and a Ctrl-C during those imports ends the process with one line and exit 130, not a
traceback."""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # built in, as _thread, sys and time: nothing to load before the handler is in place; typeshed has no stub for it
import _thread
import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from types import FrameType

REDELIVER_S = 0.05  # a signal that lands where raising is unsafe is raised again this much later ...
REDELIVER_AT_MOST = 40  # ... at most this many times in a row (2 s: the unsafe places are brief, a wait is not)
_redelivered = [0]
_MAIN = _thread.get_ident()  # the thread that imports the CLI: the main thread, where the handler is installed
_terminated: list[int] = []  # SIGTERM (a cancelled CI job) seen: the message and exit code say so


def _interrupt(signum: int, frame: FrameType | None) -> None:
    """SIGINT (and SIGTERM, once ``main`` runs): KeyboardInterrupt, as Python's own handler
    raises it, except in two places where raising it breaks the interpreter:

    - importlib's bootstrap code: there it can land between taking the interpreter's import
      lock and the ``try`` that releases it (or in a module lock's weakref callback, where it
      is swallowed): the lock is then held for good, the Ctrl-C lost, and every other thread
      that imports (the runs' threads, torch's import beside them) waits for ever, and this
      process with them;
    - code that ``exec`` runs from a string (``<string>``: dataclasses and namedtuple make
      their methods so): a KeyboardInterrupt raised there marks the interpreter as ended by an
      unhandled Ctrl-C even once it is caught, so it exits killed by SIGINT, not with 130.

    There it is delivered again a moment later, once that code is left."""
    where = frame.f_code.co_filename if frame is not None else ""
    if (where.startswith("<frozen importlib") or where == "<string>") and _redelivered[0] < REDELIVER_AT_MOST:
        _redelivered[0] += 1
        _thread.start_new_thread(_deliver_again, (signum,))
        return
    _redelivered[0] = 0
    if signum == _signal.SIGTERM:
        _terminated.append(signum)
    raise KeyboardInterrupt  # a cancelled CI job cleans up like Ctrl-C: workers, containers, files


def _deliver_again(signum: int) -> None:
    """The signal again, to the main thread itself: it also wakes a wait there, as the first did."""
    time.sleep(REDELIVER_S)
    try:
        _signal.pthread_kill(_MAIN, signum)
    except OSError:  # the main thread is gone: the process is ending
        pass


if _signal.getsignal(_signal.SIGINT) is _signal.default_int_handler:  # first thing: before the heavy imports
    try:
        _signal.signal(_signal.SIGINT, _interrupt)
    except ValueError:  # imported outside the main thread: its Ctrl-C is not this module's
        pass

try:
    import signal

    import click
    from rich.markup import escape

    from . import __version__, console, errors, plugins
    from .commands import golden, images, init, matrix, merge, models, pr_body, report, run
    from .errors import ReprociError, UsageError

    err_console = console.stderr()

    @click.group(context_settings={"help_option_names": ["-h", "--help"]})
    @click.version_option(__version__, prog_name="reproci")
    @click.pass_context
    def cli(ctx: click.Context) -> None:
        """reproci: prove PyTorch training is bitwise reproducible inside a container image,
        and alert when an upgrade changes results.

        Exit codes: 0 pass, 1 reproducibility failure, 2 usage/config error, 3 golden drift,
        4 run error, 5 engine/infrastructure error, 6 golden file error, 7 compare: too few seeds,
        130 interrupted (Ctrl-C), 143 terminated (SIGTERM).
        """
        ctx.obj = plugins.stages()  # handed down: the commands that run the stages take their options

    for command in (run.run_cmd, golden.golden_group, images.images_group, matrix.matrix_cmd, merge.merge_cmd,
                    pr_body.pr_body_cmd, report.report_cmd, models.models_cmd, init.init_cmd):
        cli.add_command(command)
    _unloaded: list[ReprociError] = []  # a stage that does not load: main says it, in one line
    try:  # then each composed stage's own commands (reproci bisect); click lists them all by name
        for stage in plugins.stages():
            for command in stage.commands:
                if command.name in cli.commands:
                    raise UsageError(f"the {stage.name} stage's command {command.name} is a command of reproci "
                                     "already: uninstall the package that adds the stage, or rename its command")
                cli.add_command(command)
    except ReprociError as e:
        _unloaded.append(e)
except KeyboardInterrupt:  # Ctrl-C while the CLI's own modules load: nothing was started yet
    from .errors import EXIT_INTERRUPTED, EXIT_TERMINATED

    sys.stderr.write("interrupted: reproci was still starting; nothing was started\n")
    raise SystemExit(EXIT_TERMINATED if _terminated else EXIT_INTERRUPTED) from None


def _named(argv: list[str]) -> str:
    """The command a command line names ('reproci run', 'reproci golden show'): the one whose
    --help a flag's error points to where click gives no context (a flag's missing value)."""
    command: click.Command = cli
    path = ["reproci"]
    for arg in argv:
        sub = command.commands.get(arg) if isinstance(command, click.Group) else None
        if sub is None:
            break
        command, path = sub, [*path, arg]
    return " ".join(path)


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the CLI, map every error to one line and an exit code."""
    terminated = _terminated
    try:  # from the first line: a Ctrl-C anywhere in here is the one-line interrupted message
        terminated.clear()
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _interrupt)
        if _unloaded:
            raise _unloaded[0]
        cli.main(args=argv, prog_name="reproci", standalone_mode=False)
        return 0
    except ReprociError as e:
        err_console.print(f"[bold red]error:[/] {escape(str(e))}")  # a message is text, not markup: [report] stays
        return e.return_code
    except click.exceptions.Abort:  # click's form of a KeyboardInterrupt inside a command
        how = "terminated (SIGTERM)" if terminated else "interrupted"
        err_console.print(f"[bold red]{how}[/]: unfinished runs were stopped; nothing was recorded")
        return errors.EXIT_TERMINATED if terminated else errors.EXIT_INTERRUPTED
    except KeyboardInterrupt:
        how = "terminated (SIGTERM)" if terminated else "interrupted"
        err_console.print(f"[bold red]{how}[/]: unfinished runs were stopped and their files removed")
        return errors.EXIT_TERMINATED if terminated else errors.EXIT_INTERRUPTED
    except click.UsageError as e:  # a flag or value click refuses: one line, as every error
        command = e.ctx.command_path if e.ctx is not None else _named(sys.argv[1:] if argv is None else argv)
        err_console.print(f"[bold red]error:[/] {escape(e.format_message().rstrip('.'))}; see `{command} --help`")
        return errors.EXIT_USAGE
    except click.ClickException as e:
        e.show()
        return errors.EXIT_USAGE
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except OSError as e:
        if e.errno == 28:
            err_console.print(f"[bold red]error:[/] disk full ({e.filename or ''}); free space and run again")
            return errors.EXIT_INFRA
        raise


if __name__ == "__main__":
    sys.exit(main())
