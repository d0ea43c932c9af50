"""The webhook's delivery (``reproci/reports/webhook.py``): retried while the server fails,
against a real local HTTP server; never raising."""

from __future__ import annotations

import http.server
import json
import socket
import threading
from collections.abc import Iterator
from typing import ClassVar

import pytest

from reproci.reports import webhook


class Hook(http.server.BaseHTTPRequestHandler):
    """Answers each POST with the next status of ``answers`` (then 200) and keeps what it got."""

    answers: ClassVar[list[int]] = []
    received: ClassVar[list[dict]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        cls = type(self)
        status = cls.answers.pop(0) if cls.answers else 200
        cls.received.append(body)
        self.send_response(status)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def hook() -> Iterator[str]:
    Hook.answers, Hook.received = [], []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hook"
    server.shutdown()
    server.server_close()


PAYLOAD = {"text": "reproci: 1 model(s) need attention on image img"}


@pytest.mark.parametrize("answers, attempts", [([503], 2), ([502, 429], 3)])
def test_an_alert_is_retried_while_the_server_fails_then_delivered(hook: str, answers: list[int], attempts: int) -> None:
    Hook.answers = list(answers)
    waits: list[float] = []
    result = webhook.post(hook, PAYLOAD, sleep=waits.append)
    assert result == webhook.WebhookResult(ok=True, attempts=attempts, status=200)
    assert Hook.received == [PAYLOAD] * attempts
    assert waits == [0.5, 1.0][:attempts - 1]  # backing off between attempts


def test_a_server_that_keeps_failing_is_reported_after_the_last_attempt(hook: str) -> None:
    Hook.answers = [500, 500, 500, 500]
    result = webhook.post(hook, PAYLOAD, sleep=lambda _: None)
    assert result == webhook.WebhookResult(ok=False, attempts=3, status=500, error="HTTP 500")
    assert len(Hook.received) == 3


def test_a_client_error_is_not_retried(hook: str) -> None:
    Hook.answers = [404]
    result = webhook.post(hook, PAYLOAD, sleep=lambda _: None)
    assert result == webhook.WebhookResult(ok=False, attempts=1, status=404, error="HTTP 404")


def test_nothing_listening_is_retried_and_never_raises() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once we leave: nothing listens there
    result = webhook.post(f"http://127.0.0.1:{port}/x", PAYLOAD, sleep=lambda _: None, timeout=2)
    assert result == webhook.WebhookResult(ok=False, attempts=3, status=None, error="ConnectionError")
