"""The programs of the ``execute_python`` sandbox that run outside querylab's process.

:class:`tasks.sandbox.session.Sandbox` starts this file as ``python -I -c <this source> <config>``
with an environment stripped of secrets. Three kinds of process run its code:

**Zygote** (one per :class:`~tasks.sandbox.session.Sandbox`): enters a user namespace first when it is
not root (``config["userns"]``; then it also becomes PID 1 of a PID namespace of its own),
imports the preload modules (pandas, pyarrow) once, drops querylab's own import hooks from
``sys.path`` / ``sys.meta_path``, opens the sandbox's cgroup base directories and builds the
*template* mount namespace (:func:`_build_template`: a tmpfs root with read-only binds of the
interpreter, the venv's libraries (querylab's own entries masked) and ``/usr``, a minimal
``/etc`` and ``/dev``, empty mount points for the per-trial file systems; ``pivot_root`` into
it, the host's tree detached). Then it serves a ``SOCK_SEQPACKET`` control socket: each
``open`` request carries one end of a socket pair (``SCM_RIGHTS``); the zygote forks a
*session* into a new PID namespace (``unshare(CLONE_NEWPID)`` before the fork, ``setns`` back
after it) and returns a pidfd of it; when a session ends it removes its cgroups. It never runs
agent code.

**Session** (one per trial, PID 1 of the trial's PID namespace): takes new network, IPC and
UTS namespaces and a private copy of the template (``setns`` + ``unshare(CLONE_NEWNS)``: no
host mount is in it), mounts the trial's size-capped tmpfs (work directory ``/home/sandbox``,
``/tmp``, ``/dev/shm``), the cells' output tmpfs and its own ``/proc``, then moves itself into
the trial's cgroups (once: its cells are born there). It serves the harness over its socket:
``put`` / ``get`` / ``rename`` / ``save_output`` files of the work directory (never following a
symlink), ``put_ro`` into the read-only directories of a validator session, ``run`` a cell,
``close``.

**Cell** (one per ``execute_python`` call): forked by the session; it closes every inherited
descriptor, drops to the unprivileged sandbox uid with every capability gone (bounding set
too) and ``no_new_privs``, sets its rlimits, installs a seccomp filter (x86-64: no mount,
namespace, ptrace, bpf, keyring or module system calls), loads ``vars/var_<call_id>.json`` as
globals, installs the run-time audit hook (:func:`_install_audit_hook`: ``sys.addaudithook``,
reporting file, network and process events over a pipe the session reads) and runs the code. The session enforces the wall and CPU limits and, after the cell,
kills every other process of its PID namespace. Every mechanism the session announced is
enforced or the cell aborts before running any agent code.

Only the standard library is imported here (it also runs when querylab is not importable).
The framing helpers :func:`send_msg` / :func:`recv_msg` are shared with :mod:`tasks.sandbox.session`.

This module is exempt from the ~600-line module limit (issue 16): its source is passed whole to
``python -I -c`` and runs as one file inside the sandbox, where querylab is not importable, so it
cannot be split into modules that import each other.
"""

from __future__ import annotations

import ctypes
import errno
import gc
import io
import json
import os
import platform
import resource
import select
import signal
import socket
import stat
import struct
import sys
import time
import traceback

# --------------------------------------------------------------------------------------------
# Framing: 4-byte big-endian header length, a JSON header, then header["size"] payload bytes.
# --------------------------------------------------------------------------------------------

_LEN = struct.Struct(">I")
MAX_HEADER_BYTES = 1 << 20


def send_msg(sock: socket.socket, header: dict, payload: bytes = b"") -> None:
    """Send one message (``header`` as JSON, then ``payload``) on a stream socket."""
    header = {k: v for k, v in header.items() if k != "size"}
    if payload:
        header["size"] = len(payload)
    data = json.dumps(header).encode()
    sock.sendall(_LEN.pack(len(data)) + data)
    if payload:
        sock.sendall(payload)


def _recv_exact(sock: socket.socket, n: int, deadline: float | None) -> bytes | None:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the sandbox did not answer in time")
            sock.settimeout(left)
        k = sock.recv_into(view[got:], min(n - got, 1 << 22))
        if k == 0:
            return None
        got += k
    return bytes(buf)


def recv_msg(sock: socket.socket, deadline: float | None = None,
             max_payload: int = 1 << 40) -> tuple[dict | None, bytes]:
    """Receive one message: ``(header, payload)``; ``(None, b"")`` at end of stream.

    Raises TimeoutError past ``deadline`` (a ``time.monotonic()`` instant), ValueError for a
    header over 1 MiB or a payload over ``max_payload`` bytes.
    """
    raw = _recv_exact(sock, _LEN.size, deadline)
    if raw is None:
        return None, b""
    (n,) = _LEN.unpack(raw)
    if n > MAX_HEADER_BYTES:
        raise ValueError(f"sandbox message header of {n} bytes")
    body = _recv_exact(sock, n, deadline)
    if body is None:
        return None, b""
    header = json.loads(body)
    size = int(header.get("size", 0))
    if size > max_payload:
        raise ValueError(f"sandbox message payload of {size} bytes (at most {max_payload})")
    payload = _recv_exact(sock, size, deadline) if size else b""
    if size and payload is None:
        return None, b""
    return header, payload or b""


