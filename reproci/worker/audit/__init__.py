"""The op audit: findings, the table of torch's documented ops, the check, attention, the op recorder, fixes.

Worker side: the standard library, torch and numpy only."""

from __future__ import annotations


def module_text(path: str | None) -> str:
    """A module's path as a sentence names it: a bare index (a child of a top-level
    ``nn.Sequential`` or ``ModuleList``, as in ``2 at model.py:41``) reads as ``module 2``."""
    return f"module {path}" if path and path.isdigit() else path or ""

