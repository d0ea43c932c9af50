"""The fork server's loop (``reproci.worker.forkserver`` starts it): what it checks before
every fork, and how it serves its launchers. Standard library only."""

from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import sys
import threading
import time
from typing import TypedDict, Union

IDLE_END = "the standing server was idle and ended"  # what a launcher that connected as it ended reads


class Hello(TypedDict, total=False):
    """A server's greeting on a launcher's control socket: ready, or why not, and the server's pid
    (an idle standing server's last word has no pid; a server given no greeting sends none of the keys)."""

    ready: bool
    reason: str | None
    pid: int


class Request(TypedDict):
    """A launcher's request to fork a run (with two descriptors: its status socket and its output pipe)."""

    spec: str  # the run's spec file
    cwd: str  # the directory it runs in


class Forked(Request):
    """A request as the forked child takes it: with the run's status socket."""

    status: socket.socket


class Started(TypedDict):
    """The forked run's pid, and its start on the host's clock (time.monotonic())."""

    pid: int
    started: float


class Refused(TypedDict):
    refused: str  # why the server would not fork


class Ended(TypedDict):
    status: int  # the run's exit status (negative: killed by that signal)


Message = Union[Hello, Started, Refused, Ended]  # what a server sends


def thread_count() -> int:
    """Threads of this process, as the kernel counts them (OpenMP, BLAS and CUDA threads too)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


def unsafe() -> str | None:
    """Why this process must not fork now, or None. A fork copies only the calling thread:
    a pool thread's locks would be held for ever in the child, and a CUDA context cannot
    cross a fork."""
    n = thread_count()
    if n > 1 or threading.active_count() > 1:
        return f"the server holds {n} threads"
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "the server holds a CUDA context"
    return None


def send(sock: socket.socket, message: Message) -> None:
    try:
        sock.send(json.dumps(message).encode())
    except OSError:
        pass  # the launcher stopped listening for this run: nothing to tell


class Server:
    """Forks the runs its launchers ask for. A plain server has one launcher (``controls``)
    and ends when it goes; a standing one (``listener``) takes any number of launchers, each
    greeted with ``hello``, kills a launcher's runs when that launcher goes (its socket closes:
    it ended, or was killed), and ends once nothing has used it for ``idle_s`` seconds."""

    def __init__(self, control: socket.socket | None, *, listener: socket.socket | None = None,
                 hello: Hello | None = None, idle_s: float = 0.0) -> None:
        self.controls: list[socket.socket] = [control] if control is not None else []
        self.listener, self.hello, self.idle_s = listener, hello or {}, idle_s
        self.runs: dict[int, socket.socket] = {}  # child pid -> its status socket
        self.owner: dict[int, socket.socket] = {}  # child pid -> the control socket that asked for it
        self.wake_r, self.wake_w = os.pipe()
        for fd in (self.wake_r, self.wake_w):
            os.set_blocking(fd, False)
        self.selector = selectors.DefaultSelector()

    def serve(self) -> Forked | None:
        """Fork runs until the launcher closes the control socket, or a standing server has
        been idle (returns None); in a forked child, return its request."""
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes the selector through the fd
        for sock in [*self.controls, *([self.listener] if self.listener else [])]:
            self.selector.register(sock, selectors.EVENT_READ)
        self.selector.register(self.wake_r, selectors.EVENT_READ)
        last_used = time.monotonic()
        while True:
            wait = None if self.listener is None else max(0.0, last_used + self.idle_s - time.monotonic())
            events = self.selector.select(wait)
            if self.runs or self.controls:
                last_used = time.monotonic()
            elif not events and self.listener is not None and time.monotonic() >= last_used + self.idle_s:
                return None
            for key, _ in events:
                if key.fileobj is self.listener:
                    self._accept()
                elif key.fileobj in self.controls:
                    request = self._request(key.fileobj)
                    if request is not None:
                        return request
                    if not self.controls and self.listener is None:
                        return None  # the launcher is done: children die with this process
                else:
                    try:
                        os.read(self.wake_r, 4096)
                    except BlockingIOError:
                        pass
                    self._reap()

    def _accept(self) -> None:
        try:
            conn, _ = self.listener.accept()  # type: ignore[union-attr]
        except OSError:
            return
        send(conn, self.hello)
        self.controls.append(conn)
        self.selector.register(conn, selectors.EVENT_READ)

    def _request(self, control: socket.socket) -> Forked | None:
        """One launcher's message: fork (in the child: the request), kill, or it went."""
        try:
            message, fds, _flags, _addr = socket.recv_fds(control, 1 << 16, 2)
        except InterruptedError:
            return None
        except OSError:
            message, fds = b"", []
        if not message:
            self._gone(control)
            return None
        request = json.loads(message)
        if "kill" in request:
            self._kill(int(request["kill"]))
            return None
        return self._fork(request, fds, control)

    def _gone(self, control: socket.socket) -> None:
        """A launcher closed its socket (it ended, or was killed). A plain server then ends, and
        its runs die with it (their parent-death signal); a standing one kills the runs that
        launcher started itself, as their parent's death would: the run, not what it started
        (as without a server, a run's own children are the run's to stop)."""
        self.selector.unregister(control)
        self.controls.remove(control)
        control.close()
        if self.listener is None:
            return
        for pid in [p for p, c in self.owner.items() if c is control]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _fork(self, request: Request, fds: list[int], control: socket.socket) -> Forked | None:
        status = socket.socket(fileno=fds[0])
        out = fds[1]
        why = unsafe()
        pid = -1
        if why is None:
            sys.stdout.flush()
            sys.stderr.flush()
            try:
                pid = os.fork()
            except OSError as e:
                why = f"fork failed: {e}"
        if why is not None:
            send(status, {"refused": why})
            status.close()
            os.close(out)
            return None
        if pid == 0:
            self._become_child(status, out)
            return {**request, "status": status}
        os.close(out)
        self.runs[pid] = status
        self.owner[pid] = control
        return None

    def _become_child(self, status: socket.socket, out: int) -> None:
        """Drop everything of the server's: its signal handling, sockets and pipes."""
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        self.selector.close()
        for sock in [*self.controls, *([self.listener] if self.listener else [])]:
            sock.close()
        for fd in (self.wake_r, self.wake_w):
            os.close(fd)
        for s in self.runs.values():
            s.close()
        self.runs.clear()
        self.owner.clear()
        os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(out)

    def _kill(self, pid: int) -> None:
        """A run's whole process group, asked for by a launcher that cannot see this pid."""
        if pid in self.runs:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def _reap(self) -> None:
        while self.runs:
            try:
                pid, raw = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            sock = self.runs.pop(pid, None)
            self.owner.pop(pid, None)
            if sock is not None:
                send(sock, {"status": os.waitstatus_to_exitcode(raw)})
                sock.close()