# --------------------------------------------------------------------------------------------
# Kernel interfaces (ctypes; Python 3.11 has no os.unshare / os.setns)
# --------------------------------------------------------------------------------------------

CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS = 0x00020000, 0x02000000, 0x04000000
CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = (
    0x08000000, 0x10000000, 0x20000000, 0x40000000)
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
PR_SET_DUMPABLE, PR_SET_KEEPCAPS, PR_SET_SECCOMP = 4, 8, 22
PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT = 24, 38, 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
_ARCH = platform.machine()
#: (pivot_root, capget, capset) system call numbers.
_SYSCALLS = {"x86_64": (155, 125, 126), "aarch64": (41, 90, 91)}.get(_ARCH)

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                        ctypes.c_char_p)
_libc.umount2.argtypes = (ctypes.c_char_p, ctypes.c_int)
_libc.unshare.argtypes = (ctypes.c_int,)
_libc.setns.argtypes = (ctypes.c_int, ctypes.c_int)
_libc.prctl.argtypes = (ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong,
                        ctypes.c_ulong)
_libc.sethostname.argtypes = (ctypes.c_char_p, ctypes.c_size_t)
_libc.syscall.restype = ctypes.c_long


def _check(ret: int, what: str) -> None:
    if ret != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")


def _b(s: str | None) -> bytes | None:
    return None if s is None else os.fsencode(s)


def mount(src: str | None, dst: str, fstype: str | None, flags: int, data: str | None = None):
    _check(_libc.mount(_b(src), _b(dst), _b(fstype), flags, _b(data)), f"mount {dst}")


def umount2(path: str, flags: int) -> None:
    _check(_libc.umount2(_b(path), flags), f"umount {path}")


def unshare(flags: int) -> None:
    _check(_libc.unshare(flags), f"unshare({flags:#x})")


def setns(fd: int, nstype: int) -> None:
    _check(_libc.setns(fd, nstype), "setns")


def prctl(option: int, a: int = 0, b: int = 0, c: int = 0, d: int = 0) -> int:
    return _libc.prctl(option, a, b, c, d)


def pivot_root(new: str, old: str) -> None:
    if _SYSCALLS is None:
        raise OSError(errno.ENOSYS, f"pivot_root: unknown system call number on {_ARCH}")
    _check(_libc.syscall(ctypes.c_long(_SYSCALLS[0]), _b(new), _b(old)), "pivot_root")


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


def _capabilities(set_zero: bool) -> int:
    """Clear every capability (``set_zero``) and return the OR of what is left."""
    if _SYSCALLS is None:
        raise OSError(errno.ENOSYS, f"capset: unknown system call number on {_ARCH}")
    hdr = _CapHeader(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3
    data = (_CapData * 2)()
    if set_zero:
        _check(_libc.syscall(ctypes.c_long(_SYSCALLS[2]), ctypes.byref(hdr), data), "capset")
    _check(_libc.syscall(ctypes.c_long(_SYSCALLS[1]), ctypes.byref(hdr), data), "capget")
    return sum(d.effective | d.permitted | d.inheritable for d in data)


# -- seccomp -----------------------------------------------------------------------------------

#: x86-64 system calls a cell never needs: mounting, namespaces, ptrace and process memory,
#: kernel keyrings, modules, bpf/perf/io_uring/userfaultfd, clocks, swap, reboot, syslog.
_X86_64_DENY = (
    101, 103, 134, 136, 139, 153, 155, 156, 159, 161, 163, 164, 165, 166, 167, 168, 169, 172,
    173, 175, 176, 179, 180, 212, 227, 246, 248, 249, 250, 272, 298, 300, 303, 304, 305, 308,
    310, 311, 312, 313, 320, 321, 323, 425, 426, 427, 428, 429, 430, 431, 432, 433, 438, 442,
    443,
)
_CLONE, _CLONE3 = 56, 435
_NS_FLAGS = (CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER
             | CLONE_NEWPID | CLONE_NEWNET)


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte),
                ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def seccomp_program() -> list[tuple[int, int, int, int]]:
    """The classic-BPF seccomp filter of a cell (x86-64) as ``(code, jt, jf, k)`` tuples:
    other architectures and the x32 ABI get EPERM, denied calls EPERM, ``clone`` with a
    namespace flag EPERM, ``clone3`` ENOSYS (so the C library falls back to ``clone``)."""
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    allow, eperm, enosys = 0x7FFF0000, 0x00050000 | errno.EPERM, 0x00050000 | errno.ENOSYS
    prog: list = [(ld, 0, 0, 4), (jeq, 0, "deny", 0xC000003E), (ld, 0, 0, 0),
                  (jge, "deny", 0, 0x40000000)]
    prog += [(jeq, "deny", 0, nr) for nr in _X86_64_DENY]
    prog += [(jeq, "clone", 0, _CLONE), (jeq, "enosys", 0, _CLONE3), (ret, 0, 0, allow)]
    labels = {"clone": len(prog)}
    prog += [(ld, 0, 0, 16), (jset, "deny", 0, _NS_FLAGS), (ret, 0, 0, allow)]
    labels["deny"] = len(prog)
    prog.append((ret, 0, 0, eperm))
    labels["enosys"] = len(prog)
    prog.append((ret, 0, 0, enosys))
    out = []
    for i, (code, jt, jf, k) in enumerate(prog):
        jt = labels[jt] - i - 1 if isinstance(jt, str) else jt
        jf = labels[jf] - i - 1 if isinstance(jf, str) else jf
        out.append((code, jt, jf, k))
    return out


