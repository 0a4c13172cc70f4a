"""The ``execute_python`` sandbox: sealed, unprivileged, resource-limited Python cells.

Shape: one :class:`Sandbox` per process (:func:`shared_sandbox`) owns a *zygote* — a
``python -I`` process started with an environment stripped of secrets (only ``PATH``, locale
and time-zone variables survive) that imports pandas and pyarrow once and builds the cells'
read-only root file system once (a *template* mount namespace). Each trial opens a
:class:`Session` (forked from the zygote, no interpreter start-up; a warm spare is prepared
in the background, so opening one is a hand-over), each ``execute_python`` call is a *cell*
forked from its session. Sessions are independent processes with their own socket: many
trials run cells concurrently from one zygote (thread-safe; only the fork of a session is
serialised). The processes' code is :mod:`tasks.sandbox.zygote`.

What a cell sees and may do (Linux kernel mechanisms, no extra package):

- **File system**: a tmpfs root (the template's: ``pivot_root``, the host's tree detached)
  with read-only binds of ``/usr``, the interpreter's prefix and the venv's ``lib``
  (querylab's own distribution entries masked: the editable install's ``.pth`` and finder,
  its dist-info; the unused base site-packages too), a minimal ``/etc`` and ``/dev``, a
  ``/proc`` of the trial's PID namespace, and one size-capped tmpfs (``disk_mb``) holding the
  work directory ``/home/sandbox`` (cwd, ``HOME``), ``/tmp`` and ``/dev/shm``. No repository,
  ``QUERYLAB_HOME``, artifact root, response cache, other trial, or host ``/proc``. The work
  directory lives as long as the session: files written by one cell are there for the next;
  the harness puts and gets files through :meth:`Session.put_file` / :meth:`Session.get_file`
  (never following a symlink the cell planted). Stdout / stderr go to a small tmpfs of their
  own (``/run/cell``), so a full work directory never hides a cell's error.
- **Identity**: an unprivileged uid (``QUERYLAB_SANDBOX_UID``, default 61000) also when
  querylab runs as root; every capability dropped (bounding set too), ``no_new_privs``, and on
  x86-64 a seccomp filter refusing mount, namespace, ptrace, bpf, keyring and module calls.
- **Limits over its whole process tree**: the session lives in the trial's cgroups, so its
  cells are born there: memory (the tree, its work-directory files and the session process),
  pids (processes + threads), CPU seconds (cpuacct, polled; at most ``cpus`` cores at once);
  wall time (the session is PID 1 of the trial's PID namespace and kills every other process
  in it after each cell: no daemon survives); per-process rlimits (address space beyond the
  preloaded interpreter, CPU, file size, no core dumps). No network (an empty network
  namespace per trial), its own IPC and UTS namespaces.

Detection: :meth:`Sandbox.isolation` (:func:`detect_isolation`, ``python -m tasks.sandbox.session``)
opens a probe session, runs a probe cell and returns an :class:`Isolation` naming which
mechanisms this machine provides; :data:`REQUIRED_MECHANISMS` must all be present for LLM
agents to run (``--unsafe-sandbox`` overrides, see :func:`tasks.trials.stage.check_sandbox`).
Nothing is silently weaker: a session announces the mechanisms it set up, each cell enforces
exactly those or aborts before agent code runs. Where querylab is not root, a user namespace
gives everything but the cgroups (they must be delegated).

Why not bubblewrap: ``bwrap`` builds the same namespaces but ``exec``\\ s a fresh program, so
every session would pay a new interpreter importing pandas (~0.5–1 s here) instead of a fork
of the preloaded zygote (a few ms), and it sets up no cgroups; the direct system calls keep
the fork-from-zygote design and add the cgroup limits. Linux only.

A second entry point, :func:`run_in_folder` / :func:`run_validator`, runs a script (DAB's
``validate.py``) in a sealed session that sees only a read-only copy of its folder at
``/task`` (its cwd) plus a scratch directory.
"""

from __future__ import annotations

import atexit
import itertools
import json
import logging
import math
import os
import select
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path

from tasks.sandbox import host as sandbox_host
from tasks.sandbox import zygote
from tasks.sandbox.zygote import recv_msg, send_msg
from tasks.core.settings import env_get, env_subset
from tasks.core.layout import RunLayout

#: Environment variables the sandbox keeps (everything else, keys and URLs included, is dropped).
SAFE_ENV = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ")
#: Fixed variables for the sandbox: single-threaded BLAS/Arrow (fork-safe), no GUI backends.
SANDBOX_ENV = {
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "MPLBACKEND": "Agg",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONHASHSEED": "0",
}
DEFAULT_PRELOAD = ("pandas", "pyarrow")
#: The work directory of a cell (its cwd and ``HOME``) inside the sandbox.
SANDBOX_HOME = "/home/sandbox"
#: Where :func:`run_in_folder` shows its folder (read-only, the cell's cwd) and libraries.
TASK_DIR, LIB_DIR = "/task", "/opt/querylab-lib"

