"""Joining a Ray cluster at an address (``ray_driver.connect``), bounded and in one line.

Ray waits a minute and more for a head that does not answer, and its core writes a warning to
stderr each second it tries (20 tries by default). Before Ray starts, ``reachable`` refuses a
``HOST:PORT`` where nothing listens, or whose port does not answer as a Ray head's GCS (a gRPC
server) does: its first frame, an HTTP/2 SETTINGS. While Ray joins, ``lines_held`` bounds its
tries and holds its lines back, for the one-line error when it does not join.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from typing import Iterator

from ..errors import InfrastructureError

CONNECT_TIMEOUT_S = 10.0
GCS_ANSWER_S = 5.0  # how long the cluster's GCS (a gRPC server) may take to answer a connection's first frame
GCS_TRIES = 3  # Ray's tries to join a GCS, a second apart (its own default: 20, each a log line)


def reachable(address: str) -> None:
    """A ``HOST:PORT`` that does not answer, or answers as no gRPC server would (a Ray head's GCS
    is one), is refused at once: Ray itself waits a minute and more, a log line a second."""
    import socket

    host, sep, port = address.rpartition(":")
    if not sep or "://" in address or not port.isdigit():
        return  # "auto", ray://...: Ray's own forms
    try:
        conn = socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S)
    except OSError as e:
        raise InfrastructureError(f"cannot reach the Ray cluster at {address} ({e.strerror or e}); start its head with "
                                  "`ray start --head --port PORT` there, or pass the right --address HOST:PORT") from e
    with conn:
        try:
            conn.settimeout(GCS_ANSWER_S)
            conn.sendall(HTTP2_PREFACE)
            answer = conn.recv(9)  # a frame's header: an HTTP/2 server's first frame is its SETTINGS (type 4)
        except OSError:
            answer = b""
    if len(answer) < 4 or answer[3] != 4:
        raise InfrastructureError(f"no Ray cluster answers at {address}: its port is open, but it did not answer in "
                                  f"{GCS_ANSWER_S:g} s as a Ray head's GCS (a gRPC server) does; pass the port of the "
                                  "head's `ray start --head --port` as --address HOST:PORT")


HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])  # and an empty SETTINGS frame


@contextlib.contextmanager
def lines_held(address: str | None, held: list[str]) -> Iterator[None]:
    """While Ray joins the cluster at ``address``: its tries bounded (``GCS_TRIES``), and the lines
    its core writes to this process's stderr (a warning a try) held back. Joined, they are given
    back as they were; not joined, ``held`` has them, their prefixes cut, for the one-line error.
    A local cluster (no address) starts processes that inherit stderr: it is left as it is."""
    if address is None:
        yield
        return
    saved_tries = os.environ.get("RAY_gcs_server_port_wait_time_s")
    os.environ.setdefault("RAY_gcs_server_port_wait_time_s", str(GCS_TRIES))
    sys.stderr.flush()
    saved_fd = os.dup(2)
    joined = False
    with tempfile.TemporaryFile() as lines:
        os.dup2(lines.fileno(), 2)
        try:
            yield
            joined = True
        finally:
            sys.stderr.flush()
            os.dup2(saved_fd, 2)
            os.close(saved_fd)
            if saved_tries is None:
                os.environ.pop("RAY_gcs_server_port_wait_time_s", None)
            lines.seek(0)
            text = lines.read().decode(errors="replace")
            if joined:
                sys.stderr.write(text)
            held.extend(re.sub(r"^\[[^\]]*\] (\S+:\d+: )?", "", line) for line in text.splitlines() if line.strip())
