"""The command line. The only place that turns errors into exit codes."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.markup import escape

from . import __version__, errors
from .errors import ReprociError

err_console = Console(stderr=True, highlight=False, soft_wrap=True)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="reproci")
def cli() -> None:
    """reproci: prove PyTorch training is bitwise reproducible inside a container image,
    and alert when an upgrade changes results.

    Exit codes: 0 pass, 1 reproducibility failure, 2 usage/config error, 3 golden drift,
    4 run error, 5 engine/infrastructure error, 6 golden file error, 130 interrupted.
    """


@cli.command("run")
@click.option("--image", help="Container image to run in (manifest name or any reference). Omit for the local backend.")
@click.option("--image-name", help="Name under which goldens for this image are kept (default: from --image, or 'local').")
@click.option("--model", "-m", "models", multiple=True,
              help="Model to run: conv, transformer, embedding, FILE.py:factory or module:factory. Repeatable. Default: all reference models.")
@click.option("--stage", "-s", "stages", multiple=True, help="Stage: determinism (default) or throughput. Repeatable.")
@click.option("--profile", type=click.Choice(["quick", "full"]), default=None, help="quick: CPU-sized (default); full: GPU-sized.")
@click.option("--steps", type=int, help="Training steps N per run (default: 30 quick, 300 full).")
@click.option("--resume-at", type=int, help="Step k where run C resumes from run A's checkpoint (default N/2).")
@click.option("--seed", type=int, help="Run seed (default 0).")
@click.option("--threads", type=int, help="CPU intra-op threads, pinned and recorded (default 1).")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default=None, help="Device for training (default cpu).")
@click.option("--gpus", help="Docker backend: GPUs to request: all, a count, or ids like 0,1.")
@click.option("--timeout", type=float, help="Seconds allowed per worker run (default 600).")
@click.option("--jobs", "-j", type=int, help="Worker runs at once (default: usable CPUs / --threads, at most 3).")
@click.option("--results-dir", type=click.Path(path_type=Path), help="Where results go (default ./results).")
@click.option("--goldens-dir", type=click.Path(path_type=Path), help="Where golden files live (default ./goldens).")
@click.option("--update-golden", is_flag=True, default=None, help="Record goldens from this run if it passed its own checks.")
@click.option("--webhook", help="Slack-compatible webhook URL for alerts (or REPROCI_WEBHOOK).")
@click.option("--keep-checkpoints", is_flag=True, default=None, help="Keep run A's checkpoint files.")
@click.option("--config", type=click.Path(path_type=Path), help="Config file (default ./reproci.yaml if present).")
@click.option("--ci/--no-ci", default=None, help="CI mode: a missing golden fails (default: from $CI).")
@click.option("--repetitions", type=click.IntRange(min=1), help="Throughput stage: interleaved repetitions per mode (default 5).")
@click.option("--slowdown-factor", type=float, help="Throughput regression threshold against the golden (default 1.25).")
@click.option("--slowdown-fails", is_flag=True, default=None, help="A throughput regression fails the run (exit 3) instead of warning.")
@click.option("--fault", hidden=True, help="TEST ONLY: inject a fault to prove a verdict fires.")
def run_cmd(**kwargs: Any) -> None:
    """Run the reference matrix through the strict-determinism stage."""
    from . import options as options_mod
    from . import run as run_mod
    from .report import print_report

    opts = options_mod.build(kwargs)
    console = Console(highlight=False, soft_wrap=True)
    with console.status("starting") as status:
        document, path = run_mod.execute(opts, progress=lambda msg: status.update(msg))
    if "determinism" in opts.stages:
        print_report(document, console, str(path))
    if "throughput" in opts.stages:
        from .reports.terminal import print_throughput

        print_throughput(document, console, None if "determinism" in opts.stages else str(path))
    g = document.get("golden") or {}
    if g.get("updated"):
        console.print(f"golden recorded: {g['file']} (review and commit it)")
    elif g.get("refused"):
        err_console.print(f"[bold red]error:[/] {g['refused']}")
    code = document["summary"]["exit_code"]
    if code:
        raise SystemExit(code)


@cli.command("models")
def models_cmd() -> None:
    """List the reference models and how to add your own."""
    from reference_models import DESCRIPTIONS, REGISTRY

    for name, ref in REGISTRY.items():
        click.echo(f"{name:12} {DESCRIPTIONS.get(name, '')}  ({ref})")
    click.echo("\nYour own model: --model path/to/file.py:factory or --model package.module:factory")


from .matrix import matrix_cmd  # noqa: E402
from .merge import merge_cmd  # noqa: E402
from .prbody import pr_body_cmd  # noqa: E402
from .images import images_group  # noqa: E402

cli.add_command(matrix_cmd)
cli.add_command(merge_cmd)
cli.add_command(pr_body_cmd)
cli.add_command(images_group)

from .golden_cmd import golden_group  # noqa: E402

cli.add_command(golden_group)

from .report_cmd import report_cmd  # noqa: E402
cli.add_command(report_cmd)


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the CLI, map every error to one line and an exit code."""
    import signal

    def _terminate(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # a cancelled CI job cleans up like Ctrl-C: workers, containers, files

    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _terminate)
    try:
        cli.main(args=argv, prog_name="reproci", standalone_mode=False)
        return 0
    except ReprociError as e:
        err_console.print(f"[bold red]error:[/] {escape(str(e))}")  # a message is text, not markup: [report] stays
        return e.return_code
    except click.exceptions.Abort:
        err_console.print("[bold red]interrupted[/]: nothing was recorded")
        return errors.EXIT_INTERRUPTED
    except KeyboardInterrupt:
        err_console.print("[bold red]interrupted[/]: unfinished runs were stopped and their files removed")
        return errors.EXIT_INTERRUPTED
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