#: Mechanisms an LLM agent's cells need (name → what it is, for messages).
REQUIRED_MECHANISMS = {
    "filesystem_view": "a private file-system view (mount namespace + pivot_root)",
    "tmpfs_size_cap": "a size-capped tmpfs work directory",
    "pid_namespace": "a PID namespace per cell",
    "network_namespace": "a network namespace (no network)",
    "ipc_namespace": "an IPC namespace",
    "unprivileged_uid": "an unprivileged uid",
    "capabilities_dropped": "capabilities dropped",
    "no_new_privs": "no_new_privs",
    "cgroup_memory": "a cgroup memory limit",
    "cgroup_pids": "a cgroup process-count limit",
    "cgroup_cpu": "cgroup CPU accounting",
}
#: Extra hardening reported when present, not required.
OPTIONAL_MECHANISMS = {
    "uts_namespace": "a UTS namespace",
    "seccomp": "a seccomp system-call filter",
}
#: The uid / gid cells run as when querylab runs as root.
SANDBOX_UID = int(env_get("QUERYLAB_SANDBOX_UID", "61000"))
SANDBOX_GID = int(env_get("QUERYLAB_SANDBOX_GID", str(SANDBOX_UID)))

log = logging.getLogger(__name__)
_MiB = 1024 * 1024


class SandboxError(RuntimeError):
    """The sandbox itself failed (could not start, a session died, a file operation failed)."""


class WorkdirError(SandboxError):
    """A file operation on the trial's work directory failed because of what the cells left in
    it (it is full; a directory, FIFO or other non-file where querylab writes ``vars/…``):
    the agent's doing, so a tool error the model sees, unlike every other
    :class:`SandboxError` (the sandbox failing). Were it a harness error, a cell could plant
    ``vars/var_<id>.json/`` and have its failing trial left out of the score as errored."""


class WorkdirFull(WorkdirError):
    """The trial's work directory is full (the cells filled it)."""


class SandboxUnavailable(SandboxError):
    """This machine cannot isolate cells: ``missing`` names the mechanisms it lacks."""

    def __init__(self, missing: list[str], detail: str = ""):
        self.missing = list(missing)
        text = ", ".join(REQUIRED_MECHANISMS.get(m, m) for m in self.missing)
        super().__init__(
            f"execute_python cannot be isolated on this machine: missing {text}"
            + (f" ({detail})" if detail else "")
        )


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


@dataclass(frozen=True)
class Isolation:
    """Which isolation mechanisms this machine provides (``mechanisms``: name → bool, see
    :data:`REQUIRED_MECHANISMS` / :data:`OPTIONAL_MECHANISMS`; ``notes``: name → why not)."""

    mechanisms: dict[str, bool]
    notes: dict[str, str] = field(default_factory=dict)

    @property
    def missing(self) -> list[str]:
        """Required mechanisms this machine lacks (empty: cells are isolated)."""
        return [m for m in REQUIRED_MECHANISMS if not self.mechanisms.get(m)]

    @property
    def ok(self) -> bool:
        return not self.missing

    def describe(self) -> dict:
        """JSON-able: ``isolated``, ``missing``, ``mechanisms``, ``notes``."""
        return {"isolated": self.ok, "missing": self.missing,
                "mechanisms": dict(self.mechanisms), "notes": dict(self.notes)}

    def error(self) -> SandboxUnavailable:
        detail = "; ".join(f"{k}: {v}" for k, v in self.notes.items() if k in self.missing
                           or k == "error")
        return SandboxUnavailable(self.missing, detail)


def sandbox_env(cpus: float = 1.0) -> dict[str, str]:
    """The environment of sandboxed code: :data:`SAFE_ENV` from ours plus :data:`SANDBOX_ENV`
    (Polars limited to ``ceil(cpus)`` threads)."""
    env = env_subset(SAFE_ENV)
    env.update(SANDBOX_ENV)
    env["POLARS_MAX_THREADS"] = str(max(1, math.ceil(cpus)))
    return env


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


