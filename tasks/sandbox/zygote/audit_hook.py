"""The run-time audit of a cell: the ``sys.addaudithook`` hook installed just before the
agent's code (file-system, network and process events over a pipe) and the session's reading
of that pipe.

Part of the zygote program (see :mod:`tasks.sandbox.zygote`): standard library only.
"""

from __future__ import annotations

import json
import os
import sys

from .state import _STATE


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
