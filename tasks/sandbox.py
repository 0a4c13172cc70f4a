"""The ``execute_python`` sandbox: each cell runs in its own process with limits.

A :class:`Sandbox` owns a *zygote*: a long-lived ``python -I`` process started with an
environment stripped of secrets (only ``PATH``, locale and time-zone variables survive), which
pre-imports heavy libraries once (default pandas and pyarrow) and then ``fork()``s one child per
cell. The child, before running any agent code:

- starts a new session (so the whole process group can be killed),
- changes to the trial's working directory and points ``HOME`` / ``TMPDIR`` into it,
- redirects stdout / stderr to files in ``<workdir>/.cells/`` and stdin to ``/dev/null``,
- sets ``RLIMIT_AS`` (address space, MiB), ``RLIMIT_CPU`` (CPU seconds), ``RLIMIT_FSIZE``
  (largest file it may write) and ``RLIMIT_CORE`` = 0, soft and hard (it cannot raise them),
- loads every ``<workdir>/vars/var_<call_id>.json`` as a global variable ``var_<call_id>``
  (DAB's convention) and runs the cell.

Where the kernel allows it (Linux user namespaces), the zygote first enters new user, mount,
PID and network namespaces and serves as their init (PID 1): cells then see only the sandbox's
processes in ``/proc`` (not querylab's ``/proc/<pid>/environ``) and have no network, and after
each cell every other process of the namespace is killed. Elsewhere it runs without them
(:attr:`Sandbox.isolated` is False).

The zygote kills the child's process group at the wall-clock timeout. Forking a pre-imported,
single-threaded process costs milliseconds where a fresh interpreter importing pandas costs
~1 s, and the zygote never held a secret, so the children cannot inherit one. If the zygote
dies it is restarted on the next cell. POSIX only (``fork``, ``resource``).
"""

from __future__ import annotations

import atexit
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

#: Environment variables the sandbox keeps (everything else, keys and URLs included, is dropped).
SAFE_ENV = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ")
#: Fixed variables for the sandbox: single-threaded BLAS (fork-safe), no GUI backends.
SANDBOX_ENV = {
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "MPLBACKEND": "Agg",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONHASHSEED": "0",
}
DEFAULT_PRELOAD = ("pandas", "pyarrow")