class Sandbox:
    """Opens sandbox :class:`Session`\\ s from one zygote process (see the module docstring).

    ``preload``: modules the zygote imports once; ``python``: the interpreter (default: this
    one, so the venv's libraries are importable); ``isolate``: False makes every session a
    legacy one on a host directory (no file-system view; tests of the unsafe path); ``cpus``:
    cores a cell may use at once (cgroup quota); ``spares``: trial sessions (default work
    directory and cwd) kept ready per work-directory size — set up ahead by a background
    thread, or recycled when a trial closes its session (every process killed, fresh file
    systems and IPC namespace) — so :meth:`open_session` hands one over (the forks, namespace
    and cgroup set-up and their RCU grace periods leave the trial's critical path). Thread-safe:
    many sessions run at once; :meth:`close` stops the zygote and every session.
    """

    def __init__(
        self,
        preload: tuple[str, ...] = DEFAULT_PRELOAD,
        python: str | None = None,
        isolate: bool = True,
        cpus: float = 1.0,
        spares: int = 2,
    ):
        if sys.platform != "linux":  # pragma: no cover
            raise SandboxError("execute_python's sandbox needs Linux (namespaces, cgroups)")
        self.preload = tuple(preload)
        self.python = python or sys.executable
        self.isolate = isolate
        self.cpus = float(cpus)
        self.spares = max(int(spares), 0)
        self._spares: dict[int, list[Session]] = {}
        self._refilling: set[int] = set()
        # disk_mb -> the reserve() filling running: pool size it fills to ("want"), the sandbox
        # generation it serves, sessions being opened, worker threads left
        self._reserving: dict[int, dict[str, int]] = {}
        self._spare_lock = threading.Lock()
        self._generation = 0
        self._proc: subprocess.Popen | None = None
        self._ctl: socket.socket | None = None
        self._ctl_lock = threading.Lock()
        self._probe_lock = threading.Lock()
        self._isolation: Isolation | None = None
        self._sids = itertools.count(1)
        self._sessions: weakref.WeakSet[Session] = weakref.WeakSet()
        self._home: str | None = None
        self._cgroups: dict | None = None
        self._retired: list[tuple[dict | None, str | None]] = []
        self._view_error: str | None = None
        self._warned = False
        self.hello: dict = {}

    # -- zygote ---------------------------------------------------------------------------
    def _start(self) -> None:
        self._home = tempfile.mkdtemp(prefix="querylab-sandbox-")
        staging = os.path.join(self._home, "root")
        os.mkdir(staging, 0o755)
        view = sandbox_host.filesystem_view(SANDBOX_UID, SANDBOX_GID, SANDBOX_HOME)
        self._view_error = sandbox_host.check_view(view) if self.isolate else None
        sandbox_host.sweep_stale_cgroups()
        self._cgroups = sandbox_host.create_cgroup_base(
            f"{sandbox_host.CGROUP_PREFIX}{os.getpid()}-{id(self):x}")
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        config = {
            "control_fd": child.fileno(), "preload": list(self.preload),
            "uid": SANDBOX_UID, "gid": SANDBOX_GID, "userns": True, "home": SANDBOX_HOME,
            "staging": staging, "view": view, "cgroups": self._cgroups,
            "isolate": self.isolate and not self._view_error,
        }
        log = open(os.path.join(self._home, "zygote.log"), "wb")  # noqa: SIM115
        try:
            self._proc = subprocess.Popen(
                [self.python, "-I", "-c", zygote.source(), json.dumps(config)],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
                env=sandbox_env(self.cpus), cwd=self._home, pass_fds=(child.fileno(),),
                start_new_session=True,
            )
        finally:
            child.close()
            log.close()
        parent.settimeout(120)
        try:
            hello = json.loads(parent.recv(1 << 16) or b"{}")
        except (OSError, ValueError):
            hello = {}
        if not hello.get("ready"):
            parent.close()
            self._stop()
            raise SandboxError("the execute_python sandbox did not start")
        parent.settimeout(30)
        self._ctl, self.hello = parent, hello
        if self.isolate and not self._view_error and hello.get("view_error"):
            self._view_error = f"the file-system view could not be built: {hello['view_error']}"

    def _stop(self, final: bool = True) -> None:
        """Stop the zygote. ``final``: also remove its cgroups and directory (and those of
        zygotes stopped before); otherwise (a restart) they stay for the sessions still
        running from it, until :meth:`close`."""
        proc, self._proc = self._proc, None
        if self._ctl is not None:
            self._ctl.close()
            self._ctl = None
        if proc is not None:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)
        self._retired.append((self._cgroups, self._home))
        self._cgroups = self._home = None
        if final:
            for cgroups, home in self._retired:
                sandbox_host.remove_cgroup_base(cgroups)
                if home:
                    shutil.rmtree(home, ignore_errors=True)
            self._retired = []

    def _forget(self, session: Session) -> None:
        self._sessions.discard(session)

    def close(self) -> None:
        """Stop every open session and the zygote (idempotent; a later call starts anew)."""
        with self._spare_lock:
            self._generation += 1
            self._spares.clear()
        for s in list(self._sessions):
            s._kill()
        with self._ctl_lock:
            self._stop()

    # -- sessions -------------------------------------------------------------------------
    def open_session(
        self,
        disk_mb: int = 1024,
        cwd: str | None = None,
        readonly_mb: int = 0,
        require_isolation: bool = False,
        workdir: str | Path | None = None,
        fallback_workdir: str | Path | None = None,
    ) -> Session:
        """A new :class:`Session` with a ``disk_mb`` MiB work directory.

        ``readonly_mb``: give the session two read-only directories of that size, ``/task``
        and ``/opt/querylab-lib``, filled by :meth:`Session.put_readonly` before the first cell
        (then sealed); ``cwd``: the cells' working directory (default the work directory
        ``/home/sandbox``);
        ``require_isolation``: raise :class:`SandboxUnavailable` unless the session has every
        mechanism of :data:`REQUIRED_MECHANISMS`. ``workdir``: a *legacy* session whose cells run
        in this host directory without a file-system view (unsafe; kept for callers that pass
        host paths to their code). ``fallback_workdir``: when this machine cannot build the
        sealed view and isolation is not required, open a legacy session on this host
        directory instead (logged once; the session's ``mechanisms`` say what it lacks).
        Raises SandboxError when the sandbox cannot start.
        """
        try:
            return self._open(disk_mb, cwd, readonly_mb, require_isolation, workdir)
        except SandboxError as exc:
            if workdir is not None or require_isolation or fallback_workdir is None:
                raise
            if not self._warned:
                self._warned = True
                log.warning("execute_python runs WITHOUT a sealed file-system view: %s", exc)
            return self._open(disk_mb, cwd, readonly_mb, False, fallback_workdir)

    def _open(self, disk_mb, cwd, readonly_mb, require_isolation, workdir) -> Session:
        if workdir is None and self.isolate and not readonly_mb and cwd is None and self.spares:
            session = self._take_spare(int(disk_mb)) or self._open_new(disk_mb, None, 0, None)
            session._pool_key = int(disk_mb)
            self._refill(int(disk_mb))
        else:
            session = self._open_new(disk_mb, cwd, readonly_mb, workdir)
        if require_isolation and not session.isolated:
            missing = [m for m in REQUIRED_MECHANISMS if not session.mechanisms.get(m)]
            notes = "; ".join(f"{k}: {v}" for k, v in session.notes.items())
            session.close()
            raise SandboxUnavailable(missing, notes)
        return session

    # -- the warm pool: trial sessions set up ahead or recycled, so opening one is a ------
    # -- hand-over (no fork, no namespace or cgroup set-up on the trial's path) ------------
    def _take_spare(self, disk_mb: int) -> Session | None:
        while True:
            with self._spare_lock:
                spares = self._spares.get(disk_mb, [])
                if not spares:
                    return None
                s = spares.pop()  # the last returned: a recycled one when there is
            if s._recycling and not s._await_recycled(30.0):
                continue
            if s.alive and not select.select([s._pidfd], [], [], 0)[0]:
                return s
            s._kill()

    def _give_back(self, session: Session) -> bool:
        """Recycle a closed trial session into the pool when it has room (the session does the
        work in the background; the next :meth:`_take_spare` waits for it). False: no room."""
        key = session._pool_key
        with self._spare_lock:
            if len(self._spares.get(key, [])) >= self.spares:
                return False
            generation = self._generation
        try:
            with session._lock:
                if session._closed:
                    return True
                send_msg(session._sock, {"op": "recycle"})
            successor = session._successor()
        except (OSError, SandboxError):
            session._kill()
            return True
        successor._recycling = True
        with self._spare_lock:
            if generation == self._generation:
                self._spares.setdefault(key, []).append(successor)
                return True
        successor._kill()
        return True

    def _refill(self, disk_mb: int) -> None:
        """Prepare a new session in the background when none is ready (closed sessions come
        back recycled, up to ``spares``: in a steady state no new session is forked)."""
        with self._spare_lock:
            if disk_mb in self._refilling or self._spares.get(disk_mb):
                return
            self._refilling.add(disk_mb)
            generation = self._generation

        def work() -> None:
            try:
                s = self._open_new(disk_mb, None, 0, None, generation)
            except SandboxError:
                s = None
            with self._spare_lock:
                self._refilling.discard(disk_mb)
                if s is not None and generation == self._generation:
                    self._spares.setdefault(disk_mb, []).append(s)
                    s = None
            if s is not None:
                s._kill()

        threading.Thread(target=work, name="sandbox-spare", daemon=True).start()

    def reserve(self, n: int, disk_mb: int = 1024) -> None:
        """Keep up to ``n`` (at most :data:`MAX_SPARES`) trial sessions of ``disk_mb`` MiB ready:
        raises :attr:`spares` to ``n`` and fills the warm pool to it in the background
        (:data:`RESERVE_WORKERS` threads: the zygote serialises the forks, the sessions' own
        set-up — namespaces, mounts, cgroups — runs side by side), so a stage starting ``n``
        concurrent trials hands every trial a session set up while its first model calls were
        waiting (on the trials' path the forks would queue). Closed sessions are recycled into
        the pool up to ``spares``, so the pool stays bounded by the largest ``n`` asked for.
        Does nothing for a sandbox without isolation (legacy sessions are not pooled) or ``n``
        < 1; a session that fails to open ends the filling (the trial's own open reports the
        error)."""
        n = min(int(n), MAX_SPARES)
        if n < 1 or not self.isolate:
            return
        key = int(disk_mb)
        with self._spare_lock:
            self.spares = max(self.spares, n)
            generation = self._generation
            fill = self._reserving.get(key)
            if fill is not None and fill["generation"] == generation:
                fill["want"] = max(fill["want"], n)
                return
            workers = max(1, min(RESERVE_WORKERS, n))
            fill = {"want": n, "generation": generation, "opening": 0, "workers": workers}
            self._reserving[key] = fill

        def leave() -> None:  # with _spare_lock held: this worker ends
            fill["workers"] -= 1
            if fill["workers"] == 0 and self._reserving.get(key) is fill:
                del self._reserving[key]

        def work() -> None:
            while True:
                with self._spare_lock:
                    if (generation != self._generation or
                            len(self._spares.get(key, [])) + fill["opening"] >= fill["want"]):
                        leave()
                        return
                    fill["opening"] += 1
                try:
                    s = self._open_new(key, None, 0, None, generation)
                except SandboxError:
                    with self._spare_lock:
                        fill["opening"] -= 1
                        fill["want"] = 0  # the other workers stop too
                        leave()
                    return
                with self._spare_lock:
                    fill["opening"] -= 1
                    if generation == self._generation:
                        self._spares.setdefault(key, []).append(s)
                        continue
                s._kill()

        for _ in range(workers):
            threading.Thread(target=work, name="sandbox-reserve", daemon=True).start()

    def _open_new(self, disk_mb, cwd, readonly_mb, workdir, generation=None) -> Session:
        spec = {"disk_mb": int(disk_mb), "cpus": self.cpus, "cwd": cwd,
                "ro_mb": int(readonly_mb)}
        legacy_tmp = None
        if workdir is not None or not self.isolate:
            if workdir is None:
                workdir = legacy_tmp = tempfile.mkdtemp(prefix="querylab-legacy-")
            wd = Path(workdir)
            wd.mkdir(parents=True, exist_ok=True)
            spec.update({"isolate": False, "workdir": str(wd.resolve())})
        elif self._home is not None and self._view_error:
            raise SandboxUnavailable(["filesystem_view"], self._view_error)
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with self._ctl_lock:
                if generation is not None and generation != self._generation:
                    raise SandboxError("the sandbox was closed")  # a late spare: not wanted
                for attempt in (1, 2):
                    if self._proc is None or self._proc.poll() is not None:
                        self._stop(final=False)
                        self._start()
                        if self._view_error and spec.get("isolate", True):
                            raise SandboxUnavailable(["filesystem_view"], self._view_error)
                    sid = next(self._sids)
                    assert self._ctl is not None
                    try:
                        socket.send_fds(self._ctl, [json.dumps({"op": "open", "spec": {
                            **spec, "sid": sid}}).encode()], [child.fileno()])
                        msg, fds, _, _ = socket.recv_fds(self._ctl, 1 << 16, 2)
                    except OSError:
                        if attempt == 2:
                            raise SandboxError("the execute_python sandbox died") from None
                        self._stop(final=False)
                        continue
                    break
        finally:
            child.close()
        reply = json.loads(msg or b"{}")
        if "pid" not in reply or len(fds) != 1:
            for fd in fds:
                os.close(fd)
            parent.close()
            raise SandboxError(f"the sandbox could not open a session: {reply.get('error')}")
        session = Session(self, parent, fds[0], reply["pid"], sid)
        session._legacy_tmp = legacy_tmp
        session.disk_mb = None if spec.get("isolate") is False else int(disk_mb)
        self._sessions.add(session)
        session._hello(30.0)
        return session

    # -- detection ------------------------------------------------------------------------
    def isolation(self) -> Isolation:
        """Which mechanisms this machine provides, measured once (cached): a probe session
        reports what it set up and a probe cell checks its uid, capabilities, no_new_privs,
        seccomp mode, PID namespace and network from the inside."""
        with self._probe_lock:
            if self._isolation is None:
                self._isolation = self._probe()
            return self._isolation

    def _probe(self) -> Isolation:
        try:
            session = self._open_new(16, None, 0, None)
        except SandboxError as exc:
            return Isolation({}, {"error": str(exc)})
        mech, notes = dict(session.mechanisms), dict(session.notes)
        try:
            res = session.run(_PROBE, name="probe", timeout_s=30, cpu_s=10)
        except SandboxError as exc:
            res = None
            notes["error"] = str(exc)
        finally:
            session.close()
        if res is None or not res.ok:
            if res is not None:
                notes["error"] = f"the probe cell failed: {res.error}"
            for k in ("unprivileged_uid", "capabilities_dropped", "no_new_privs", "seccomp",
                      "pid_namespace", "network_namespace"):
                mech[k] = False
            return Isolation(mech, notes)
        seen = json.loads(res.stdout)
        checks = {
            "unprivileged_uid": seen["uid"] != 0 and seen["euid"] != 0,
            "capabilities_dropped": seen["caps"] == 0,
            "no_new_privs": seen["no_new_privs"] == 1,
            "seccomp": seen["seccomp"] == 2,
            "pid_namespace": seen["others"] == [],
            "network_namespace": seen["net"] != "connected",
        }
        for k, ok in checks.items():
            if mech.get(k) and not ok:
                notes[k] = f"announced but not seen from inside the cell: {seen}"
            mech[k] = bool(mech.get(k)) and ok
        if self._view_error:
            mech["filesystem_view"] = False
            notes["filesystem_view"] = self._view_error
        for ctl in ("memory", "pids", "cpu"):  # say why, per missing limit
            if not mech.get(f"cgroup_{ctl}") and f"cgroup_{ctl}" not in notes:
                notes[f"cgroup_{ctl}"] = notes.get("cgroups") or sandbox_host.cgroup_reason(ctl)
        return Isolation(mech, notes)

    def require_isolation(self) -> Isolation:
        """:meth:`isolation`, raising :class:`SandboxUnavailable` when a required mechanism is
        missing."""
        iso = self.isolation()
        if not iso.ok:
            raise iso.error()
        return iso

    @property
    def isolated(self) -> bool:
        """True when this machine provides every required mechanism (see :meth:`isolation`)."""
        return self.isolation().ok

    # -- one-shot cells -------------------------------------------------------------------
    def run(self, code: str, workdir: str | Path | None = None, name: str = "cell",
            **limits) -> CellResult:
        """Run one cell in a session of its own (opened and closed around it).

        Without ``workdir`` the session is a sealed one (its work directory disappears with
        it). With ``workdir`` it is a *legacy* session on that host directory: the cell runs
        there (``.cells/<name>.*`` are left in it) with the namespaces, cgroups and rlimits
        but without a file-system view or uid change — for callers whose code names host
        paths (``tasks.datasets.dab_import`` until it uses :func:`run_in_folder`). ``limits``: see
        :meth:`Session.run`."""
        with self.open_session(workdir=workdir) as session:
            return session.run(code, name=name, **limits)