_FPROG: list = []  # the filter, built once (in the zygote) and kept alive for the cells


def _seccomp_fprog() -> _SockFprog:
    if not _FPROG:
        prog = seccomp_program()
        arr = (_SockFilter * len(prog))(*[_SockFilter(*p) for p in prog])
        _FPROG[:] = [_SockFprog(len(prog), arr), arr]
    return _FPROG[0]


def _install_seccomp() -> None:
    _check(prctl(PR_SET_SECCOMP, 2, ctypes.addressof(_seccomp_fprog())), "seccomp")


# --------------------------------------------------------------------------------------------
# Files in the work directory, never following a symlink (the cell controls its contents)
# --------------------------------------------------------------------------------------------

#: Where a cell's stdout / stderr go in a sealed session: a fresh small tmpfs per cell, outside
#: the work directory (a full work directory never stops the next cell from reporting).
OUT_DIR = "/run/cell"
_NOFOLLOW_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _parts(rel: str) -> list[str]:
    parts = rel.split("/")
    if not rel or rel.startswith("/") or any(p in ("", ".", "..") for p in parts) or any(
            len(p.encode()) > 255 for p in parts) or "\0" in rel:
        raise ValueError(f"bad work-directory path {rel[:80]!r}")
    return parts


class _Files:
    """put / get / rename relative to a directory, as the sandbox uid, never following a
    symlink (``O_NOFOLLOW`` on every component) and never opening anything but regular files."""

    def __init__(self, root: str, owner: tuple[int, int] | None):
        self.root = root
        self.owner = owner

    def _dir(self, parts: list[str], create: bool) -> int:
        fd = os.open(self.root, _NOFOLLOW_DIR)
        try:
            for p in parts:
                try:
                    nxt = os.open(p, _NOFOLLOW_DIR, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise
                    os.mkdir(p, 0o755, dir_fd=fd)
                    nxt = os.open(p, _NOFOLLOW_DIR, dir_fd=fd)
                    if self.owner:
                        os.fchown(nxt, *self.owner)
                os.close(fd)
                fd = nxt
        except BaseException:
            os.close(fd)
            raise
        return fd

    def put(self, rel: str, data: bytes) -> None:
        self._write(rel, [data])

    def copy_in(self, rel: str, src_fd: int) -> int:
        """Write the rest of ``src_fd`` to ``rel`` (like :meth:`put`, streamed); returns bytes."""
        return self._write(rel, iter(lambda: os.read(src_fd, 1 << 22), b""))

    def _write(self, rel: str, chunks) -> int:
        """Write ``chunks`` to a new file and rename it over ``rel`` (whatever ``rel`` was, a
        symlink included, is replaced, never written through); returns the bytes written."""
        parts = _parts(rel)
        d = self._dir(parts[:-1], True)
        tmp = f".put-{os.getpid()}-{time.monotonic_ns()}"
        n = 0
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o644, dir_fd=d)
            try:
                for chunk in chunks:
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(fd, view[: 1 << 22]):]
                    n += len(chunk)
                if self.owner:
                    os.fchown(fd, *self.owner)
            finally:
                os.close(fd)
            os.rename(tmp, parts[-1], src_dir_fd=d, dst_dir_fd=d)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=d)
            except OSError:
                pass
            raise
        finally:
            os.close(d)
        return n

    def _open_regular(self, rel: str) -> int:
        parts = _parts(rel)
        d = self._dir(parts[:-1], False)
        try:
            fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                         dir_fd=d)
        finally:
            os.close(d)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise ValueError(f"{rel} is not a regular file")
        return fd

    def head(self, rel: str, limit: int, missing_ok: bool = True) -> tuple[bytes, int]:
        """The first ``limit`` bytes of a file and its size; (b"", 0) when it is missing or
        not a regular file (``missing_ok``; else the OSError / ValueError)."""
        try:
            fd = self._open_regular(rel)
        except (ValueError, OSError):
            if not missing_ok:
                raise
            return b"", 0
        try:
            size = os.fstat(fd).st_size
            chunks, got = [], 0
            while got < limit:
                c = os.read(fd, min(limit - got, 1 << 22))
                if not c:
                    break
                chunks.append(c)
                got += len(c)
            return b"".join(chunks), size
        finally:
            os.close(fd)

    def tail(self, rel: str, limit: int) -> bytes:
        try:
            fd = self._open_regular(rel)
        except (FileNotFoundError, ValueError, OSError):
            return b""
        try:
            size = os.fstat(fd).st_size
            os.lseek(fd, max(size - limit, 0), os.SEEK_SET)
            return os.read(fd, limit)
        finally:
            os.close(fd)

    def rename(self, src: str, dst: str) -> None:
        sp, dp = _parts(src), _parts(dst)
        s = self._dir(sp[:-1], False)
        try:
            d = self._dir(dp[:-1], True)
            try:
                os.rename(sp[-1], dp[-1], src_dir_fd=s, dst_dir_fd=d)
            finally:
                os.close(d)
        finally:
            os.close(s)


