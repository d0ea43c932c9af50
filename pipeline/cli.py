"""The command line: the ``reproci`` group and ``main``, the only place that turns errors
into exit codes. Each verb's click code is in ``pipeline/commands/<verb>.py``."""

from __future__ import annotations

import sys

import click
from rich.markup import escape

from . import __version__, console, errors
from .commands import audit, bisect, blame, compare, golden, images, init, matrix, merge, models, pr_body, report, run
from .errors import ReprociError

err_console = console.stderr()


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="reproci")
def cli() -> None:
    """reproci: prove PyTorch training is bitwise reproducible inside a container image,
    and alert when an upgrade changes results.

    Exit codes: 0 pass, 1 reproducibility failure, 2 usage/config error, 3 golden drift,
    4 run error, 5 engine/infrastructure error, 6 golden file error, 7 compare: too few seeds,
    130 interrupted (Ctrl-C), 143 terminated (SIGTERM).
    """


for command in (run.run_cmd, bisect.bisect_cmd, blame.blame_cmd, audit.audit_cmd, golden.golden_group, images.images_group, matrix.matrix_cmd, merge.merge_cmd,
                pr_body.pr_body_cmd, report.report_cmd, models.models_cmd, compare.compare_cmd, init.init_cmd):
    cli.add_command(command)


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the CLI, map every error to one line and an exit code."""
    import signal

    terminated = []

    def _terminate(signum: int, frame: object) -> None:
        terminated.append(signum)
        raise KeyboardInterrupt  # a cancelled CI job cleans up like Ctrl-C: workers, containers, files

    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _terminate)
    try:
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
        command = e.ctx.command_path if e.ctx is not None else "reproci"
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
