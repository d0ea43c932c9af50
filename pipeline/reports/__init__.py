"""Reports of a results document: Markdown, HTML with charts, JSON, and the run history."""

from __future__ import annotations

from . import history, jsonexport, markdown

FORMATS = ("md", "html", "json")

__all__ = ["FORMATS", "history", "jsonexport", "markdown"]