_PROBE = r"""
import json, os, socket
st = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
caps = sum(int(st[k].strip(), 16) for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"))
try:
    socket.create_connection(("127.0.0.1", 9), timeout=1).close()
    net = "connected"
except OSError as exc:
    net = exc.errno
print(json.dumps({"uid": os.getuid(), "euid": os.geteuid(), "caps": caps,
                  "no_new_privs": int(st.get("NoNewPrivs", "0")),
                  "seccomp": int(st.get("Seccomp", "0")),
                  "others": [int(p) for p in os.listdir("/proc")
                             if p.isdigit() and int(p) not in (1, os.getpid())],
                  "net": net}))
"""


#: Most trial sessions :meth:`Sandbox.reserve` keeps ready (bounds the warm pool's memory: a
#: session forked from the zygote adds ~2 MB of PSS). As many as ``--max-trials`` 128 (the
#: default of ``--max-concurrency`` 64) trials open at once, so a stage that wide finds a session
#: ready for each and every closed one is recycled, not torn down and forked again.
MAX_SPARES = 128
#: Threads :meth:`Sandbox.reserve` opens sessions with (their set-up overlaps; forks do not).
RESERVE_WORKERS = 2

_SHARED: Sandbox | None = None
_SHARED_PID = 0
_SHARED_LOCK = threading.Lock()