# --------------------------------------------------------------------------------------------
# cgroups (v1: one directory per controller; v2: one directory)
# --------------------------------------------------------------------------------------------


def _read(fd: int, name: str) -> str:
    f = os.open(name, os.O_RDONLY | os.O_CLOEXEC, dir_fd=fd)
    try:
        return os.read(f, 65536).decode()
    finally:
        os.close(f)


def _write(fd: int, name: str, value) -> None:
    f = os.open(name, os.O_WRONLY | os.O_CLOEXEC, dir_fd=fd)
    try:
        os.write(f, str(value).encode())
    finally:
        os.close(f)


def _field(text: str, key: str) -> int:
    for line in text.splitlines():
        k, _, v = line.partition(" ")
        if k == key:
            return int(v)
    return 0


class _Cgroups:
    """The trial's cgroups: created under the sandbox's base directories (descriptors the
    zygote opened before anything was unmounted), limits set per cell, counters read after."""

    def __init__(self, version: int, base_fds: dict[str, int], name: str, cpus: float):
        self.version, self.name, self.base = version, name, base_fds
        self.fds: dict[str, int] = {}
        for ctl, bfd in base_fds.items():
            try:
                os.mkdir(name, 0o755, dir_fd=bfd)
            except FileExistsError:
                pass
            self.fds[ctl] = os.open(name, _NOFOLLOW_DIR, dir_fd=bfd)
        seen, self.join_fds = set(), []
        for fd in self.fds.values():
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                self.join_fds.append(fd)
        self.have = {"memory": False, "pids": False, "cpu": False}
        self.before: dict[str, int] = {}
        quota = max(int(cpus * 100_000), 1000)
        if version == 1:
            self.have["memory"] = "memory" in self.fds
            self.have["pids"] = "pids" in self.fds
            if "cpu" in self.fds and "cpuacct" in self.fds:
                _write(self.fds["cpu"], "cpu.cfs_period_us", 100_000)
                _write(self.fds["cpu"], "cpu.cfs_quota_us", quota)
                self.have["cpu"] = True
            self.memsw = self._exists("memory", "memory.memsw.limit_in_bytes")
        else:
            fd = self.fds["unified"]
            ctls = set(_read(fd, "cgroup.controllers").split())
            self.have = {k: k in ctls for k in self.have}
            if self.have["cpu"]:
                _write(fd, "cpu.max", f"{quota} 100000")
            self.memsw = self._exists("unified", "memory.swap.max")

    def _exists(self, ctl: str, name: str) -> bool:
        try:
            os.close(os.open(name, os.O_RDONLY, dir_fd=self.fds[ctl]))
            return True
        except OSError:
            return False

    def _set_memory(self, memory_bytes: int) -> None:
        if self.version == 1:
            mem = self.fds["memory"]
            cur = int(_read(mem, "memory.limit_in_bytes"))
            order = ["memory.limit_in_bytes"]
            if self.memsw:
                order = (["memory.memsw.limit_in_bytes", "memory.limit_in_bytes"]
                         if memory_bytes > cur else
                         ["memory.limit_in_bytes", "memory.memsw.limit_in_bytes"])
            for f in order:
                _write(mem, f, memory_bytes)
        else:
            _write(self.fds["unified"], "memory.max", memory_bytes)
        self.limit = memory_bytes

    def relax(self, margin: int) -> None:
        """Between cells: the last cell's memory limit + ``margin`` for the session's own file
        transfers (the cells' tmpfs files may fill the limit; the session must not stall)."""
        if self.have["memory"] and getattr(self, "cell_limit", None):
            self._set_memory(self.cell_limit + margin)

    def prepare(self, memory_bytes: int, max_procs: int) -> None:
        """Set the next cell's limits and reset (or remember) the counters."""
        if self.have["memory"]:
            self._set_memory(memory_bytes)
            self.cell_limit = memory_bytes
        if self.version == 1:
            mem = self.fds.get("memory")
            if mem is not None:
                _write(mem, "memory.max_usage_in_bytes", 0)
                self.before["oom_kill"] = _field(_read(mem, "memory.oom_control"), "oom_kill")
            if "pids" in self.fds:
                _write(self.fds["pids"], "pids.max", max_procs)
                self.before["pids_max"] = self._pids_events("pids")
            if self.have["cpu"]:
                _write(self.fds["cpuacct"], "cpuacct.usage", 0)
        else:
            fd = self.fds["unified"]
            if self.have["memory"]:
                if self.memsw:
                    _write(fd, "memory.swap.max", 0)
                self.before["oom_kill"] = _field(_read(fd, "memory.events"), "oom_kill")
            if self.have["pids"]:
                _write(fd, "pids.max", max_procs)
                self.before["pids_max"] = self._pids_events("unified")
            if self.have["cpu"]:
                self.before["cpu_us"] = _field(_read(fd, "cpu.stat"), "usage_usec")

    def _pids_events(self, ctl: str) -> int:
        try:
            return _field(_read(self.fds[ctl], "pids.events"), "max")
        except OSError:
            return 0

    def cpu_s(self) -> float | None:
        if not self.have["cpu"]:
            return None
        if self.version == 1:
            return int(_read(self.fds["cpuacct"], "cpuacct.usage")) / 1e9
        used = _field(_read(self.fds["unified"], "cpu.stat"), "usage_usec")
        return (used - self.before.get("cpu_us", 0)) / 1e6

    def stats(self) -> dict:
        out: dict = {"cpu_s": self.cpu_s()}
        if self.version == 1 and "memory" in self.fds:
            mem = self.fds["memory"]
            out["peak_bytes"] = int(_read(mem, "memory.max_usage_in_bytes"))
            out["oom_killed"] = _field(_read(mem, "memory.oom_control"), "oom_kill") > \
                self.before.get("oom_kill", 0)
        elif self.version == 2 and self.have["memory"]:
            fd = self.fds["unified"]
            out["oom_killed"] = _field(_read(fd, "memory.events"), "oom_kill") > \
                self.before.get("oom_kill", 0)
        if self.have["pids"]:
            out["pids_limit_hit"] = self._pids_events(
                "pids" if self.version == 1 else "unified") > self.before.get("pids_max", 0)
        return out

    def kill_all(self, spare: int | None = None) -> None:
        """SIGKILL every process left in the cgroups but ``spare`` (used when cells have no
        PID namespace, and when the session ends)."""
        for fd in self.join_fds:
            try:
                pids = _read(fd, "cgroup.procs").split()
            except OSError:
                continue
            for p in pids:
                try:
                    if int(p) != spare:
                        os.kill(int(p), signal.SIGKILL)
                except (ProcessLookupError, PermissionError, ValueError):
                    pass


