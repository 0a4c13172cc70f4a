"""A session: PID 1 of the trial's PID namespace, in the trial's cgroups. It takes a private copy
of the template view, mounts the trial's file systems on it, moves into the trial's cgroups,
serves the harness's requests (files, ``run``, ``recycle``, ``close``) and runs each cell under
its wall-clock and CPU limits, killing what the cell left after it.

Part of the zygote program (see :mod:`tasks.sandbox.zygote`): standard library only.
"""

from __future__ import annotations

import errno
import os
import select
import signal
import socket
import time
import traceback

from .audit_hook import _read_audit
from .cell import _cell_main
from .cgroups import _Cgroups, _write
from .files import OUT_DIR, _Files, _wipe
from .framing import recv_msg, send_msg
from .kernel import (_ARCH, _SYSCALLS, CLONE_NEWIPC, CLONE_NEWNET, CLONE_NEWNS, CLONE_NEWUTS,
                     MNT_DETACH, MS_NODEV, MS_NOEXEC, MS_NOSUID, MS_PRIVATE, MS_RDONLY, MS_REC,
                     MS_REMOUNT, PR_SET_DUMPABLE, _bind, _libc, _mkdirs, mount, prctl, setns,
                     umount2, unshare)
from .state import _LIB_DIR, _SCRATCH, _STATE, _TASK_DIR, CONFIG


#: Memory the session process may use on top of the cells' limit between cells (file
#: transfers): its cells' limit is set back before each cell.
_SESSION_MARGIN = 64 << 20