_ZYGOTE = r'''
import ctypes, glob, io, json, os, resource, select, signal, sys, time, traceback
_proto_in = sys.stdin.buffer
_proto_out = sys.stdout.buffer
_libc = ctypes.CDLL(None, use_errno=True)
_NS = 0x00020000 | 0x10000000 | 0x20000000 | 0x40000000  # NEWNS | NEWUSER | NEWPID | NEWNET


def _isolate():
    # New user, mount, PID and network namespaces; False (nothing changed) if refused.
    uid, gid = os.getuid(), os.getgid()
    if _libc.unshare(_NS) != 0:
        return False
    for path, text in (("/proc/self/setgroups", "deny"), ("/proc/self/uid_map", f"0 {uid} 1"),
                       ("/proc/self/gid_map", f"0 {gid} 1")):
        with open(path, "w") as fh:
            fh.write(text)
    _libc.mount(b"none", b"/", None, 16384 | (1 << 18), None)  # MS_REC | MS_PRIVATE
    return True


def _probe():
    pid = os.fork()
    if pid == 0:
        ok = False
        try:
            ok = _isolate()
        except BaseException:
            pass
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    return os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


# Namespaces first, while this process is still single-threaded (unshare(CLONE_NEWUSER)
# fails in a threaded process; imports below may start threads).
_ISOLATED = bool(json.loads(sys.argv[2])) and _probe() and _isolate()
if _ISOLATED:
    # this process is in the new namespaces; its child becomes PID 1 there and serves requests
    _init = os.fork()
    if _init != 0:
        for _fd in (0, 1):
            os.close(_fd)
        _, _st = os.waitpid(_init, 0)
        os._exit(os.WEXITSTATUS(_st) if os.WIFEXITED(_st) else 1)
    _libc.mount(b"proc", b"/proc", b"proc", 2 | 4 | 8, None)  # NOSUID | NODEV | NOEXEC


def _own_pid_namespace():
    # True only when we are PID 1 and /proc is the proc of our own PID namespace.
    try:
        return os.getpid() == 1 and os.readlink("/proc/self") == "1"
    except OSError:
        return False


# Never sweep /proc unless it is provably our own namespace's.
_ISOLATED = _ISOLATED and _own_pid_namespace()
for _m in json.loads(sys.argv[1]):
    try:
        __import__(_m)
    except Exception:
        pass
import gc
gc.collect()
gc.freeze()  # preloaded objects stay out of the children's collections: fewer copy-on-write faults


def _child(req):
    os.setsid()
    for sig in (signal.SIGPIPE, signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)
    os.chdir(req["workdir"])
    fd = os.open(os.devnull, os.O_RDONLY); os.dup2(fd, 0); os.close(fd)
    for path, target in ((req["stdout"], 1), (req["stderr"], 2)):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(fd, target); os.close(fd)
    sys.stdin = open(os.devnull)
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8", errors="replace")
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="replace")
    os.environ["HOME"] = req["workdir"]
    os.makedirs("tmp", exist_ok=True)
    os.environ["TMPDIR"] = os.path.join(req["workdir"], "tmp")
    mem, cpu, fsize = req["memory_bytes"], req["cpu_s"], req["max_file_bytes"]
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    g = {"__name__": "__main__", "__builtins__": __builtins__}
    for f in sorted(glob.glob(os.path.join("vars", "var_*.json"))):
        with open(f) as fh:
            g[os.path.basename(f)[:-5]] = json.load(fh)
    with open(req["cell"]) as fh:
        src = fh.read()
    exec(compile(src, req["cell_name"], "exec"), g)


def _cell(req):
    code = 0
    try:
        _child(req)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, (int, type(None))):
            print(e.code, file=sys.stderr)
    except MemoryError:
        code = 1
        try:
            sys.stderr.write("MemoryError: the cell exceeded its memory limit\n")
        except BaseException:
            pass
    except BaseException:
        code = 1
        try:
            et, ev, tb = sys.exc_info()
            keep = [f for f in traceback.extract_tb(tb) if f.filename == req["cell_name"]]
            sys.stderr.write("Traceback (most recent call last):\n")
            sys.stderr.write("".join(traceback.format_list(keep)))
            sys.stderr.write("".join(traceback.format_exception_only(et, ev)))
        except BaseException:
            pass
    for s in (sys.stdout, sys.stderr):
        try:
            s.flush()
        except BaseException:
            pass
    os._exit(code)


def _sweep(pid):
    # Kill what the cell left behind and reap it: its process group; in our own PID
    # namespace every process but us (that also catches processes that left the group).
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if _ISOLATED and _own_pid_namespace():
        for name in os.listdir("/proc"):
            if name.isdigit() and int(name) != 1:
                try:
                    os.kill(int(name), signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
    while True:
        try:
            done, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if done == 0:
            if not (_ISOLATED and _own_pid_namespace()):
                break
            time.sleep(0.001)  # killed processes not yet reaped
            if not any(n.isdigit() and int(n) != 1 for n in os.listdir("/proc")):
                break


def _run(req):
    pid = os.fork()
    if pid == 0:
        _cell(req)
    start = time.monotonic()
    deadline = start + req["timeout_s"]
    nap, timed_out, status, ru = 0.0005, False, 0, None
    try:
        pidfd = os.pidfd_open(pid)  # readable when the child exits (Linux >= 5.3)
    except (AttributeError, OSError):
        pidfd = None
    while True:
        done, status, ru = os.wait4(pid, os.WNOHANG)
        if done:
            break
        if pidfd is not None:
            select.select([pidfd], [], [], max(deadline - time.monotonic(), 0))
            done, status, ru = os.wait4(pid, os.WNOHANG)
            if done:
                break
        if time.monotonic() >= deadline:
            timed_out = True
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            _, status, ru = os.wait4(pid, 0)
            break
        if pidfd is None:
            time.sleep(nap)
            nap = min(nap * 2, 0.002)
    if pidfd is not None:
        os.close(pidfd)
    _sweep(pid)
    return {
        "exit_code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
        "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
        "timed_out": timed_out,
        "duration_s": time.monotonic() - start,
        "cpu_s": ru.ru_utime + ru.ru_stime if ru else 0.0,
        "max_rss_kb": ru.ru_maxrss if ru else 0,
        "isolated": _ISOLATED,
    }


_proto_out.write(json.dumps({"ready": True, "isolated": _ISOLATED}).encode() + b"\n")
_proto_out.flush()
for line in _proto_in:
    try:
        reply = _run(json.loads(line))
    except Exception as exc:
        reply = {"zygote_error": f"{type(exc).__name__}: {exc}"}
    _proto_out.write(json.dumps(reply).encode() + b"\n")
    _proto_out.flush()
'''


