"""A cell: the child a session forks for one ``execute_python`` call. It closes every inherited
descriptor, drops to the unprivileged sandbox uid (capabilities, bounding set, ``no_new_privs``),
sets its rlimits and seccomp filter, loads ``vars/var_<call_id>.json`` as globals, installs the
audit hook and runs the code.

Part of the zygote program (see :mod:`tasks.sandbox.zygote`): standard library only.
"""

from __future__ import annotations

import errno
import io
import json
import os
import resource
import signal
import sys
import traceback

from .audit_hook import AUDIT_END, _install_audit_hook
from .kernel import (PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, PR_CAPBSET_DROP, PR_SET_DUMPABLE,
                     PR_SET_KEEPCAPS, PR_SET_NO_NEW_PRIVS, _capabilities, _check,
                     _install_seccomp, prctl)
from .state import _STATE

#: True for type checkers only (``typing`` is not imported: the program imports what it did).
TYPE_CHECKING = False
if TYPE_CHECKING:  # the session is defined in a later part; annotations are never evaluated
    from .session_server import _Session


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