def shared_sandbox() -> Sandbox:
    """This process's :class:`Sandbox` (created on first use, closed at exit): every trial's
    session comes from its one zygote."""
    global _SHARED, _SHARED_PID
    with _SHARED_LOCK:
        if _SHARED is None or _SHARED_PID != os.getpid():
            _SHARED, _SHARED_PID = Sandbox(), os.getpid()
            from tasks.core import interrupt

            # Ctrl-C / SIGTERM: every session (and its cells) is killed at once, so no cell
            # delays the stop or outlives querylab
            interrupt.on_request(_close_all)
        return _SHARED


#: Former name of :func:`shared_sandbox` (one zygote per thread before sessions existed).
thread_sandbox = shared_sandbox


def detect_isolation() -> Isolation:
    """:meth:`Sandbox.isolation` of :func:`shared_sandbox`: what this machine provides."""
    return shared_sandbox().isolation()


@atexit.register
def _close_all() -> None:
    global _SHARED
    with _SHARED_LOCK:
        if _SHARED is not None and _SHARED_PID == os.getpid():
            _SHARED.close()
        _SHARED = None


# -- a folder's script in a sandbox of its own (DAB validate.py) ---------------------------------


def _folder_files(folder: Path) -> list[tuple[str, Path]]:
    """(relative path, file) for every regular file under ``folder`` (symlinks skipped: they
    could point anywhere on the host)."""
    out = []
    for root, dirs, files in os.walk(folder, followlinks=False):
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(root, d))]
        for f in files:
            p = Path(root, f)
            if stat.S_ISREG(p.lstat().st_mode):
                out.append((p.relative_to(folder).as_posix(), p))
    return sorted(out)


