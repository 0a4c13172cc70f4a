"""The harness's side of one sandbox session: :class:`Session` speaks the session process's
request / reply protocol over its socket (files of the work directory, cells, recycling,
closing) and turns a cell's reply into a :class:`CellResult` whose ``error`` explains a
failure. Sessions are opened by :class:`tasks.sandbox.pool.Sandbox`; see
:mod:`tasks.sandbox.session`.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tasks.sandbox.isolation import (REQUIRED_MECHANISMS, SandboxError, WorkdirError,
                                     WorkdirFull, _MiB)
from tasks.sandbox.zygote import recv_msg, send_msg

if TYPE_CHECKING:
    from tasks.sandbox.pool import Sandbox

#: The module's name before the split (log configuration and records keep naming it).
log = logging.getLogger("tasks.sandbox.session")


@dataclass
class CellResult:
    """What one cell did.

    ``stdout``: its standard output (at most ``max_output_chars`` characters kept;
    ``stdout_bytes`` is the full size in bytes); ``stderr``: the last 2,000 characters of its
    standard error; ``exit_code`` (None when killed by a signal) and ``signal``; ``timed_out``
    when the wall-clock limit killed it, ``cpu_exceeded`` / ``oom_killed`` when the process
    tree's CPU / memory limit did, ``pids_limit_hit`` when a fork or thread was refused at the
    process-count limit; ``error``: a one-line explanation when the cell failed, else None;
    ``sandbox_failed``: the sandbox itself failed (it stopped answering, refused the request,
    or could not set the cell up), not the cell's code — infrastructure, not the agent's;
    ``audit_events``: what the cell's run-time audit hook reported (file-system accesses
    outside its work directory, network and process events; see
    :func:`tasks.sandbox.zygote.audit_hook._install_audit_hook`) and ``audit_complete`` whether the
    channel ended with querylab's end marker (False: the cell closed or redirected it, or was
    killed);
    ``duration_s`` wall seconds, ``cpu_s`` CPU seconds of the whole tree (cgroup), ``max_rss_kb``
    peak memory of the tree in KiB (cgroup; the main process's when there is none).
    """

    stdout: str
    stdout_bytes: int
    stderr: str
    exit_code: int | None
    signal: int | None
    timed_out: bool
    error: str | None
    duration_s: float = 0.0
    cpu_s: float = 0.0
    max_rss_kb: int = 0
    cpu_exceeded: bool = False
    oom_killed: bool = False
    pids_limit_hit: bool = False
    sandbox_failed: bool = False
    audit_events: list = field(default_factory=list)
    audit_complete: bool = True

    @property
    def ok(self) -> bool:
        return self.error is None


def _explain(res: CellResult, timeout_s: float, memory_mb: int, cpu_s: int, file_mb: int,
             max_procs: int) -> str | None:
    if res.timed_out:
        return f"execute_python timed out after {timeout_s:g} s (wall clock); the process was killed"
    if res.cpu_exceeded:
        return (f"execute_python exceeded its CPU limit of {cpu_s} s (all its processes) and "
                "was killed")
    sig = res.signal
    if res.oom_killed and sig == signal.SIGKILL:
        return (f"execute_python exceeded its memory limit of {memory_mb} MiB (all its "
                "processes and work-directory files) and was killed")
    procs = (f" (it hit its limit of {max_procs} processes and threads)"
             if res.pids_limit_hit else "")
    if sig is not None:
        if sig in (signal.SIGXCPU, signal.SIGKILL) and res.cpu_s >= cpu_s - 0.5:
            return f"execute_python exceeded its CPU limit of {cpu_s} s and was killed"
        if sig == signal.SIGXFSZ:
            return f"execute_python wrote a file (or output) larger than {file_mb} MiB and was killed"
        if sig in (signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT, signal.SIGKILL):
            return (f"execute_python was killed by {signal.Signals(sig).name} (memory limit "
                    f"{memory_mb} MiB?){procs}")
        return f"execute_python was killed by {signal.Signals(sig).name}{procs}"
    if res.exit_code:
        tail = "\n".join(res.stderr.strip().splitlines()[-8:])
        oom = " (a process of the cell was killed at the memory limit)" if res.oom_killed else ""
        if "MemoryError" in res.stderr:
            return (f"execute_python exceeded its memory limit of {memory_mb} MiB "
                    f"(MemoryError){oom}:\n{tail}")
        return f"python exited with code {res.exit_code}{oom}{procs}:\n{tail}"
    return None


class Session:
    """One trial's sandbox: a process owning the trial's namespaces, file-system view, work
    directory and cgroups (see the module docstring). Opened by :meth:`Sandbox.open_session`.

    Thread-safe (calls on one session run one at a time; different sessions run in parallel).
    ``mechanisms`` maps :data:`REQUIRED_MECHANISMS` / :data:`OPTIONAL_MECHANISMS` names to
    whether this session has them; ``isolated`` is True when it has every required one.
    :meth:`close` (or leaving a ``with`` block) ends it and frees its work directory.
    """

    def __init__(self, sandbox: Sandbox, sock: socket.socket, pidfd: int, pid: int, sid: int):
        self.sandbox, self.pid, self.sid = sandbox, pid, sid
        self._sock, self._pidfd = sock, pidfd
        self._lock = threading.Lock()
        self._closed = False
        self._legacy_tmp: str | None = None
        self._pool_key: int | None = None  # a trial session: recycled into the warm pool
        self._handed_over = False
        self._recycling = False
        self.disk_mb: int | None = None
        self.mechanisms: dict[str, bool] = {}
        self.notes: dict[str, str] = {}

    # -- plumbing -------------------------------------------------------------------------
    def _await_recycled(self, timeout_s: float) -> bool:
        """Wait for the reply to a recycle request; False (and the session killed) when the
        session could not be made as good as new."""
        with self._lock:
            try:
                msg, _ = recv_msg(self._sock, time.monotonic() + timeout_s, max_payload=0)
            except (OSError, ValueError, TimeoutError):
                msg = None
            self._recycling = False
        if not msg or not msg.get("ok"):
            if msg:
                log.warning("a sandbox session could not be recycled: %s", msg.get("error"))
            self._kill()
            return False
        return True

    def _hello(self, timeout_s: float) -> None:
        try:
            msg, _ = recv_msg(self._sock, time.monotonic() + timeout_s, max_payload=0)
        except (OSError, ValueError, TimeoutError) as exc:
            self._kill()
            raise SandboxError(f"the sandbox session did not start: {exc}") from None
        if msg is None or not msg.get("ok"):
            self._kill()
            raise SandboxError((msg or {}).get("error") or "the sandbox session did not start")
        self.mechanisms = {k: bool(v) for k, v in msg["mechanisms"].items()}
        self.notes = dict(msg.get("notes") or {})

    @property
    def isolated(self) -> bool:
        """True when the session set up every mechanism of :data:`REQUIRED_MECHANISMS`."""
        return all(self.mechanisms.get(m) for m in REQUIRED_MECHANISMS)

    @property
    def alive(self) -> bool:
        return not self._closed

    def _successor(self) -> Session:
        """A new handle on this session's process (for the next trial); this one is closed."""
        with self._lock:
            if self._closed:
                raise SandboxError("the sandbox session is closed")
            s = Session(self.sandbox, self._sock, self._pidfd, self.pid, self.sid)
            s.mechanisms, s.notes, s.disk_mb = self.mechanisms, self.notes, self.disk_mb
            s._pool_key = self._pool_key
            self._closed = self._handed_over = True
        self.sandbox._forget(self)
        self.sandbox._sessions.add(s)
        return s

    def _kill(self) -> None:
        if self._handed_over:
            return
        self._closed = True
        try:
            signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
        except OSError:
            pass
        self._release()

    def _release(self) -> None:
        if self._handed_over:
            return
        self._closed = True
        for close in (self._sock.close, lambda: os.close(self._pidfd)):
            try:
                close()
            except OSError:
                pass
        self.sandbox._forget(self)
        if self._legacy_tmp:
            shutil.rmtree(self._legacy_tmp, ignore_errors=True)

    def _request(self, header: dict, payload: bytes = b"", timeout_s: float = 60.0,
                 max_payload: int = 0) -> tuple[dict, bytes]:
        """Send one request, return the reply; a dead or silent session is killed and raises
        SandboxError (``reply["ok"]`` False is returned, not raised)."""
        with self._lock:
            if self._closed:
                raise SandboxError("the sandbox session is closed")
            try:
                send_msg(self._sock, header, payload)
                reply, data = recv_msg(self._sock, time.monotonic() + timeout_s,
                                       max_payload=max_payload)
            except TimeoutError:
                self._kill()
                raise SandboxError(f"the sandbox session stopped answering within {timeout_s:g} "
                                   "s; its work directory is lost") from None
            except (OSError, ValueError) as exc:
                self._kill()
                raise SandboxError(f"the sandbox session died ({exc}); its work directory is "
                                   "lost") from None
            if reply is None:
                self._kill()
                raise SandboxError("the sandbox session died; its work directory is lost")
            return reply, data

    def _checked(self, header: dict, payload: bytes = b"",
                 max_payload: int = 0) -> tuple[dict, bytes]:
        reply, data = self._request(header, payload, max_payload=max_payload)
        if not reply.get("ok"):
            err = str(reply.get("error"))
            full = "No space left" in err or "Disk quota exceeded" in err
            if full and self.disk_mb:
                err += f" (the work directory holds at most {self.disk_mb} MiB)"
            on_workdir = header["op"] in ("put", "get", "rename", "save_output")
            raise (WorkdirFull if full else WorkdirError if on_workdir else SandboxError)(
                f"sandbox {header['op']} {header.get('path', '')[:100]}: {err}")
        return reply, data

    # -- files ----------------------------------------------------------------------------
    def put_file(self, rel: str, data: bytes) -> None:
        """Write ``data`` to ``rel`` (a relative path, ``/``-separated, no ``..``) in the work
        directory, creating directories; replaces whatever is there (a symlink is replaced,
        never followed). The file belongs to the sandbox uid. Raises WorkdirError when the
        work directory's content is in the way (full, a directory at ``rel``), SandboxError
        when the session failed."""
        self._checked({"op": "put", "path": rel}, bytes(data))

    def get_file(self, rel: str, max_bytes: int = 64 * _MiB) -> bytes:
        """The first ``max_bytes`` bytes of the regular file ``rel`` of the work directory.
        Raises SandboxError when it is missing, not a regular file or behind a symlink."""
        _, data = self._checked({"op": "get", "path": rel, "max_bytes": int(max_bytes)},
                                max_payload=int(max_bytes))
        return data

    def put_readonly(self, root: str, rel: str, data: bytes) -> None:
        """Before the first cell of a session opened with ``readonly_mb``: write ``rel`` under
        ``/task`` (``root="task"``) or ``/opt/querylab-lib`` (``root="lib"``); the first cell
        seals both read-only."""
        self._checked({"op": "put_ro", "root": root, "path": rel}, bytes(data))

    def rename(self, src: str, dst: str) -> None:
        """Move ``src`` to ``dst`` inside the work directory (creating ``dst``'s directories)."""
        self._checked({"op": "rename", "src": src, "dst": dst, "path": src})

    def save_output(self, rel: str) -> int:
        """Copy the last cell's full stdout to ``rel`` in the work directory (where a later
        cell can read it); returns its size in bytes. Raises SandboxError (e.g. the work
        directory is full)."""
        reply, _ = self._checked({"op": "save_output", "path": rel})
        return int(reply["bytes"])

    # -- cells ----------------------------------------------------------------------------
    def run(
        self,
        code: str,
        name: str = "cell",
        timeout_s: float = 60.0,
        memory_mb: int = 2048,
        cpu_s: int = 60,
        max_file_mb: int = 256,
        max_procs: int = 128,
        max_output_chars: int = 1_000_000,
    ) -> CellResult:
        """Run ``code`` in a fresh cell named ``name`` (letters, digits, ``_-.``, at most 200
        characters; tracebacks say ``File "<name>.py"``). Its stdout / stderr go to a small
        file system of their own (``/run/cell``, replaced by the next cell; legacy sessions:
        ``.cells/<name>.out|.err`` in the work directory), so a full work directory never
        hides them; :meth:`save_output` keeps the full stdout.

        Limits: ``timeout_s`` wall seconds; ``memory_mb`` MiB for the cell's process tree
        (cgroup, work-directory files included) and of address space per process beyond what
        the preloaded interpreter maps (without a memory cgroup: in all); ``cpu_s``
        CPU seconds for the tree (and per process); ``max_file_mb`` MiB per written file
        (stdout included); ``max_procs`` processes + threads. Returns a :class:`CellResult`
        (a cell's own failure is in ``error``); raises SandboxError when the session is dead.
        """
        header = {
            "op": "run", "name": name, "timeout_s": float(timeout_s),
            "memory_bytes": int(memory_mb) * _MiB, "cpu_s": max(int(cpu_s), 1),
            "max_file_bytes": int(max_file_mb) * _MiB, "max_procs": int(max_procs),
            "max_output_chars": int(max_output_chars),
        }
        try:
            reply, head = self._request(header, code.encode("utf-8", "surrogatepass"),
                                        timeout_s=float(timeout_s) + 30.0,
                                        max_payload=int(max_output_chars) * 4)
        except SandboxError as exc:
            if "stopped answering" in str(exc):
                return CellResult("", 0, "", None, None, True,
                                  "execute_python: the sandbox stopped answering; the cell "
                                  "was abandoned", sandbox_failed=True)
            raise
        if not reply.get("ok"):
            return CellResult("", 0, "", None, None, False, f"sandbox error: {reply.get('error')}",
                              sandbox_failed=True)
        res = CellResult(
            stdout=head.decode("utf-8", errors="replace")[:max_output_chars],
            stdout_bytes=reply["stdout_bytes"], stderr=reply["stderr"][-2000:],
            exit_code=reply["exit_code"], signal=reply["signal"], timed_out=reply["timed_out"],
            error=None, duration_s=reply["duration_s"], cpu_s=reply["cpu_s"] or 0.0,
            max_rss_kb=reply["max_rss_kb"], cpu_exceeded=reply["cpu_exceeded"],
            oom_killed=reply["oom_killed"], pids_limit_hit=reply["pids_limit_hit"],
            audit_events=list(reply.get("audit") or []),
            audit_complete=bool(reply.get("audit_complete", True)),
        )
        if reply.get("setup_error"):
            res.error = f"execute_python could not start the cell: {reply['setup_error']}"
            res.sandbox_failed = True
        else:
            res.error = _explain(res, timeout_s, memory_mb, cpu_s, max_file_mb, max_procs)
        return res

    def close(self) -> None:
        """End the session (idempotent): its processes and work directory go. A trial session
        goes back to the sandbox's warm pool (recycled: every process killed, fresh file
        systems and IPC namespace) when there is room; else its process exits and its cgroups
        are removed."""
        if self._closed:
            return
        if self._pool_key is not None and self.sandbox._give_back(self):
            return
        try:
            self._request({"op": "close"}, timeout_s=10.0)
        except SandboxError:
            return  # already killed
        with self._lock:
            if not self._closed:
                self._release()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