class SandboxError(RuntimeError):
    """The sandbox itself failed (could not start, stopped answering)."""


@dataclass
class CellResult:
    """What one cell did.

    ``stdout``: its standard output (at most ``max_output_chars`` characters kept;
    ``stdout_bytes`` is the full size in bytes); ``stderr``: the last 2,000 characters of its standard error;
    ``exit_code`` (None when killed by a signal) and ``signal``; ``timed_out`` when the
    wall-clock limit killed it; ``error``: a one-line explanation when the cell failed, else
    None; ``duration_s`` wall seconds, ``cpu_s`` CPU seconds, ``max_rss_kb`` peak memory.
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

    @property
    def ok(self) -> bool:
        return self.error is None


def sandbox_env() -> dict[str, str]:
    """The environment of sandboxed code: :data:`SAFE_ENV` from ours plus :data:`SANDBOX_ENV`."""
    env = {k: os.environ[k] for k in SAFE_ENV if k in os.environ}
    env.update(SANDBOX_ENV)
    return env


def _read_head(path: Path, limit: int) -> tuple[str, int]:
    """The first ``limit`` characters of a text file and the file's size in bytes."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            data = fh.read(limit * 4)
    except FileNotFoundError:
        return "", 0
    return data.decode("utf-8", errors="replace")[:limit], size


def _read_tail(path: Path, limit: int) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(size - limit * 4, 0))
            data = fh.read()
    except FileNotFoundError:
        return ""
    return data.decode("utf-8", errors="replace")[-limit:]


