"""``reproci compare``: is a change inside seed noise? (``compare.py`` does the work.) The variance
stage's own command, listed by its stage (``stage.py``)."""

from __future__ import annotations

from pathlib import Path

import click

from ...errors import EXIT_DRIFT, UsageError
from . import compare


@click.command("compare")
@click.argument("sides", metavar="[A B]", nargs=-1, type=click.Path(path_type=Path))
@click.option("--image", "images", multiple=True,
              help="Instead of A and B: an image name, twice (A then B); each means its latest results under --results-dir.")
@click.option("--results-dir", type=click.Path(path_type=Path), default=Path("results"), show_default=True,
              help="Where --image looks for results.")
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON (for machines).")
@click.option("--fail-worse", is_flag=True, help="Exit 3 when B is worse than A outside seed noise on any metric (a CI gate).")
def compare_cmd(sides: tuple[Path, ...], images: tuple[str, ...], results_dir: Path, as_json: bool,
                fail_worse: bool) -> None:
    """Is B's final loss or held-out metric inside A's seed-to-seed spread? A and B: results files
    (or run folders) or golden files, from runs with --stage variance. Per model and metric:
    B − A with Welch's 95 % confidence interval, and whether it is inside seed noise.
    Exit 0 when compared (inside or not; with --fail-worse, 3 when B is worse outside seed
    noise), 7 with fewer than 3 seeds on a side."""
    if images and sides:
        raise UsageError("give either two files A B or --image twice, not both")
    if images:
        if len(images) != 2:
            raise UsageError(f"--image needs exactly two images (A then B), got {len(images)}")
        sides = tuple(compare.latest_for_image(results_dir, name) for name in images)
    if len(sides) != 2:
        raise UsageError(f"compare needs two sides A and B (results files or golden files), got {len(sides)}")
    a, b = (compare.load_side(p) for p in sides)
    report = compare.compare(a, b)
    click.echo(compare.render(report, as_json), nl=False)
    if fail_worse and report.worse:
        raise SystemExit(EXIT_DRIFT)
