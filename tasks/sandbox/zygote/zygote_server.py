"""The zygote process: enters a user namespace when not root, imports the preload modules once,
drops querylab's import hooks, opens the cgroup base directories, builds the template mount
namespace (the cells' read-only root) and serves the control socket, forking one session per
``open`` request into a new PID namespace. It never runs agent code. Its :func:`main` is the
program's entry point (the last part of the joined source).

Part of the zygote program (see :mod:`tasks.sandbox.zygote`): standard library only.
"""

from __future__ import annotations

import gc
import json
import os
import select
import socket
import sys

from .files import _NOFOLLOW_DIR, OUT_DIR
from .kernel import (_ARCH, CLONE_NEWNS, CLONE_NEWPID, CLONE_NEWUSER, MNT_DETACH, MS_BIND,
                     MS_NODEV, MS_NOEXEC, MS_NOSUID, MS_PRIVATE, MS_RDONLY, MS_REC, MS_REMOUNT,
                     PR_SET_DUMPABLE, _bind, _libc, _mkdirs, _seccomp_fprog, mount, pivot_root,
                     prctl, setns, umount2, unshare)
from .session_server import _session_main
from .state import _LIB_DIR, _SCRATCH, _STATE, _TASK_DIR, CONFIG


def _enter_userns() -> bool:
    """Unprivileged: a new user namespace where the sandbox uid maps to ours (full
    capabilities inside it, none outside). Must run while the process is single-threaded."""
    uid, gid = os.getuid(), os.getgid()
    if _libc.unshare(CLONE_NEWUSER) != 0:
        return False
    su, sg = CONFIG["uid"], CONFIG["gid"]
    for path, text in (("/proc/self/setgroups", "deny"), ("/proc/self/uid_map", f"{su} {uid} 1"),
                       ("/proc/self/gid_map", f"{sg} {gid} 1")):
        with open(path, "w") as fh:
            fh.write(text)
    return True


def _clean_imports() -> None:
    """Drop import paths and hooks that lead outside the cell's file system view (the
    editable install's finder pointing into the repository)."""
    keep = CONFIG["view"]["visible"]

    def visible(p: str) -> bool:
        return any(p == v or p.startswith(v.rstrip("/") + "/") for v in keep)

    sys.path[:] = [p for p in sys.path if p and visible(p)]
    sys.meta_path[:] = [f for f in sys.meta_path
                        if "__editable__" not in getattr(f, "__module__", "")]
    sys.path_hooks[:] = [h for h in sys.path_hooks
                         if "__editable__" not in getattr(h, "__module__", "")]
    for name in [m for m in sys.modules if m.startswith("__editable__")]:
        del sys.modules[name]
    sys.path_importer_cache.clear()


