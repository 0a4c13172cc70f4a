"""The trial's cgroups (v1: one directory per controller; v2: one directory), created under
the sandbox's base directories: limits set per cell, counters read after.

Part of the zygote program (see :mod:`tasks.sandbox.zygote`): standard library only.
"""

from __future__ import annotations

import os
import signal

from .files import _NOFOLLOW_DIR


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
