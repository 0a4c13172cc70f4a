"""The :class:`Sandbox`: one zygote process per sandbox (started from
:func:`tasks.sandbox.zygote.source`), the sessions it forks and their warm pool (spares set up
ahead or recycled; :meth:`Sandbox.reserve`), the isolation probe (:meth:`Sandbox.isolation`),
and this process's shared sandbox (:func:`shared_sandbox`, :data:`MAX_SPARES`). See
:mod:`tasks.sandbox.session`.
"""

from __future__ import annotations

import atexit
import itertools
import json
import logging
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import weakref
from pathlib import Path

from tasks.sandbox import host as sandbox_host
from tasks.sandbox import zygote
from tasks.sandbox.isolation import (DEFAULT_PRELOAD, REQUIRED_MECHANISMS, SANDBOX_GID,
                                     SANDBOX_HOME, SANDBOX_UID, Isolation, SandboxError,
                                     SandboxUnavailable, sandbox_env)
from tasks.sandbox.session_client import CellResult, Session
from tasks.sandbox.zygote import send_msg

#: The module's name before the split (log configuration and records keep naming it).
log = logging.getLogger("tasks.sandbox.session")


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