class _Session:
    """Serves one trial (see the module docstring): takes a private copy of the template
    view, mounts the trial's file systems on it, moves into the trial's cgroups and forks
    the cells."""

    def __init__(self, sock: socket.socket, spec: dict, in_pidns: bool):
        self.sock, self.spec = sock, spec
        self.mech: dict[str, bool] = {}
        self.notes: dict[str, str] = {}
        self.in_pidns = in_pidns
        self.cg: _Cgroups | None = None
        self.uid, self.gid = CONFIG["uid"], CONFIG["gid"]
        self.home = CONFIG["home"]
        self.isolated = False
        self.drop_uid = False
        self.owner: tuple[int, int] | None = None
        self.last_out: str | None = None
        self.sealed = True
        self.ro_files: _Files | None = None

    # -- set-up ---------------------------------------------------------------------------
    def setup(self) -> None:
        spec = self.spec
        for flag, name in ((CLONE_NEWNET, "network_namespace"), (CLONE_NEWIPC, "ipc_namespace"),
                           (CLONE_NEWUTS, "uts_namespace")):
            self.mech[name] = _libc.unshare(flag) == 0
        if self.mech["uts_namespace"]:
            _libc.sethostname(b"sandbox", 7)
        root = os.geteuid() == 0 and not _STATE["userns"]
        self.owner = (self.uid, self.gid) if root else None
        self.out_max = 2 * int(spec.get("max_file_mb", 256)) * (1 << 20) + (1 << 20)
        if spec.get("isolate", True):
            if _STATE["template"] is None:
                raise OSError(errno.EPERM, f"no file-system view: {_STATE['template_error']}")
            self._enter_view()
            self.isolated, self.drop_uid = True, root
            self.out_dir = OUT_DIR
            self.cwd = spec.get("cwd") or self.home
        else:
            if _STATE["template"] is not None:
                os.close(_STATE["template"])
            self.owner = None  # the cell keeps querylab's uid here (host paths stay readable)
            self.home = self.cwd = spec["workdir"]
            self.out_dir = os.path.join(self.home, ".cells")
            os.makedirs(self.out_dir, exist_ok=True)
            self.mech["filesystem_view"] = self.mech["tmpfs_size_cap"] = False
            self.notes["filesystem_view"] = "legacy session on a host directory"
            try:  # best effort: a /proc of the trial's PID namespace
                unshare(CLONE_NEWNS)
                mount(None, "/", None, MS_REC | MS_PRIVATE)
                if self.in_pidns:
                    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
            except OSError as exc:
                self.notes["pid_namespace"] = f"no /proc of its own: {exc}"
        self.files = _Files(self.home, self.owner)
        # the cells' environment, set once here (inherited by every fork)
        os.environ.update({"HOME": self.home, "USER": "sandbox", "LOGNAME": "sandbox",
                           "PWD": self.cwd, "TMPDIR": "/tmp" if self.isolated else os.path.join(
                               self.home, "tmp")})
        self.mech["pid_namespace"] = self.in_pidns and os.getpid() == 1 and (
            "pid_namespace" not in self.notes)
        self.mech["unprivileged_uid"] = self.drop_uid or not root
        self.mech["capabilities_dropped"] = self.mech["no_new_privs"] = _SYSCALLS is not None
        self.mech["seccomp"] = _ARCH == "x86_64"
        cg = CONFIG.get("cgroups")
        if cg and _STATE["base_fds"]:
            try:
                self.cg = _Cgroups(cg["version"], _STATE["base_fds"], f"s{spec['sid']}",
                                   float(spec.get("cpus", 1.0)))
                # the session lives in the trial's cgroups: cells are born there (moving a
                # process between cgroups waits for an RCU grace period; once per trial)
                self.cg.relax(_SESSION_MARGIN)
                for fd in self.cg.join_fds:
                    _write(fd, "cgroup.procs", 0)
            except OSError as exc:
                self.cg = None
                self.notes["cgroups"] = str(exc)
        for fd in _STATE["base_fds"].values():
            os.close(fd)
        _STATE["base_fds"] = {}
        have = self.cg.have if self.cg else {}
        for k in ("memory", "pids", "cpu"):
            self.mech[f"cgroup_{k}"] = bool(have.get(k))
        self.oom_protected = False
        try:  # the OOM killer takes a cell first (needs CAP_SYS_RESOURCE); cells reset to 0
            with open("/proc/self/oom_score_adj", "w") as fh:
                fh.write("-500")
            self.oom_protected = True
        except OSError:
            pass
        prctl(PR_SET_DUMPABLE, 0)  # cells (same uid in a user namespace) cannot ptrace us

    def _enter_view(self) -> None:
        """A private copy of the template namespace, then the trial's own file systems: the
        size-capped work directory (also /tmp and /dev/shm), the cells' output directory,
        the read-only directories of :func:`tasks.sandbox.session.run_in_folder` and ``/proc``."""
        setns(_STATE["template"], CLONE_NEWNS)  # root and cwd: the template's root
        unshare(CLONE_NEWNS)
        os.close(_STATE["template"])
        self.mech["filesystem_view"] = True
        self._mount_scratch()
        self.mech["tmpfs_size_cap"] = True
        ro_mb = int(self.spec.get("ro_mb", 0))
        if ro_mb:  # filled through put_ro, then sealed read-only
            for d in (_TASK_DIR, _LIB_DIR):
                mount("tmpfs", d, "tmpfs", MS_NOSUID | MS_NODEV,
                      f"size={ro_mb}m,nr_inodes=4096,mode=755")
            self.sealed = False
        if self.in_pidns:
            mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)

    #: Where the scratch tmpfs is bound: (subdirectory, mount point, mode).
    _SCRATCH_DIRS = (("home", None, 0o700), ("tmp", "/tmp", 0o1777), ("shm", "/dev/shm", 0o1777))

    def _mount_scratch(self) -> None:
        """Mount the trial's fresh file systems: the size-capped tmpfs bound at the work
        directory, /tmp and /dev/shm, and the cells' output tmpfs."""
        disk = int(self.spec.get("disk_mb", 1024))
        inodes = int(self.spec.get("inodes", 65536))
        mount("tmpfs", _SCRATCH, "tmpfs", MS_NOSUID | MS_NODEV,
              f"size={disk}m,nr_inodes={inodes},mode=700")
        for sub, dst, mode in self._SCRATCH_DIRS:
            os.mkdir(f"{_SCRATCH}/{sub}", mode)
            os.chmod(f"{_SCRATCH}/{sub}", mode)
            if self.owner:
                os.chown(f"{_SCRATCH}/{sub}", *self.owner)
            _bind(f"{_SCRATCH}/{sub}", dst or self.home, MS_NOSUID | MS_NODEV)
        self._scratch_links()
        owner = f",uid={self.uid},gid={self.gid}" if self.owner else ""
        mount("tmpfs", OUT_DIR, "tmpfs", MS_NOSUID | MS_NODEV,
              f"size={self.out_max},nr_inodes=1024,mode=700{owner}")

    def _scratch_links(self) -> None:
        """The symlinks on the scratch file systems that lead view paths under /tmp, /dev/shm
        or the work directory to where the template bound them (root-owned directories: a
        cell of another uid cannot replace them)."""
        for path, target in CONFIG["view"].get("scratch_links", []):
            _mkdirs(os.path.dirname(path))
            os.symlink(target, path)

    def recycle(self) -> None:
        """Make this session as good as new for another trial (a warm spare): every process
        of its PID namespace gone, fresh work-directory, /tmp, /dev/shm and output file
        systems (the old ones are detached, with whatever the cells left), a new IPC namespace
        (SysV objects and POSIX message queues outlive processes). The network namespace has
        nothing a process without capabilities could leave in it."""
        if not self.isolated or not self.sealed or int(self.spec.get("ro_mb", 0)):
            raise ValueError("only a trial session can be recycled")
        _kill_cells(self, None)
        others = [p for p in os.listdir("/proc") if p.isdigit() and p != "1"]
        if others:
            raise OSError(errno.EBUSY, f"processes left: {others[:5]}")
        # emptied in place (unmounting would wait for RCU grace periods on the next trial's
        # path); the roots' mode, owner, extended attributes and times are reset too, so
        # nothing of the previous trial is left to read
        for _, dst, mode in self._SCRATCH_DIRS:
            _wipe(dst or self.home, mode, self.owner)
        self._scratch_links()
        _wipe(OUT_DIR, 0o700, self.owner)
        if self.mech["ipc_namespace"]:
            unshare(CLONE_NEWIPC)
        self.last_out = None

    def _seal(self) -> None:
        if not self.sealed:
            for d in (_TASK_DIR, _LIB_DIR):
                mount(None, d, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
            self.sealed = True

    # -- serving --------------------------------------------------------------------------
    def serve(self) -> int:
        while True:
            try:
                req, payload = recv_msg(self.sock)
            except (OSError, ValueError):
                return 1
            if req is None:
                return 0
            op = req.get("op")
            try:
                if op == "close":
                    send_msg(self.sock, {"ok": True})
                    return 0
                if op == "recycle":
                    self.recycle()
                    send_msg(self.sock, {"ok": True})
                elif op == "put":
                    self.files.put(req["path"], payload)
                    send_msg(self.sock, {"ok": True})
                elif op == "put_ro":
                    if self.sealed:
                        raise ValueError("the read-only directories are sealed")
                    root = {"task": _TASK_DIR, "lib": _LIB_DIR}[req["root"]]
                    _Files(root, None).put(req["path"], payload)
                    send_msg(self.sock, {"ok": True})
                elif op == "get":
                    data, size = self.files.head(req["path"], int(req["max_bytes"]), False)
                    send_msg(self.sock, {"ok": True, "file_size": size}, data)
                elif op == "rename":
                    self.files.rename(req["src"], req["dst"])
                    send_msg(self.sock, {"ok": True})
                elif op == "save_output":
                    if self.last_out is None:
                        raise ValueError("no cell has run yet")
                    fd = _Files(self.out_dir, None)._open_regular(self.last_out)
                    try:
                        n = self.files.copy_in(req["path"], fd)
                    finally:
                        os.close(fd)
                    send_msg(self.sock, {"ok": True, "bytes": n})
                elif op == "run":
                    self._seal()
                    req["code"] = payload.decode("utf-8", "surrogatepass")
                    head, reply = self.run(req)
                    send_msg(self.sock, reply, head)
                else:
                    send_msg(self.sock, {"ok": False, "error": f"unknown op {op!r}"})
            except Exception as exc:  # noqa: BLE001 - reported; the session serves on
                try:
                    send_msg(self.sock, {"ok": False, "error": f"{type(exc).__name__}: {exc}"})
                except OSError:
                    return 1

    # -- cells ----------------------------------------------------------------------------
    def _empty_out_dir(self, name: str) -> None:
        """Remove what earlier cells left in the output directory (never following links)."""
        if not self.isolated:
            for ext in ("py", "out", "err"):
                try:
                    os.unlink(os.path.join(self.out_dir, f"{name}.{ext}"))
                except FileNotFoundError:
                    pass
            return
        try:
            _wipe(self.out_dir, 0o700, self.owner)
        except (OSError, RecursionError):  # e.g. a tree too deep to walk: a new file system
            umount2(OUT_DIR, MNT_DETACH)
            owner = f",uid={self.uid},gid={self.gid}" if self.owner else ""
            mount("tmpfs", OUT_DIR, "tmpfs", MS_NOSUID | MS_NODEV,
                  f"size={self.out_max},nr_inodes=1024,mode=700{owner}")

    def run(self, req: dict) -> tuple[bytes, dict]:
        name = req["name"]
        if not name or name.startswith(".") or len(name) > 200 or not all(
                c.isalnum() or c in "_-." for c in name):
            raise ValueError(f"bad cell name {name[:80]!r}")
        if int(req["max_file_bytes"]) * 2 + (1 << 20) > self.out_max:
            req["max_file_bytes"] = (self.out_max - (1 << 20)) // 2
        self._empty_out_dir(name)
        out = _Files(self.out_dir, self.owner)
        out.put(f"{name}.py", req["code"].encode("utf-8", "surrogatepass"))
        for ext in ("out", "err"):  # created by the session, so never a planted symlink
            out.put(f"{name}.{ext}", b"")
        self.last_out = f"{name}.out"
        try:
            reply = _run_cell(self, req)
        finally:
            if self.cg is not None:
                self.cg.relax(_SESSION_MARGIN)
        head, size = out.head(f"{name}.out", int(req["max_output_chars"]) * 4)
        err = out.tail(f"{name}.err", 8000)
        reply.update({"ok": True, "stdout_bytes": size,
                      "stderr": err.decode("utf-8", errors="replace")})
        return head, reply

    def close(self) -> None:
        _kill_cells(self, None)


def _session_main(fd: int, spec: dict, in_pidns: bool) -> int:
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    # PID 1 gets only the signals it handles: none (a cell of the same uid in a user
    # namespace could otherwise interrupt the session)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sock = socket.socket(fileno=fd)
    os.setsid()
    s = _Session(sock, spec, in_pidns)
    try:
        s.setup()
    except Exception as exc:
        traceback.print_exc()  # to the zygote's log
        try:
            send_msg(sock, {"ok": False, "error": f"sandbox set-up failed: {exc}"})
        except OSError:
            pass
        return 1
    send_msg(sock, {"ok": True, "pid": os.getpid(), "isolated": s.isolated,
                    "mechanisms": s.mech, "notes": s.notes})
    try:
        return s.serve()
    finally:
        s.close()


def _kill_cells(s: _Session, pid: int | None) -> None:
    """Kill every process the cell left: all of the trial's PID namespace (the session is its
    PID 1: kill(-1) spares it); without one, the cell's process group and its cgroups."""
    if s.mech.get("pid_namespace") and os.getpid() == 1:
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            pass
    else:
        if pid is not None:
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
        if s.cg is not None:
            s.cg.kill_all(spare=os.getpid())
    end = time.monotonic() + 5
    while time.monotonic() < end:
        try:
            done, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if done == 0:
            time.sleep(0.001)


def _run_cell(s: _Session, req: dict) -> dict:
    cg = s.cg
    if cg is not None:
        cg.prepare(int(req["memory_bytes"]), int(req["max_procs"]) + 1)  # + 1: the session
    r, w = os.pipe()
    ar, aw = os.pipe()  # the cell's run-time audit channel (its hook writes, we read)
    pid = os.fork()
    if pid == 0:
        os.close(r)
        os.close(ar)
        _cell_main(s, req, w, aw)  # never returns
    os.close(w)
    os.close(aw)
    start = time.monotonic()
    deadline = start + float(req["timeout_s"])
    cpu_limit = float(req["cpu_s"])
    have_cpu = cg is not None and cg.have["cpu"]
    cpus = float(s.spec.get("cpus", 1.0)) if have_cpu else (os.cpu_count() or 1)
    next_cpu_check = start + cpu_limit / max(cpus, 0.01) * 0.9
    timed_out = cpu_exceeded = False
    pidfd = os.pidfd_open(pid)
    status = ru = None
    try:
        while True:
            done, st, rusage = os.wait4(pid, os.WNOHANG)
            if done:
                status, ru = st, rusage
                break
            now = time.monotonic()
            if now >= deadline:
                timed_out = True
            elif have_cpu and now >= next_cpu_check:
                if (cg.cpu_s() or 0.0) >= cpu_limit:
                    cpu_exceeded = True
                next_cpu_check = now + 0.1
            if timed_out or cpu_exceeded:
                os.kill(pid, signal.SIGKILL)
                _, status, ru = os.wait4(pid, 0)
                break
            wake = min(deadline, next_cpu_check) if have_cpu else deadline
            select.select([pidfd], [], [], max(wake - time.monotonic(), 0))
    finally:
        os.close(pidfd)
    duration = time.monotonic() - start
    _kill_cells(s, pid)
    audit, audit_complete = _read_audit(ar)
    setup = b""
    while True:
        chunk = os.read(r, 65536)
        if not chunk:
            break
        setup += chunk
    os.close(r)
    stats = cg.stats() if cg is not None else {}
    setup_text = setup.decode(errors="replace")
    return {
        "exit_code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
        "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
        "timed_out": timed_out,
        "cpu_exceeded": cpu_exceeded,
        "duration_s": duration,
        "cpu_s": stats.get("cpu_s") if stats.get("cpu_s") is not None else (
            ru.ru_utime + ru.ru_stime if ru else 0.0),
        "max_rss_kb": (stats["peak_bytes"] // 1024) if "peak_bytes" in stats else (
            ru.ru_maxrss if ru else 0),
        "oom_killed": bool(stats.get("oom_killed")),
        "pids_limit_hit": bool(stats.get("pids_limit_hit")),
        "setup_error": None if setup_text.startswith("ok") else (
            setup_text.removeprefix("err:") or "the cell died during its set-up"),
        "audit": audit,
        "audit_complete": audit_complete,
    }
