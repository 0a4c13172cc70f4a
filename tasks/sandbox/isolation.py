"""What the ``execute_python`` sandbox isolates a cell by, and the names it shares: the
mechanisms (:data:`REQUIRED_MECHANISMS`, :data:`OPTIONAL_MECHANISMS`, the resource-only
:data:`RESOURCE_MECHANISMS`), a machine's measured :class:`Isolation`, the sandbox's errors
(:class:`SandboxError` and its kinds), its fixed environment, uid and paths
(:func:`sandbox_env`), and the report lines of a run whose cells lacked a mechanism
(:func:`missing_text`, :func:`sandbox_notes`). See :mod:`tasks.sandbox.session`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from tasks.core.settings import Settings, env_subset
from tasks.core.layout import RunLayout

#: Environment variables the sandbox keeps (everything else, keys and URLs included, is dropped).
SAFE_ENV = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ")
#: Fixed variables for the sandbox: single-threaded BLAS/Arrow (fork-safe), no GUI backends.
SANDBOX_ENV = {
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "MPLBACKEND": "Agg",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONHASHSEED": "0",
}
DEFAULT_PRELOAD = ("pandas", "pyarrow")
#: The work directory of a cell (its cwd and ``HOME``) inside the sandbox.
SANDBOX_HOME = "/home/sandbox"
#: Where :func:`run_in_folder` shows its folder (read-only, the cell's cwd) and libraries.
TASK_DIR, LIB_DIR = "/task", "/opt/querylab-lib"

#: Mechanisms an LLM agent's cells need (name → what it is, for messages).
REQUIRED_MECHANISMS = {
    "filesystem_view": "a private file-system view (mount namespace + pivot_root)",
    "tmpfs_size_cap": "a size-capped tmpfs work directory",
    "pid_namespace": "a PID namespace per cell",
    "network_namespace": "a network namespace (no network)",
    "ipc_namespace": "an IPC namespace",
    "unprivileged_uid": "an unprivileged uid",
    "capabilities_dropped": "capabilities dropped",
    "no_new_privs": "no_new_privs",
    "cgroup_memory": "a cgroup memory limit",
    "cgroup_pids": "a cgroup process-count limit",
    "cgroup_cpu": "cgroup CPU accounting",
}
#: Extra hardening reported when present, not required.
OPTIONAL_MECHANISMS = {
    "uts_namespace": "a UTS namespace",
    "seccomp": "a seccomp system-call filter",
}
#: The uid / gid cells run as when querylab runs as root (``QUERYLAB_SANDBOX_UID`` /
#: ``QUERYLAB_SANDBOX_GID``, read on import; the gid defaults to the uid).
SANDBOX_UID: int = Settings.read("sandbox_uid")
_GID: int | None = Settings.read("sandbox_gid")
SANDBOX_GID: int = SANDBOX_UID if _GID is None else _GID
#: Bytes in a MiB (the limits are given in MiB).
_MiB = 1024 * 1024


class SandboxError(RuntimeError):
    """The sandbox itself failed (could not start, a session died, a file operation failed)."""


class WorkdirError(SandboxError):
    """A file operation on the trial's work directory failed because of what the cells left in
    it (it is full; a directory, FIFO or other non-file where querylab writes ``vars/…``):
    the agent's doing, so a tool error the model sees, unlike every other
    :class:`SandboxError` (the sandbox failing). Were it a harness error, a cell could plant
    ``vars/var_<id>.json/`` and have its failing trial left out of the score as errored."""


class WorkdirFull(WorkdirError):
    """The trial's work directory is full (the cells filled it)."""


class SandboxUnavailable(SandboxError):
    """This machine cannot isolate cells: ``missing`` names the mechanisms it lacks."""

    def __init__(self, missing: list[str], detail: str = ""):
        self.missing = list(missing)
        text = ", ".join(REQUIRED_MECHANISMS.get(m, m) for m in self.missing)
        super().__init__(
            f"execute_python cannot be isolated on this machine: missing {text}"
            + (f" ({detail})" if detail else "")
        )


@dataclass(frozen=True)
class Isolation:
    """Which isolation mechanisms this machine provides (``mechanisms``: name → bool, see
    :data:`REQUIRED_MECHANISMS` / :data:`OPTIONAL_MECHANISMS`; ``notes``: name → why not)."""

    mechanisms: dict[str, bool]
    notes: dict[str, str] = field(default_factory=dict)

    @property
    def missing(self) -> list[str]:
        """Required mechanisms this machine lacks (empty: cells are isolated)."""
        return [m for m in REQUIRED_MECHANISMS if not self.mechanisms.get(m)]

    @property
    def ok(self) -> bool:
        return not self.missing

    def describe(self) -> dict:
        """JSON-able: ``isolated``, ``missing``, ``mechanisms``, ``notes``."""
        return {"isolated": self.ok, "missing": self.missing,
                "mechanisms": dict(self.mechanisms), "notes": dict(self.notes)}

    def error(self) -> SandboxUnavailable:
        detail = "; ".join(f"{k}: {v}" for k, v in self.notes.items() if k in self.missing
                           or k == "error")
        return SandboxUnavailable(self.missing, detail)


def sandbox_env(cpus: float = 1.0) -> dict[str, str]:
    """The environment of sandboxed code: :data:`SAFE_ENV` from ours plus :data:`SANDBOX_ENV`
    (Polars limited to ``ceil(cpus)`` threads)."""
    env = env_subset(SAFE_ENV)
    env.update(SANDBOX_ENV)
    env["POLARS_MAX_THREADS"] = str(max(1, math.ceil(cpus)))
    return env


#: Mechanisms that only bound resources: without them a cell can use more memory, processes,
#: CPU or disk than its limits, but still sees nothing of the host.
RESOURCE_MECHANISMS = ("cgroup_memory", "cgroup_pids", "cgroup_cpu", "tmpfs_size_cap")


def missing_text(missing: list[str]) -> str:
    """What ``missing`` mechanisms (an unsafe run's) mean for its scores, in one sentence:
    resource limits only (the answer key stayed out of reach) or the isolation itself."""
    if not missing:
        return "nothing was missing"
    names = ", ".join(f"{m}: {REQUIRED_MECHANISMS[m]}" if m in REQUIRED_MECHANISMS else m
                      for m in missing)
    if all(m in RESOURCE_MECHANISMS for m in missing):
        return (f"only resource limits were missing ({names}); the file-system view, "
                "unprivileged uid and namespaces held, so the cells could not reach the answer "
                "key or the host, but a cell could use more memory, processes or CPU than its "
                "limits say")
    return (f"missing {names}: the cells may have reached the answer key or the host, so the "
            "scores are not sealed")


def sandbox_notes(artifacts_root: str, run_id: str) -> list[str]:
    """Report lines for a run whose LLM agents ran with ``--unsafe-sandbox`` (read from
    ``runs/<run_id>/trials/agents.json``, written by :func:`tasks.trials.stage.describe_agents`);
    empty otherwise."""
    from tasks.core import storage

    uri = RunLayout(artifacts_root, run_id).trials("agents.json")
    if not storage.exists(uri):
        return []
    notes = []
    for d in storage.read_json(uri):
        sb = d.get("sandbox") or {}
        if not sb.get("unsafe_sandbox"):
            continue
        if sb.get("missing"):
            how = ("its `execute_python` cells ran WITHOUT full isolation: "
                   + missing_text(sb["missing"]))
        else:
            how = "this machine still isolated its `execute_python` cells (nothing was missing)"
        notes.append(f"UNSAFE SANDBOX: `{d['agent']}` ran with --unsafe-sandbox; {how}.")
    return notes
