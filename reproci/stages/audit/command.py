"""``reproci audit --check-table``: the op audit's table against the running torch's own list
(``reproci/worker/audit/audit_check.py``), the audit stage's companion, listed by its stage
(``stage.py``). To audit models: ``reproci run --stage audit``."""

from __future__ import annotations

import click

from ...errors import UsageError


@click.command("audit")
@click.option("--check-table", is_flag=True, help="Compare the audit's table with this torch's "
              "torch.use_deterministic_algorithms docs, both ways; exit 1 on any difference.")
def audit_cmd(check_table: bool) -> None:
    """Check the op audit's table against the torch of this Python (models are audited by
    `reproci run --stage audit`; an image's torch by `python3 -m reproci.worker.audit.audit_check` inside it)."""
    if not check_table:
        raise UsageError("reproci audit --check-table compares the audit's table with this torch's docs; "
                         "to audit models run `reproci run --stage audit`")
    from ...worker.audit.audit_check import report

    code = report(click.echo)
    if code:
        raise SystemExit(code)