def run_in_folder(
    folder: str | Path,
    code: str,
    files: dict[str, bytes] | None = None,
    libraries: list[str | Path] | tuple = (),
    timeout_s: float = 30.0,
    memory_mb: int = 1024,
    cpu_s: int | None = None,
    disk_mb: int = 64,
    max_folder_mb: int = 64,
    name: str = "script",
    sandbox: Sandbox | None = None,
    require_isolation: bool = False,
) -> tuple[CellResult, dict[str, bytes]]:
    """Run ``code`` in a sealed session of its own that sees a read-only copy of ``folder``
    at ``/task`` (its working directory, so ``Path(__file__).parent`` of a script loaded from
    there is ``/task``), of each of ``libraries`` (host directories of Python packages, e.g. a
    DAB checkout's ``common_scaffold``) under ``/opt/querylab-lib/<name>``, and a ``disk_mb``
    MiB scratch work directory ``/home/sandbox`` (``HOME``, ``/tmp``) holding ``files``
    (relative path → bytes). Nothing else of the host is visible. Only regular files are
    copied (symlinks are skipped), at most ``max_folder_mb`` MiB in all. Limits:
    ``timeout_s`` wall seconds, ``memory_mb`` MiB, ``cpu_s`` CPU seconds (default the timeout
    + 1).

    Returns ``(result, outputs)``: the :class:`CellResult` and the work-directory files named
    in ``files`` with a ``.out`` suffix added (read back when they exist; e.g. a verdict file
    the code wrote). Raises SandboxError when the sandbox cannot start or the folder is over
    ``max_folder_mb``, SandboxUnavailable with ``require_isolation`` on a machine that cannot
    isolate, NotADirectoryError for a ``folder`` or library that is not a directory.
    """
    folder = Path(folder).resolve()
    trees = [("task", "", folder)] + [("lib", Path(lib).resolve().name, Path(lib).resolve())
                                       for lib in libraries]
    todo = []
    for root, prefix, path in trees:
        if not path.is_dir():
            raise NotADirectoryError(f"{path}: not a directory")
        todo += [(root, f"{prefix}/{rel}" if prefix else rel, p) for rel, p in _folder_files(path)]
    total = sum(p.stat().st_size for _, _, p in todo)
    if total > max_folder_mb * _MiB:
        raise SandboxError(f"{folder}: {total / _MiB:.0f} MiB of files, more than the "
                           f"{max_folder_mb} MiB a sandboxed script may see")
    sb = sandbox or shared_sandbox()
    with sb.open_session(disk_mb=disk_mb, cwd=TASK_DIR, readonly_mb=max_folder_mb + 1,
                         require_isolation=require_isolation) as session:
        for root, rel, p in todo:
            session.put_readonly(root, rel, p.read_bytes())
        for rel, data in (files or {}).items():
            session.put_file(rel, data)
        res = session.run(code, name=name, timeout_s=timeout_s, memory_mb=memory_mb,
                          cpu_s=cpu_s or int(timeout_s) + 1)
        outputs = {}
        for rel in files or {}:
            try:
                outputs[rel + ".out"] = session.get_file(rel + ".out", 1 << 20)
            except SandboxError:
                pass
        return res, outputs


