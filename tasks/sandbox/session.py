"""The ``execute_python`` sandbox: sealed, unprivileged, resource-limited Python cells.

Shape: one :class:`Sandbox` per process (:func:`shared_sandbox`) owns a *zygote* — a
``python -I`` process started with an environment stripped of secrets (only ``PATH``, locale
and time-zone variables survive) that imports pandas and pyarrow once and builds the cells'
read-only root file system once (a *template* mount namespace). Each trial opens a
:class:`Session` (forked from the zygote, no interpreter start-up; a warm spare is prepared
in the background, so opening one is a hand-over), each ``execute_python`` call is a *cell*
forked from its session. Sessions are independent processes with their own socket: many
trials run cells concurrently from one zygote (thread-safe; only the fork of a session is
serialised). The processes' code is :mod:`tasks.sandbox.zygote` (one stdlib-only program,
kept in parts).

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

Where the code is (this module re-exports the names callers use, and is the
``python -m tasks.sandbox.session`` mechanism report):

- :mod:`tasks.sandbox.isolation` — the mechanisms, :class:`Isolation`, the errors, the sandbox's
  environment, uid and paths, the report lines of an unsafe run;
- :mod:`tasks.sandbox.session_client` — :class:`Session` (the protocol client of one session)
  and :class:`CellResult`;
- :mod:`tasks.sandbox.pool` — :class:`Sandbox` (the zygote, the warm pool, the probe) and
  :func:`shared_sandbox`; its tunables (:data:`~tasks.sandbox.pool.MAX_SPARES`,
  :data:`~tasks.sandbox.pool.RESERVE_WORKERS`) are read there, so set them there;
- :mod:`tasks.sandbox.validator` — :func:`run_in_folder` / :func:`run_validator`;
- :mod:`tasks.sandbox.host` — the file-system view and cgroup directories taken from the host.
"""

from __future__ import annotations

import json

from tasks.sandbox.isolation import (
    DEFAULT_PRELOAD,
    LIB_DIR,
    OPTIONAL_MECHANISMS,
    REQUIRED_MECHANISMS,
    RESOURCE_MECHANISMS,
    SAFE_ENV,
    SANDBOX_ENV,
    SANDBOX_GID,
    SANDBOX_HOME,
    SANDBOX_UID,
    TASK_DIR,
    Isolation,
    SandboxError,
    SandboxUnavailable,
    WorkdirError,
    WorkdirFull,
    missing_text,
    sandbox_env,
    sandbox_notes,
)
from tasks.sandbox.pool import Sandbox, _close_all, detect_isolation, shared_sandbox, thread_sandbox
from tasks.sandbox.session_client import CellResult, Session
from tasks.sandbox.validator import run_in_folder, run_validator

__all__ = [
    "DEFAULT_PRELOAD", "LIB_DIR", "OPTIONAL_MECHANISMS", "REQUIRED_MECHANISMS",
    "RESOURCE_MECHANISMS", "SAFE_ENV", "SANDBOX_ENV", "SANDBOX_GID", "SANDBOX_HOME", "SANDBOX_UID",
    "TASK_DIR", "CellResult", "Isolation", "Sandbox", "SandboxError", "SandboxUnavailable",
    "Session", "WorkdirError", "WorkdirFull", "_close_all", "detect_isolation", "missing_text",
    "run_in_folder", "run_validator", "sandbox_env", "sandbox_notes", "shared_sandbox",
    "thread_sandbox",
]


if __name__ == "__main__":  # python -m tasks.sandbox.session: what this machine provides
    print(json.dumps(detect_isolation().describe(), indent=2))