def _build_template() -> None:
    """In a fresh mount namespace (this process is a fork of the zygote, PID 1 of a new PID
    namespace): the cells' read-only root file system on a tmpfs, then ``pivot_root`` into
    it and detach the host's tree. Every session starts from a copy of this namespace."""
    view, home = CONFIG["view"], CONFIG["home"]
    new = CONFIG["staging"]
    unshare(CLONE_NEWNS)
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    mount("tmpfs", new, "tmpfs", MS_NOSUID | MS_NODEV, "size=8m,nr_inodes=8192,mode=755")
    ro = MS_RDONLY | MS_NOSUID | MS_NODEV
    for src, dst in view["ro"]:
        target = new + dst
        if os.path.isdir(src):
            _mkdirs(target)
        else:
            _mkdirs(os.path.dirname(target))
            open(target, "a").close()
        _bind(src, target, ro)
    for path, target in view["symlinks"]:
        _mkdirs(os.path.dirname(new + path))
        os.symlink(target, new + path)
    for path, text in view["files"].items():
        _mkdirs(os.path.dirname(new + path))
        with open(new + path, "w") as fh:
            fh.write(text)
    empty_dir, empty_file = new + "/.empty", new + "/.empty-file"
    os.mkdir(empty_dir, 0o555)
    open(empty_file, "w").close()
    for path in view["hide"]:
        target = new + path
        if os.path.islink(target) or not os.path.exists(target):
            continue
        _bind(empty_dir if os.path.isdir(target) else empty_file, target, ro)
    _mkdirs(new + "/dev")
    for name in view["dev"]:
        open(new + "/dev/" + name, "w").close()
        _bind("/dev/" + name, new + "/dev/" + name, MS_NOSUID | MS_NOEXEC)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                         ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
        os.symlink(target, f"{new}/dev/{name}")
    for d in (home, "/tmp", "/dev/shm", OUT_DIR, _TASK_DIR, _LIB_DIR, "/proc"):
        _mkdirs(new + d)
    os.mkdir(new + _SCRATCH, 0o700)
    # a proc of this (empty) PID namespace: lets sessions in a user namespace mount their own
    mount("proc", new + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    old = new + "/.oldroot"
    os.mkdir(old)
    pivot_root(new, old)
    os.chdir("/")
    umount2("/.oldroot", MNT_DETACH)
    os.rmdir("/.oldroot")
    mount(None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _make_template(own_pidns: int) -> tuple[int | None, str | None]:
    """The template mount namespace as a descriptor (kept open: it outlives its builder), or
    (None, why not)."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    new_pidns = _libc.unshare(CLONE_NEWPID) == 0
    pid = _fork_into(new_pidns, own_pidns)
    if pid == 0:
        a.close()
        try:
            _build_template()
            fd = os.open("/proc/self/ns/mnt", os.O_RDONLY)
            socket.send_fds(b, [b"ok"], [fd])
        except BaseException as exc:
            b.send(f"{type(exc).__name__}: {exc}".encode()[:2000])
        os._exit(0)
    b.close()
    try:
        msg, fds, _, _ = socket.recv_fds(a, 4096, 1)
    except OSError as exc:
        msg, fds = str(exc).encode(), []
    a.close()
    os.waitpid(pid, 0)
    if msg == b"ok" and len(fds) == 1:
        return fds[0], None
    for fd in fds:
        os.close(fd)
    return None, msg.decode(errors="replace") or "the view builder died"


def main() -> None:
    CONFIG.update(json.loads(sys.argv[1]))
    ctl = socket.socket(fileno=CONFIG["control_fd"])
    userns = False
    if CONFIG.get("userns") and os.geteuid() != 0:
        userns = _enter_userns()  # before any import can start a thread
        if userns and _libc.unshare(CLONE_NEWPID) == 0:
            # become PID 1 of a PID namespace of our user namespace (setns back into the
            # host's, after forking a session, would need privileges we do not have there)
            child = os.fork()
            if child:
                ctl.close()
                _, status = os.waitpid(child, 0)
                os._exit(os.waitstatus_to_exitcode(status) & 0xFF)
    _STATE["userns"] = userns
    for m in CONFIG["preload"]:
        try:
            __import__(m)
        except Exception:
            pass
    _clean_imports()
    _STATE["base_fds"] = {}
    for ctl_name, path in (CONFIG.get("cgroups") or {}).get("dirs", {}).items():
        try:
            _STATE["base_fds"][ctl_name] = os.open(path, _NOFOLLOW_DIR)
        except OSError:
            pass
    try:
        with open("/proc/sys/kernel/cap_last_cap") as fh:
            _STATE["cap_last"] = int(fh.read())
    except OSError:
        _STATE["cap_last"] = 40
    own_pidns = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    template, why = _make_template(own_pidns) if CONFIG.get("isolate", True) else (
        None, "isolation off")
    _STATE["template"], _STATE["template_error"] = template, why
    prctl(PR_SET_DUMPABLE, 0)
    if _ARCH == "x86_64":
        _seccomp_fprog()  # built once, before the freeze
    gc.collect()
    gc.freeze()  # preloaded objects stay out of the children's collections: fewer CoW faults
    ctl.send(json.dumps({"ready": True, "userns": userns, "euid": os.geteuid(),
                         "pid": os.getpid(), "view_error": why}).encode())
    sessions: dict[int, int] = {}  # pid -> sid, to remove the cgroups of ended sessions
    while True:
        ready, _, _ = select.select([ctl], [], [], 0.2)
        _reap(sessions)
        if not ready:
            continue
        try:
            msg, fds, _, _ = socket.recv_fds(ctl, 1 << 20, 4)
        except OSError:
            break
        if not msg:
            break
        req = json.loads(msg)
        if req.get("op") != "open" or len(fds) != 1:
            for fd in fds:
                os.close(fd)
            ctl.send(json.dumps({"error": "bad request"}).encode())
            continue
        in_pidns = req["spec"].get("pid_namespace", True) and _libc.unshare(CLONE_NEWPID) == 0
        try:
            pid = _fork_into(in_pidns, own_pidns)
        except OSError as exc:
            os.close(fds[0])
            ctl.send(json.dumps({"error": f"cannot fork a session: {exc}"}).encode())
            continue
        if pid == 0:
            code = 1
            try:
                ctl.close()
                os.close(own_pidns)
                code = _session_main(fds[0], req["spec"], in_pidns)
            finally:
                os._exit(code)
        sessions[pid] = int(req["spec"]["sid"])
        os.close(fds[0])
        pidfd = os.pidfd_open(pid)
        try:
            socket.send_fds(ctl, [json.dumps({"pid": pid}).encode()], [pidfd])
        finally:
            os.close(pidfd)


def _fork_into(new_pidns: bool, own_pidns: int) -> int:
    """fork(); after ``unshare(CLONE_NEWPID)`` the child is PID 1 of a new PID namespace and the
    parent goes back to creating children in its own (``setns``)."""
    try:
        pid = os.fork()
    except OSError:
        if new_pidns:
            setns(own_pidns, CLONE_NEWPID)
        raise
    if pid != 0 and new_pidns:
        setns(own_pidns, CLONE_NEWPID)
    return pid


def _reap(sessions: dict[int, int] | None = None) -> None:
    """Reap ended children; for a session, remove its (now empty) cgroups."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        sid = (sessions or {}).pop(pid, None)
        if sid is not None:
            for bfd in _STATE["base_fds"].values():
                try:
                    os.rmdir(f"s{sid}", dir_fd=bfd)
                except OSError:
                    pass


if __name__ == "__main__":
    main()