#: The cell that loads ``/task/validate.py`` and judges the answer in ``answer.txt``; its
#: verdict goes to ``answer.txt.out`` (read back by :func:`run_validator`).
_VALIDATOR = r"""
import importlib.util, json, sys
sys.path[:0] = ["/task", "/opt/querylab-lib"]
spec = importlib.util.spec_from_file_location("validate", "/task/validate.py")
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
result = module.validate(open("/home/sandbox/answer.txt", encoding="utf-8").read())
ok, reason = (tuple(result) + ("",))[:2] if isinstance(result, (tuple, list)) else (result, "")
with open("/home/sandbox/answer.txt.out", "w") as fh:
    json.dump({"ok": bool(ok), "reason": str(reason)}, fh)
"""


def run_validator(
    folder: str | Path,
    answer: str | None,
    libraries: list[str | Path] | tuple = (),
    timeout_s: float = 30.0,
    memory_mb: int = 1024,
    sandbox: Sandbox | None = None,
    require_isolation: bool = False,
) -> tuple[bool, str]:
    """Judge ``answer`` with the ``validate.py`` in ``folder`` (DAB's ``validate(llm_output)
    -> (bool, reason)``), run by :func:`run_in_folder`: the script sees only ``folder``
    (read-only, its cwd, so ``Path(__file__).parent / "ground_truth.csv"`` works), the
    ``libraries`` (importable, e.g. ``common_scaffold``) and a scratch directory, within
    ``timeout_s`` seconds and ``memory_mb`` MiB. Returns ``(ok, reason)``; a script that
    fails, hangs or gives no verdict yields ``(False, <why>)``; a None answer is wrong."""
    if answer is None:
        return False, "no answer"
    if not (Path(folder) / "validate.py").is_file():
        return False, f"{folder}: no validate.py"
    res, out = run_in_folder(folder, _VALIDATOR, {"answer.txt": answer.encode("utf-8")},
                             libraries=libraries, timeout_s=timeout_s, memory_mb=memory_mb,
                             name="validate", sandbox=sandbox, require_isolation=require_isolation)
    if res.timed_out:
        return False, f"validate.py timed out after {timeout_s:g} s"
    verdict = out.get("answer.txt.out")
    if not res.ok or not verdict:
        tail = "\n".join(res.stderr.strip().splitlines()[-5:])
        return False, f"validate.py failed ({res.error or 'no verdict'}): {tail}"
    result = json.loads(verdict)
    return bool(result["ok"]), str(result["reason"])


