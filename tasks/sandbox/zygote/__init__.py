"""The programs of the ``execute_python`` sandbox that run outside querylab's process.

:class:`tasks.sandbox.pool.Sandbox` starts it as ``python -I -c <source()> <config>`` with an
environment stripped of secrets. Three kinds of process run its code:

**Zygote** (one per :class:`~tasks.sandbox.pool.Sandbox`): enters a user namespace first when it
is not root (``config["userns"]``; then it also becomes PID 1 of a PID namespace of its own),
imports the preload modules (pandas, pyarrow) once, drops querylab's own import hooks from
``sys.path`` / ``sys.meta_path``, opens the sandbox's cgroup base directories and builds the
*template* mount namespace (:func:`~.zygote_server._build_template`: a tmpfs root with read-only
binds of the interpreter, the venv's libraries (querylab's own entries masked) and ``/usr``, a
minimal ``/etc`` and ``/dev``, empty mount points for the per-trial file systems; ``pivot_root``
into it, the host's tree detached). Then it serves a ``SOCK_SEQPACKET`` control socket: each
``open`` request carries one end of a socket pair (``SCM_RIGHTS``); the zygote forks a *session*
into a new PID namespace (``unshare(CLONE_NEWPID)`` before the fork, ``setns`` back after it)
and returns a pidfd of it; when a session ends it removes its cgroups. It never runs agent code.

**Session** (one per trial, PID 1 of the trial's PID namespace): takes new network, IPC and
UTS namespaces and a private copy of the template (``setns`` + ``unshare(CLONE_NEWNS)``: no
host mount is in it), mounts the trial's size-capped tmpfs (work directory ``/home/sandbox``,
``/tmp``, ``/dev/shm``), the cells' output tmpfs and its own ``/proc``, then moves itself into
the trial's cgroups (once: its cells are born there). It serves the harness over its socket:
``put`` / ``get`` / ``rename`` / ``save_output`` files of the work directory (never following a
symlink), ``put_ro`` into the read-only directories of a validator session, ``run`` a cell,
``close``.

**Cell** (one per ``execute_python`` call): forked by the session; it closes every inherited
descriptor, drops to the unprivileged sandbox uid with every capability gone (bounding set too)
and ``no_new_privs``, sets its rlimits, installs a seccomp filter (x86-64: no mount, namespace,
ptrace, bpf, keyring or module system calls), loads ``vars/var_<call_id>.json`` as globals,
installs the run-time audit hook (:func:`~.audit_hook._install_audit_hook`:
``sys.addaudithook``, reporting file, network and process events over a pipe the session reads)
and runs the code. The session enforces the wall and CPU limits and, after the cell, kills every
other process of its PID namespace. Every mechanism the session announced is enforced or the
cell aborts before running any agent code.

**One program, in parts.** The program is kept as the modules of this package, each a part
that imports only the standard library and (relative imports) the parts before it:

- :mod:`.framing` — the sockets' message framing (:func:`send_msg` / :func:`recv_msg`, also
  used by the harness: :mod:`tasks.sandbox.session_client`, :mod:`tasks.sandbox.pool`);
- :mod:`.kernel` — ctypes system calls: namespaces, mounts, prctl, capabilities, bind mounts,
  the cells' seccomp filter;
- :mod:`.state` — ``CONFIG`` and ``_STATE`` (shared by every part) and the template's mount
  points;
- :mod:`.files` — work-directory files, never following a symlink; emptying a tree;
- :mod:`.cgroups` — the trial's cgroups: limits and counters;
- :mod:`.audit_hook` — a cell's run-time audit hook and the reading of its channel;
- :mod:`.cell` — a cell: privileges dropped, rlimits, seccomp, the agent's code run;
- :mod:`.session_server` — a session: its namespaces and file systems, its requests, its cells;
- :mod:`.zygote_server` — the zygote: user namespace, preloads, template, control socket,
  and :func:`~.zygote_server.main`, the program's entry point.

:func:`source` joins them, in the order of :data:`PARTS`, into the one source the launcher
passes to ``python -I -c``: each part's relative imports (and ``from __future__`` import,
hoisted to the top once) are replaced by ``pass``, so the sandbox runs a single stdlib-only
program in one namespace, exactly as when it was one file; nothing of the package is read from
disk inside the sandbox (querylab is not importable there, and the repository is not in the
cells' view). :func:`source` refuses a part that imports anything outside the standard library.
"""

from __future__ import annotations

import ast
import functools
import sys
from pathlib import Path

from .framing import MAX_HEADER_BYTES, recv_msg, send_msg

__all__ = ["MAX_HEADER_BYTES", "PARTS", "recv_msg", "send_msg", "source"]

#: The program's parts (modules of this package), in the order :func:`source` joins them: each
#: imports only the standard library and parts before it; the last one holds the entry point.
PARTS = ("framing", "kernel", "state", "files", "cgroups", "audit_hook", "cell", "session_server",
         "zygote_server")
_HERE = Path(__file__).resolve().parent


def _joined_part(name: str) -> str:
    """The text of part ``name`` with every relative import and its ``from __future__`` import
    replaced by ``pass`` (same indentation; the statement's further lines left blank). Raises
    RuntimeError for an import outside the standard library, a relative import other than
    ``from .<part> import <names>``, or an import sharing its line with another statement."""
    text = (_HERE / f"{name}.py").read_text(encoding="utf-8")
    lines = text.splitlines(keepends=True)
    for node in ast.walk(ast.parse(text, f"{name}.py")):
        if isinstance(node, ast.Import):
            tops = [alias.name.partition(".")[0] for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            tops = [(node.module or "").partition(".")[0]]
        else:
            tops = None
        if tops is not None:
            outside = [t for t in tops if t not in sys.stdlib_module_names]
            if outside:
                raise RuntimeError(f"zygote part {name}.py imports {outside} (line "
                                   f"{node.lineno}): the sandbox's program may import only the "
                                   "standard library")
        if not isinstance(node, ast.ImportFrom) or not (node.level or node.module == "__future__"):
            continue
        if node.level and (node.level != 1 or node.module not in PARTS
                           or any(alias.asname for alias in node.names)):
            raise RuntimeError(f"zygote part {name}.py line {node.lineno}: a relative import "
                               "must be `from .<part> import <names>` (no `as`): the joined "
                               "program has one namespace")
        first, last = lines[node.lineno - 1], lines[node.end_lineno - 1]
        rest = last[node.end_col_offset:].strip()
        if first[:node.col_offset].strip() or rest[:1] not in ("", "#"):
            raise RuntimeError(f"zygote part {name}.py line {node.lineno}: an import to drop "
                               "shares its line with another statement")
        lines[node.lineno - 1] = first[:node.col_offset] + "pass\n"
        for i in range(node.lineno, node.end_lineno):
            lines[i] = "\n"
    return "".join(lines)


@functools.cache
def source() -> str:
    """The zygote program as one Python source (``str``, ~70 kB; one ``argv`` string may be at
    most 128 KiB on Linux) for ``python -I -c``: a ``from __future__ import annotations`` line,
    then every part of :data:`PARTS` in order (see the module docstring), each after a
    ``# ---- <part>.py`` line. Read from this package's files once per process (joining takes
    tens of ms). Raises RuntimeError when a part imports outside the standard library."""
    out = ["# The execute_python sandbox's zygote program: the parts of tasks/sandbox/zygote/ "
           "joined\n# by tasks.sandbox.zygote.source() (standard library only).\n",
           "from __future__ import annotations\n"]
    for name in PARTS:
        out += [f"\n\n# ---- {name}.py\n", _joined_part(name)]
    return "".join(out)