# --------------------------------------------------------------------------------------------
# The zygote
# --------------------------------------------------------------------------------------------

CONFIG: dict = {}
_STATE: dict = {}
#: Directories of the template view that sessions mount their own file systems on.
_SCRATCH, _TASK_DIR, _LIB_DIR = "/.scratch", "/task", "/opt/querylab-lib"


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


def _mkdirs(path: str, mode: int = 0o755) -> None:
    os.makedirs(path, mode=mode, exist_ok=True)


def _bind(src: str, dst: str, flags: int) -> None:
    """Bind ``src`` on ``dst`` and remount it with ``flags`` (read-only etc.); keeps flags the
    kernel locked on the source (nodev/noexec/nosuid) when remounting inside a user ns."""
    mount(src, dst, None, MS_BIND)
    try:
        mount(None, dst, None, MS_REMOUNT | MS_BIND | flags)
    except PermissionError:
        st = os.statvfs(src)
        extra = sum(f for bit, f in ((os.ST_NOSUID, MS_NOSUID), (os.ST_NODEV, MS_NODEV),
                                     (os.ST_NOEXEC, MS_NOEXEC)) if st.f_flag & bit)
        mount(None, dst, None, MS_REMOUNT | MS_BIND | flags | extra)


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


# --------------------------------------------------------------------------------------------
# A session: PID 1 of the trial's PID namespace, in the trial's cgroups
# --------------------------------------------------------------------------------------------

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


def _empty_dir(top: int) -> None:
    """Remove everything inside the directory open as ``top``, never following a symlink.
    No recursion and two descriptors at a time, however deep a cell's tree: each directory's
    subdirectories are first moved up into ``top``, then its files unlinked and it removed."""
    moved = 0
    while True:
        with os.scandir(top) as it:
            entries = [(e.name, e.is_dir(follow_symlinks=False)) for e in it]
        if not entries:
            return
        for name, is_dir in entries:
            if not is_dir:
                os.unlink(name, dir_fd=top)
                continue
            fd = os.open(name, _NOFOLLOW_DIR, dir_fd=top)
            try:
                with os.scandir(fd) as it:
                    inner = [(e.name, e.is_dir(follow_symlinks=False)) for e in it]
                for iname, idir in inner:
                    if not idir:
                        os.unlink(iname, dir_fd=fd)
                        continue
                    while True:  # a free name in top (a cell may have made ".wiped-N" too)
                        moved += 1
                        try:
                            os.rename(iname, f".wiped-{moved}", src_dir_fd=fd, dst_dir_fd=top)
                            break
                        except OSError as exc:
                            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR):
                                raise
            finally:
                os.close(fd)
            os.rmdir(name, dir_fd=top)