#: Mechanisms that only bound resources: without them a cell can use more memory, processes,
#: CPU or disk than its limits, but still sees nothing of the host.
RESOURCE_MECHANISMS = ("cgroup_memory", "cgroup_pids", "cgroup_cpu", "tmpfs_size_cap")


def missing_text(missing: list[str]) -> str:
    """What ``missing`` mechanisms (an unsafe run's) mean for its scores, in one sentence:
    resource limits only (the answer key stayed out of reach) or the isolation itself."""
    if not missing:
        return "nothing was missing"
    names = ", ".join(f"{m}: {REQUIRED_MECHANISMS[m]}" if m in REQUIRED_MECHANISMS else m
                      for m in missing)
    if all(m in RESOURCE_MECHANISMS for m in missing):
        return (f"only resource limits were missing ({names}); the file-system view, "
                "unprivileged uid and namespaces held, so the cells could not reach the answer "
                "key or the host, but a cell could use more memory, processes or CPU than its "
                "limits say")
    return (f"missing {names}: the cells may have reached the answer key or the host, so the "
            "scores are not sealed")


def sandbox_notes(artifacts_root: str, run_id: str) -> list[str]:
    """Report lines for a run whose LLM agents ran with ``--unsafe-sandbox`` (read from
    ``runs/<run_id>/trials/agents.json``, written by :func:`tasks.trials.stage.describe_agents`);
    empty otherwise."""
    from tasks.core import storage

    uri = RunLayout(artifacts_root, run_id).trials("agents.json")
    if not storage.exists(uri):
        return []
    notes = []
    for d in storage.read_json(uri):
        sb = d.get("sandbox") or {}
        if not sb.get("unsafe_sandbox"):
            continue
        if sb.get("missing"):
            how = ("its `execute_python` cells ran WITHOUT full isolation: "
                   + missing_text(sb["missing"]))
        else:
            how = "this machine still isolated its `execute_python` cells (nothing was missing)"
        notes.append(f"UNSAFE SANDBOX: `{d['agent']}` ran with --unsafe-sandbox; {how}.")
    return notes


if __name__ == "__main__":  # python -m tasks.sandbox.session: what this machine provides
    print(json.dumps(detect_isolation().describe(), indent=2))
