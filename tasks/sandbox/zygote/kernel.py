"""Kernel interfaces of the zygote program (ctypes; Python 3.11 has no ``os.unshare`` /
``os.setns``): namespace, mount and prctl calls, capabilities, bind mounts and the cells'
seccomp filter.

Part of the zygote program (see :mod:`tasks.sandbox.zygote`): standard library only.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform

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
