"""The Slack-compatible webhook alert.

An alert never changes a verdict and never loses results: a dead webhook is reported
(on stderr and in the results document) and the run's exit code stands.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, TypedDict

from .. import verdicts
from ..document import Document, Entry
from ..results import ResultsDocument

if TYPE_CHECKING:
    from ..stages.base import Stages


class TextObject(TypedDict):
    """Slack's text object: ``plain_text`` or ``mrkdwn``."""

    type: str
    text: str


class TextBlock(TypedDict):
    """A header or section block: its text."""

    type: str
    text: TextObject


class ContextBlock(TypedDict):
    """A context block: small print under the others."""

    type: str
    elements: list[TextObject]


class SlackMessage(TypedDict):
    """The alert as a Slack-compatible incoming webhook takes it: its text, and the same as layout blocks."""

    text: str
    blocks: list[TextBlock | ContextBlock]


def needs_alert(document: ResultsDocument) -> bool:
    return (Document.of(document).summary or {}).get("exit_code", 0) != 0


def slack_message(document: ResultsDocument, stages: Stages) -> SlackMessage:
    """The alert: each model whose verdict fails or drifts, with its warnings, then each stage's
    lines (``Stage.webhook``), whose models count as needing attention too."""
    doc = Document.of(document)
    models = document.get("models", [])
    bad = [m for m in verdicts.by_severity(models) if Entry.of(m).verdict in verdicts.FAILING | verdicts.DRIFTING]
    lines = []
    for m in bad:
        e = Entry.of(m)
        lines.append(f"• *{e.model}*: {e.verdict}: {e.message or ''}"
                     + "".join(f"; warning: {text}" for _, text in verdicts.unsaid_warnings(m, e.message or "")))
    for stage in stages:  # what a stage's findings say (the probes' dependencies that failed the run)
        said = stage.webhook(document)
        bad += [m for m in models if m not in bad and any(model == m["model"] for model, _ in said)]
        lines += [line for _, line in said]
    head = f"reproci: {len(bad)} model(s) need attention on image {doc.image.name}"
    body = "\n".join(lines[:20])
    return {
        "text": f"{head}\n{body}",
        "blocks": [
            {"type": "header", "text": {"type": "plain_text", "text": head[:150]}},
            {"type": "section", "text": {"type": "mrkdwn", "text": body[:2900] or "-"}},
            {"type": "context", "elements": [{"type": "mrkdwn",
                                              "text": f"run {doc.run_id} · commit {doc.project_commit or '-'}"}]},
        ],
    }


@dataclass(frozen=True)
class WebhookResult:
    ok: bool
    attempts: int
    status: int | None = None
    error: str | None = None


def post(url: str, payload: SlackMessage, *, attempts: int = 3, timeout: float = 5.0,
         backoff: float = 0.5, sleep: Callable[[float], None] = time.sleep) -> WebhookResult:
    """POST JSON with retries on connection errors and 5xx/429; never raises."""
    import requests

    last_error, status = None, None
    for attempt in range(1, attempts + 1):
        try:
            r = requests.post(url, data=json.dumps(payload), headers={"Content-Type": "application/json"},
                              timeout=timeout)
            status = r.status_code
            if 200 <= r.status_code < 300:
                return WebhookResult(ok=True, attempts=attempt, status=status)
            last_error = f"HTTP {r.status_code}"
            if r.status_code < 500 and r.status_code != 429:
                break  # a client error will not improve with retries
        except requests.RequestException as e:
            last_error = type(e).__name__
        if attempt < attempts:
            sleep(backoff * 2 ** (attempt - 1))
    return WebhookResult(ok=False, attempts=attempt, status=status, error=last_error)