def _wipe(path: str, mode: int, owner: tuple[int, int] | None) -> None:
    """Empty the directory ``path`` (never following a symlink) and reset its own mode,
    owner, extended attributes and times."""
    top = os.open(path, _NOFOLLOW_DIR)
    try:
        _empty_dir(top)
        os.fchmod(top, mode)
        if owner:
            os.fchown(top, *owner)
        for attr in os.listxattr(top):
            os.removexattr(top, attr)
        os.utime(top, (0, 0))
    finally:
        os.close(top)


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


# --------------------------------------------------------------------------------------------
# The run-time audit of a cell
# --------------------------------------------------------------------------------------------

#: Audit events (``sys.addaudithook``) a cell reports, by kind: file-system events whose first
#: argument is a path, network and process (or native-code) events.
_AUDIT_PATH_EVENTS = frozenset({
    "open", "os.listdir", "os.scandir", "os.fwalk", "glob.glob", "glob.glob/2", "os.chdir",
    "os.remove", "os.rename", "os.symlink", "os.link", "os.mkdir", "os.rmdir", "os.truncate",
    "shutil.copyfile", "shutil.copytree", "shutil.rmtree", "shutil.move", "sqlite3.connect",
    "pathlib.Path.glob", "pathlib.Path.rglob", "tempfile.mkstemp",
})
_AUDIT_NET_EVENTS = frozenset({
    "socket.connect", "socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyaddr",
    "socket.bind", "socket.sendto", "urllib.Request", "http.client.connect",
    "ftplib.connect", "smtplib.connect", "socket.__new__",
})
_AUDIT_PROC_EVENTS = frozenset({
    "subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.forkpty",
    "os.kill", "os.killpg", "pty.spawn", "ctypes.dlopen", "ctypes.dlsym", "ctypes.call_function",
    "ctypes.cdata", "sys.addaudithook",
})
#: Bytes of audit events one cell may report (then ``_truncated`` with the count left out);
#: below a pipe's buffer, so the hook never blocks (its writes are non-blocking anyway).
AUDIT_MAX_BYTES = 24 << 10
#: The end-of-cell marker querylab's own code writes after the agent's code returned: missing
#: (and the cell not killed) means the channel was closed or redirected by the cell.
AUDIT_END = b'{"e": "_end"}\n'


def _audit_allowed(path: str, mode: str, home: str, readonly_roots: tuple[str, ...]) -> bool:
    """True for what a cell may touch without a finding: its work directory; reads of the
    interpreter and libraries (``readonly_roots``) and of ``/dev/null``-like devices and its own
    ``/proc/self``; in its ``/tmp`` and ``/dev/shm`` (its own tmpfs) files it creates or that
    exist. Everything else — an absolute path elsewhere, a probe for a host path — is
    reported."""
    def under(p: str, root: str) -> bool:
        return p == root or p.startswith(root.rstrip("/") + "/")

    if under(path, home):
        return True
    if path in ("/dev/null", "/dev/zero", "/dev/urandom", "/dev/random", "/dev/stdin",
                "/dev/stdout", "/dev/stderr") or under(path, "/proc/self"):
        return True
    writes = any(c in mode for c in "wax+")
    if not writes and any(under(path, r) for r in readonly_roots):
        return True
    if under(path, "/tmp") or under(path, "/dev/shm"):
        return writes or os.path.lexists(path)
    return False


