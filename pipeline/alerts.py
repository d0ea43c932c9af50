"""Alerts: GitHub annotations, the step summary, and a Slack-compatible webhook.

An alert never changes a verdict and never loses results: a dead webhook is reported
(on stderr and in the results document) and the run's exit code stands.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from . import verdicts

FAILING = {verdicts.NONDETERMINISTIC, verdicts.RESUME_BROKEN, verdicts.ERROR, verdicts.UPGRADE_CHANGED,
           verdicts.ENV_CHANGED, verdicts.GOLDEN_MISMATCH}
NOTICE = {verdicts.NEW, verdicts.MODEL_CHANGED}


def _escape(text: str) -> str:
    """GitHub workflow-command escaping for messages."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def annotations(document: dict[str, Any]) -> list[str]:
    """``::error``/``::warning`` lines, one per model that needs attention."""
    image = (document.get("image") or {}).get("name")
    ci = bool((document.get("options") or {}).get("ci"))
    lines = []
    for m in document.get("models", []):
        v = m.get("verdict")
        if v in FAILING or (v == verdicts.NEW and ci):
            level = "error"
        elif v in NOTICE:
            level = "warning"
        else:
            continue
        lines.append(f"::{level} title=reproci {image} {m['model']} {v}::{_escape(str(m.get('message', '')))}")
    return lines


def _fmt_env(diff: dict[str, list[Any]], limit: int = 6) -> str:
    return ", ".join(f"{k} {v[0]} → {v[1]}" for k, v in list(diff.items())[:limit]) or "-"


def summary_markdown(document: dict[str, Any]) -> str:
    """A compact Markdown summary for ``$GITHUB_STEP_SUMMARY``: what changed comes first."""
    image = document.get("image") or {}
    code = (document.get("summary") or {}).get("exit_code", 0)
    checked = any(m.get("verdict") != verdicts.NOT_CHECKED for m in document.get("models", []))
    status = ("✅ reproducible" if checked else "throughput only") if code == 0 else "❌ attention needed"
    lines = [f"## reproci · `{image.get('name')}` · {status}", ""]
    if image.get("digest"):
        lines += [f"Image digest: `{image['digest']}`", ""]
    lines += ["| model | verdict | final sha256 | first difference | detail |", "|---|---|---|---|---|"]
    order = {v: i for i, v in enumerate([verdicts.ERROR, verdicts.NONDETERMINISTIC, verdicts.RESUME_BROKEN,
                                         verdicts.UPGRADE_CHANGED, verdicts.ENV_CHANGED, verdicts.GOLDEN_MISMATCH,
                                         verdicts.NEW, verdicts.MODEL_CHANGED, verdicts.PASS])}
    for m in sorted(document.get("models", []), key=lambda m: order.get(m.get("verdict"), 99)):
        ev = m.get("evidence") or (m.get("golden") or {}).get("evidence") or {}
        where = verdicts.first_difference(ev, code=lambda s: f"`{s}`")
        msg = str(m.get("message", "")).replace("|", "\\|")
        lines.append(f"| {m['model']} | **{m.get('verdict')}** | `{(m.get('final_sha256') or '-')[:12]}` | {where} | {msg} |")
    diffs = [(m["model"], m["golden"]) for m in document.get("models", []) if (m.get("golden") or {}).get("package_diff")]
    if diffs:
        lines += ["", "### Package changes against the golden", ""]
        seen = diffs[0][1]["package_diff"]
        lines += [f"- `{k}`: {v[0]} → {v[1]}" for k, v in list(seen.items())[:30]]
    return "\n".join(lines) + "\n"


def write_step_summary(document: dict[str, Any], path: Path) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(summary_markdown(document))


def slack_message(document: dict[str, Any]) -> dict[str, Any]:
    image = (document.get("image") or {}).get("name")
    bad = [m for m in document.get("models", []) if m.get("verdict") in FAILING]
    head = f"reproci: {len(bad)} model(s) need attention on image {image}"
    body = "\n".join(f"• *{m['model']}*: {m['verdict']}: {m.get('message', '')}" for m in bad[:20])
    return {
        "text": f"{head}\n{body}",
        "blocks": [
            {"type": "header", "text": {"type": "plain_text", "text": head[:150]}},
            {"type": "section", "text": {"type": "mrkdwn", "text": body[:2900] or "-"}},
            {"type": "context", "elements": [{"type": "mrkdwn",
                                              "text": f"run {document.get('run_id')} · commit {document.get('project_commit') or '-'}"}]},
        ],
    }


@dataclass(frozen=True)
class WebhookResult:
    ok: bool
    attempts: int
    status: int | None = None
    error: str | None = None


def post_webhook(url: str, payload: dict[str, Any], *, attempts: int = 3, timeout: float = 5.0,
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


def needs_alert(document: dict[str, Any]) -> bool:
    return (document.get("summary") or {}).get("exit_code", 0) != 0