class Sandbox:
    """Runs Python cells in forked, resource-limited children of a clean zygote process.

    ``preload``: modules the zygote imports once (their import cost is not paid per cell);
    ``python``: the interpreter (default: this one, so the venv's pandas/polars/pyarrow are
    importable). ``isolate``: also put each cell in new Linux user, mount, PID and network
    namespaces when the kernel allows it (then the cell sees only its own processes in
    ``/proc`` — not querylab's environment — and has no network); :attr:`isolated` tells
    whether it does. Thread-safe: cells of one sandbox run one at a time (use one sandbox per
    thread for parallel trials, see :func:`thread_sandbox`). :meth:`close` stops the zygote.
    """

    def __init__(
        self,
        preload: tuple[str, ...] = DEFAULT_PRELOAD,
        python: str | None = None,
        isolate: bool = True,
    ):
        if os.name != "posix":  # pragma: no cover
            raise SandboxError("execute_python's sandbox needs a POSIX system (fork, rlimits)")
        self.preload = tuple(preload)
        self.isolate = isolate
        #: True once the zygote found Linux namespaces usable (set when it starts).
        self.isolated = False
        self.python = python or sys.executable
        self._proc: subprocess.Popen | None = None
        self._buf = b""
        self._lock = threading.Lock()
        self._home = tempfile.mkdtemp(prefix="querylab-sandbox-")

    # -- zygote ---------------------------------------------------------------------------
    def _start(self) -> None:
        os.makedirs(self._home, exist_ok=True)
        self._proc = subprocess.Popen(
            [self.python, "-I", "-c", _ZYGOTE, json.dumps(list(self.preload)),
             json.dumps(self.isolate)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=sandbox_env(),
            cwd=self._home,
            close_fds=True,
            start_new_session=True,
        )
        self._buf = b""
        reply = self._readline(120.0)
        hello = json.loads(reply) if reply else {}
        if not hello.get("ready"):
            self._kill()
            raise SandboxError("the execute_python sandbox did not start")
        self.isolated = bool(hello.get("isolated"))

    def _readline(self, timeout_s: float) -> bytes | None:
        assert self._proc is not None and self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        end = time.monotonic() + timeout_s
        while b"\n" not in self._buf:
            left = end - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                return None
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        for stream in (proc.stdin, proc.stdout):
            try:
                stream.close()
            except (OSError, AttributeError):
                pass
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # pragma: no cover
            pass

    def close(self) -> None:
        """Stop the zygote (idempotent); the next :meth:`run` starts a new one."""
        with self._lock:
            self._kill()
            shutil.rmtree(self._home, ignore_errors=True)

    # -- cells ----------------------------------------------------------------------------
    def run(
        self,
        code: str,
        workdir: str | Path,
        name: str = "cell",
        timeout_s: float = 60.0,
        memory_mb: int = 2048,
        cpu_s: int = 60,
        max_file_mb: int = 256,
        max_output_chars: int = 1_000_000,
    ) -> CellResult:
        """Run ``code`` in a fresh child with ``workdir`` as its working directory.

        ``name`` names the cell's files in ``<workdir>/.cells/`` (``<name>.py``, ``.out``,
        ``.err``); limits: ``timeout_s`` wall seconds, ``memory_mb`` MiB of address space,
        ``cpu_s`` CPU seconds, ``max_file_mb`` MiB per written file (stdout included).
        Returns a :class:`CellResult`; raises :class:`SandboxError` only when the zygote
        cannot be started.
        """
        workdir = Path(workdir).resolve()
        cells = workdir / ".cells"
        cells.mkdir(parents=True, exist_ok=True)
        cell, out, err = cells / f"{name}.py", cells / f"{name}.out", cells / f"{name}.err"
        cell.write_text(code)
        req = {
            "workdir": str(workdir),
            "cell": str(cell),
            "cell_name": f"{name}.py",
            "stdout": str(out),
            "stderr": str(err),
            "timeout_s": float(timeout_s),
            "memory_bytes": int(memory_mb) * 1024 * 1024,
            "cpu_s": max(int(cpu_s), 1),
            "max_file_bytes": int(max_file_mb) * 1024 * 1024,
        }
        with self._lock:
            for attempt in (1, 2):
                if self._proc is None or self._proc.poll() is not None:
                    self._kill()
                    self._start()
                try:
                    assert self._proc is not None and self._proc.stdin is not None
                    self._proc.stdin.write(json.dumps(req).encode() + b"\n")
                    self._proc.stdin.flush()
                except (BrokenPipeError, OSError):
                    self._kill()
                    if attempt == 2:
                        raise SandboxError("the execute_python sandbox died") from None
                    continue
                line = self._readline(float(timeout_s) + 30.0)
                if line is None:  # the zygote hung or died mid-cell: never re-run the cell
                    self._kill()
                    return CellResult("", 0, "", None, None, True,
                                      "execute_python: the sandbox stopped answering; the cell "
                                      "was abandoned")
                break
        reply = json.loads(line)
        if "zygote_error" in reply:
            return CellResult("", 0, "", None, None, False, f"sandbox error: {reply['zygote_error']}")
        stdout, n = _read_head(out, max_output_chars)
        stderr = _read_tail(err, 2000)
        res = CellResult(
            stdout=stdout, stdout_bytes=n, stderr=stderr, exit_code=reply["exit_code"],
            signal=reply["signal"], timed_out=reply["timed_out"], error=None,
            duration_s=reply["duration_s"], cpu_s=reply["cpu_s"], max_rss_kb=reply["max_rss_kb"],
        )
        res.error = _explain(res, timeout_s, memory_mb, cpu_s, max_file_mb)
        return res


def _explain(res: CellResult, timeout_s: float, memory_mb: int, cpu_s: int, file_mb: int):
    if res.timed_out:
        return f"execute_python timed out after {timeout_s:g} s (wall clock); the process was killed"
    sig = res.signal
    if sig is not None:
        if sig in (signal.SIGXCPU, signal.SIGKILL) and res.cpu_s >= cpu_s - 0.5:
            return f"execute_python exceeded its CPU limit of {cpu_s} s and was killed"
        if sig == signal.SIGXFSZ:
            return f"execute_python wrote a file (or output) larger than {file_mb} MiB and was killed"
        if sig in (signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT, signal.SIGKILL):
            return (f"execute_python was killed by {signal.Signals(sig).name} (memory limit "
                    f"{memory_mb} MiB?)")
        return f"execute_python was killed by {signal.Signals(sig).name}"
    if res.exit_code:
        tail = "\n".join(res.stderr.strip().splitlines()[-8:])
        if "MemoryError" in res.stderr:
            return (f"execute_python exceeded its memory limit of {memory_mb} MiB "
                    f"(MemoryError):\n{tail}")
        return f"python exited with code {res.exit_code}:\n{tail}"
    return None


_LOCAL = threading.local()
_ALL: list[Sandbox] = []
_ALL_LOCK = threading.Lock()


def thread_sandbox() -> Sandbox:
    """This thread's shared :class:`Sandbox` (created on first use, closed at exit)."""
    sb = getattr(_LOCAL, "sandbox", None)
    if sb is None:
        sb = Sandbox()
        _LOCAL.sandbox = sb
        with _ALL_LOCK:
            _ALL.append(sb)
    return sb


@atexit.register
def _close_all() -> None:
    with _ALL_LOCK:
        for sb in _ALL:
            sb.close()
        _ALL.clear()