def _install_audit_hook(fd: int, home: str) -> None:
    """Report the cell's file, network and process events to ``fd`` (one JSON object per line:
    ``{"e": event, "p": path, "m": mode, "x": existed}`` for a file-system event outside what
    :func:`_audit_allowed` permits, ``{"e": event, "a": arguments}`` for a network or process
    event), at most :data:`AUDIT_MAX_BYTES` and each distinct event once.

    CPython has no way to remove an audit hook, so the cell's code cannot switch it off from
    Python; it can still (a) use ``ctypes`` to act without Python-level events (the ctypes
    calls themselves are reported), (b) start a subprocess whose actions are not observed (the
    start is reported), (c) close or redirect ``fd`` (the session then misses the end marker
    and says so), and native libraries that open files themselves (pyarrow's file systems,
    ``numpy.fromfile``) raise no event at all. The sealed file-system view, not this hook, is
    what keeps the answer key out of reach: the hook makes attempts visible."""
    import fcntl

    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)
    roots = tuple(sorted({p for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, "/usr",
                                      "/lib", "/lib64", "/etc", "/opt") if p}))
    seen: set = set()
    state = {"bytes": 0, "dropped": 0, "busy": False}
    dumps, fspath, normpath, join, getcwd, write = (json.dumps, os.fspath, os.path.normpath,
                                                    os.path.join, os.getcwd, os.write)
    watched = _AUDIT_PATH_EVENTS | _AUDIT_NET_EVENTS | _AUDIT_PROC_EVENTS

    def emit(rec: dict) -> None:
        line = (dumps(rec, default=repr) + "\n").encode("utf-8", "replace")
        if state["bytes"] + len(line) > AUDIT_MAX_BYTES:
            state["dropped"] += 1
            return
        try:
            write(fd, line)
            state["bytes"] += len(line)
        except OSError:
            state["dropped"] += 1

    def hook(event: str, args: tuple) -> None:
        if event not in watched or state["busy"]:
            return
        state["busy"] = True
        try:
            if event in _AUDIT_PATH_EVENTS:
                raw = args[0] if args else None
                if isinstance(raw, int) or raw is None:
                    return
                path = fspath(raw)
                if isinstance(path, bytes):
                    path = path.decode("utf-8", "replace")
                full = normpath(join(getcwd(), path))
                mode = args[1] if event == "open" and len(args) > 1 and isinstance(
                    args[1], str) else ""
                if event == "open" and not mode and len(args) > 2 and isinstance(args[2], int):
                    mode = "r" if args[2] & (os.O_WRONLY | os.O_RDWR | os.O_CREAT) == 0 else "w"
                if event not in ("open", "os.listdir", "os.scandir", "os.fwalk", "glob.glob",
                                 "glob.glob/2", "sqlite3.connect", "os.chdir",
                                 "pathlib.Path.glob", "pathlib.Path.rglob"):
                    mode = mode or "w"  # removing, renaming, linking: a write
                if _audit_allowed(full, mode, home, roots):
                    return
                key = (event, full, mode)
                if key in seen:
                    return
                seen.add(key)
                emit({"e": event, "p": full[:300], "m": mode, "x": os.path.lexists(full)})
            else:
                if event == "socket.__new__" and (len(args) < 2 or int(args[1]) not in (2, 10)):
                    return  # only internet sockets (AF_INET, AF_INET6) are a network attempt
                shown = repr(args)[:200]
                key = (event, shown if event not in ("ctypes.call_function", "ctypes.cdata")
                       else "")
                if key in seen:
                    return
                seen.add(key)
                emit({"e": event, "a": shown})
        except BaseException:  # noqa: BLE001 - the hook must never change what the cell does
            pass
        finally:
            state["busy"] = False

    sys.addaudithook(hook)
    _STATE["audit_state"] = state


def _read_audit(fd: int, limit: int = 4 * AUDIT_MAX_BYTES) -> tuple[list[dict], bool]:
    """The events a finished cell reported on its audit pipe (read end ``fd``, closed here) and
    whether its end marker arrived. Lines that are not JSON objects are kept as ``{"e":
    "_garbled"}`` (something else wrote to the channel)."""
    data = b""
    try:
        os.set_blocking(fd, False)
        while len(data) < limit:
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                break
            if not chunk:
                break
            data += chunk
    finally:
        os.close(fd)
    events, complete, ends = [], False, 0
    lines = [x for x in data.splitlines() if x.strip()]
    for i, line in enumerate(lines):
        if line.strip() == AUDIT_END.strip():
            ends += 1
            complete = i == len(lines) - 1  # nothing after querylab's own marker
            if ends > 1:  # the cell wrote an end marker of its own
                events.append({"e": "_garbled", "a": "more than one end marker"})
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            rec = None
        events.append(rec if isinstance(rec, dict) and isinstance(rec.get("e"), str)
                      else {"e": "_garbled", "a": line[:200].decode("utf-8", "replace")})
        if len(events) >= 400:
            break
    return events, complete


# --------------------------------------------------------------------------------------------
# A cell
# --------------------------------------------------------------------------------------------


def _drop_privileges(s: _Session) -> None:
    if s.drop_uid:
        prctl(PR_SET_KEEPCAPS, 0)
        for cap in range(_STATE["cap_last"] + 1):
            prctl(PR_CAPBSET_DROP, cap)
        os.setgroups([])
        os.setresgid(s.gid, s.gid, s.gid)
        os.setresuid(s.uid, s.uid, s.uid)
        if os.getuid() == 0 or os.geteuid() == 0 or 0 in os.getresgid():
            raise OSError(errno.EPERM, "still root after setresuid")
    elif _STATE["userns"]:
        for cap in range(_STATE["cap_last"] + 1):
            prctl(PR_CAPBSET_DROP, cap)
    prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)
    if s.mech["capabilities_dropped"] and _capabilities(set_zero=True) != 0:
        raise OSError(errno.EPERM, "capabilities left after capset")
    prctl(PR_SET_DUMPABLE, 1)  # /proc/self belongs to the cell's uid (not root)
    if s.mech["no_new_privs"]:
        _check(prctl(PR_SET_NO_NEW_PRIVS, 1), "no_new_privs")


def _cell_setup(s: _Session, req: dict, status_fd: int, audit_fd: int) -> None:
    os.setsid()
    for sig in (signal.SIGPIPE, signal.SIGINT, signal.SIGTERM, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    s.sock.detach()  # closed below with every other inherited descriptor
    keep = sorted((status_fd, audit_fd))
    os.closerange(3, keep[0])
    os.closerange(keep[0] + 1, keep[1])
    os.closerange(keep[1] + 1, 1 << 16)
    if s.oom_protected:  # killable first at the memory limit (the session took -500)
        with open("/proc/self/oom_score_adj", "w") as fh:
            fh.write("0")
    _drop_privileges(s)
    # the work directory is the cells' own: an earlier cell may have taken its owner bits
    # (chmod('.', 0)); its owner (this uid) gives them back, or the cell could not start —
    # an errored trial a cell could opt out with (QA adversary)
    mode = os.stat(s.cwd).st_mode & 0o7777
    if mode & 0o700 != 0o700:
        os.chmod(s.cwd, mode | 0o700)
    os.chdir(s.cwd)
    fd = os.open(os.devnull, os.O_RDONLY)
    os.dup2(fd, 0)
    os.close(fd)
    name = req["name"]
    for ext, target in (("out", 1), ("err", 2)):
        fd = os.open(os.path.join(s.out_dir, f"{name}.{ext}"),
                     os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW)
        os.dup2(fd, target)
        os.close(fd)
    if not s.isolated:
        os.makedirs(os.environ["TMPDIR"], exist_ok=True)
    mem, cpu, fsize = int(req["memory_bytes"]), int(req["cpu_s"]), int(req["max_file_bytes"])
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    if s.cg is not None and s.cg.have["memory"]:
        # the cgroup bounds real memory; the address space gets the limit on top of what the
        # preloaded interpreter already maps (a large allocation is a MemoryError at once)
        with open("/proc/self/statm") as fh:
            mem += int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    if s.mech["seccomp"]:
        _install_seccomp()


def _cell_main(s: _Session, req: dict, status_fd: int, audit_fd: int) -> None:
    code = 1
    try:
        try:
            _cell_setup(s, req, status_fd, audit_fd)
        except BaseException as exc:
            os.write(status_fd, f"err:{type(exc).__name__}: {exc}".encode()[:4000])
            os._exit(125)
        os.write(status_fd, b"ok")
        os.close(status_fd)
        sys.stdin = open(os.devnull)
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8",
                                      errors="replace")
        sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8",
                                      errors="replace")
        code = _exec_cell(s, req, audit_fd)
    finally:
        for f in (sys.stdout, sys.stderr):
            try:
                f.flush()
            except BaseException:
                pass
        try:  # querylab's code again: the agent's code returned without cutting the channel
            dropped = (_STATE.get("audit_state") or {}).get("dropped")
            if dropped:
                os.write(audit_fd, b'{"e": "_truncated", "n": %d}\n' % dropped)
            os.write(audit_fd, AUDIT_END)
        except BaseException:
            pass
        os._exit(code)


def _exec_cell(s: _Session, req: dict, audit_fd: int) -> int:
    name = req["name"]
    try:
        g = {"__name__": "__main__", "__builtins__": __builtins__}
        vars_dir = os.path.join(s.home, "vars")
        try:
            entries = sorted(os.listdir(vars_dir))
        except FileNotFoundError:
            entries = []
        for f in entries:
            if f.startswith("var_") and f.endswith(".json") and f[:-5].isidentifier():
                try:
                    with open(os.path.join(vars_dir, f)) as fh:
                        g[f[:-5]] = json.load(fh)
                except (OSError, ValueError, RecursionError) as exc:  # a cell wrote it: skip it
                    print(f"warning: vars/{f} not loaded ({type(exc).__name__}: "
                          f"{str(exc)[:120]})", file=sys.stderr)
        code = compile(req["code"], f"{name}.py", "exec")
        _install_audit_hook(audit_fd, s.home)  # the last thing before the agent's code
        exec(code, g)
        return 0
    except SystemExit as e:
        if not isinstance(e.code, (int, type(None))):
            print(e.code, file=sys.stderr)
            return 1
        return e.code or 0
    except MemoryError:
        try:
            sys.stderr.write("MemoryError: the cell exceeded its memory limit\n")
        except BaseException:
            pass
        return 1
    except BaseException:
        try:
            et, ev, tb = sys.exc_info()
            keep = [f for f in traceback.extract_tb(tb) if f.filename == f"{name}.py"]
            sys.stderr.write("Traceback (most recent call last):\n")
            sys.stderr.write("".join(traceback.format_list(keep)))
            sys.stderr.write("".join(traceback.format_exception_only(et, ev)))
        except BaseException:
            pass
        return 1


if __name__ == "__main__":
    main()
