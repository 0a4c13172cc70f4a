"""What the ``execute_python`` sandbox takes from the host: the cells' file-system view and
the cgroup directories trial cgroups are created in (see :mod:`tasks.sandbox.session`).

The view (:func:`filesystem_view`) is a list of host paths bound read-only at the same path
(``/usr`` and the ``/lib*`` / ``/bin`` directories or their merged-usr symlinks, the
interpreter's prefix, the venv's ``lib`` directory and ``pyvenv.cfg``), symlinks to recreate
(the venv's ``bin/python*``), a few generated files (``/etc/passwd`` naming the sandbox user,
``/etc/hosts``, ...), the device nodes to bind (``null``, ``zero``, ``full``, ``random``,
``urandom``) and the entries to mask inside the bound trees: every file of the ``querylab``
distribution under site-packages (the editable install's ``.pth`` and finder, its
``dist-info``, or the ``tasks`` / ``schemas`` / ``flows`` / ``querylab`` packages of a
regular install). :func:`check_view` refuses a view that would contain the repository,
``QUERYLAB_HOME``, the artifact root, the work root or Prefect's home.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from pathlib import Path
from tasks.core.settings import Settings, SettingsError, env_get

#: Device nodes a cell may open.
DEVICES = ("null", "zero", "full", "random", "urandom")
#: System directories bound read-only (or recreated as symlinks on merged-usr systems).
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
#: Small /etc files bound read-only when present (the dynamic linker's cache, MIME types).
ETC_BINDS = ("/etc/ld.so.cache", "/etc/mime.types")
#: Where the cells' own file systems are mounted over the template (a view path under one of
#: them would be hidden): the session's work directory is added to these.
SCRATCH_MOUNTS = ("/tmp", "/dev/shm")
#: Where a view tree that lies under a scratch mount is bound instead (``<root>/<n>``); a
#: symlink at its own path (made on the scratch file system by the session) points there.
RELOCATED_ROOT = "/opt/querylab-view"
#: Name prefix of the sandbox's cgroup directories (``<prefix><pid>-<n>``).
CGROUP_PREFIX = "querylab-sandbox-"


def _under(path: str, root: str) -> bool:
    root = root.rstrip("/") or "/"
    return path == root or path.startswith(root + "/") or root == "/"


def _site_dirs() -> list[str]:
    dirs = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    return sorted(d for d in dirs if os.path.isdir(d))


def own_distribution_entries(site_dirs: list[str] | None = None) -> list[str]:
    """Paths under site-packages that belong to the ``querylab`` distribution (its RECORD:
    the editable install's ``.pth`` / finder / compiled finder and the ``dist-info``, or the
    packages of a regular install), plus any ``__editable__*querylab*`` entry."""
    from importlib import metadata

    site_dirs = site_dirs or _site_dirs()
    out: set[str] = set()
    try:
        dist = metadata.distribution("querylab")
        files = list(dist.files or [])
    except metadata.PackageNotFoundError:
        files, dist = [], None
    for f in files:
        p = os.path.normpath(str(dist.locate_file(f)))
        for sp in site_dirs:
            if p.startswith(sp + "/"):
                parts = p[len(sp) + 1:].split("/")
                out.add(p if parts[0] == "__pycache__" else os.path.join(sp, parts[0]))
    for sp in site_dirs:
        for name in os.listdir(sp):
            low = name.lower()
            if low.startswith("__editable__") and "querylab" in low:
                out.add(os.path.join(sp, name))
            if low.startswith("querylab-") and low.endswith((".dist-info", ".egg-info")):
                out.add(os.path.join(sp, name))
        cache = os.path.join(sp, "__pycache__")
        if os.path.isdir(cache):
            for name in os.listdir(cache):
                if name.startswith("__editable__") and "querylab" in name.lower():
                    out.add(os.path.join(cache, name))
    return sorted(out)


def _unused_base_site_packages() -> list[str]:
    """The base interpreter's site-packages when we run in a venv that does not use them
    (``include-system-site-packages = false``): masked, whatever was installed there."""
    if os.path.realpath(sys.prefix) == os.path.realpath(sys.base_prefix):
        return []
    cfg = Path(sys.prefix, "pyvenv.cfg")
    text = cfg.read_text().lower().replace(" ", "") if cfg.is_file() else ""
    if "include-system-site-packages=true" in text:
        return []
    base = sysconfig.get_paths(vars={"base": sys.base_prefix, "platbase": sys.base_exec_prefix})
    return sorted({base[k] for k in ("purelib", "platlib") if os.path.isdir(base[k])})


def filesystem_view(uid: int, gid: int, home: str) -> dict:
    """The cells' file-system view (JSON-able; the session builds it): ``ro`` [[src, dst]],
    ``symlinks`` [[path, target]], ``files`` {path: text}, ``hide`` [path], ``dev`` [name]
    and ``visible`` (the bound prefixes: import paths outside them are dropped)."""
    ro: list[list[str]] = []
    symlinks: list[list[str]] = []
    for top in SYSTEM_DIRS:
        if os.path.islink(top):
            symlinks.append([top, os.readlink(top)])
        elif os.path.isdir(top):
            ro.append([top, top])
    bound = [src for src, _ in ro]

    def add_dir(path: str) -> None:
        logical, path = os.path.abspath(path), os.path.realpath(path)
        if os.path.isdir(path) and not any(_under(path, b) for b in bound):
            ro.append([path, path])
            bound.append(path)
        # reached through a symlink (``.venv -> /elsewhere/.venv``): import paths name the
        # logical path, so it must lead to the bound tree in the view too
        if (os.path.isdir(path) and logical != path
                and not any(_under(logical, b) for b in bound + [p for p, _ in symlinks])):
            symlinks.append([logical, path])

    for prefix in (sys.base_prefix, sys.base_exec_prefix):
        add_dir(prefix)
    venv = os.path.abspath(sys.prefix)
    if os.path.realpath(sys.prefix) != os.path.realpath(sys.base_prefix):
        for sub in ("lib", "lib64"):
            p = os.path.join(venv, sub)
            if os.path.islink(p):
                symlinks.append([p, os.readlink(p)])
            elif os.path.isdir(p):
                add_dir(p)
        cfg = os.path.join(venv, "pyvenv.cfg")
        if os.path.isfile(cfg):
            ro.append([cfg, cfg])
        bindir = os.path.join(venv, "bin")
        if os.path.isdir(bindir):
            for name in sorted(os.listdir(bindir)):
                p = os.path.join(bindir, name)
                if name.startswith("python") and os.path.islink(p):
                    symlinks.append([p, os.readlink(p)])
    for sp in _site_dirs():
        add_dir(sp)
    for f in ETC_BINDS:
        if os.path.isfile(f):
            ro.append([f, f])
    if os.path.islink("/etc/localtime"):
        symlinks.append(["/etc/localtime", os.readlink("/etc/localtime")])
    elif os.path.isfile("/etc/localtime"):
        ro.append(["/etc/localtime", "/etc/localtime"])
    files = {
        "/etc/passwd": (f"root:x:0:0:root:/root:/usr/sbin/nologin\n"
                        f"sandbox:x:{uid}:{gid}:sandbox:{home}:/usr/sbin/nologin\n"
                        "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"),
        "/etc/group": f"root:x:0:\nsandbox:x:{gid}:\nnogroup:x:65534:\n",
        "/etc/hosts": "127.0.0.1 localhost\n::1 localhost\n",
        "/etc/hostname": "sandbox\n",
        "/etc/nsswitch.conf": "passwd: files\ngroup: files\nhosts: files\n",
    }
    if os.path.isfile("/etc/timezone"):
        files["/etc/timezone"] = Path("/etc/timezone").read_text()
    hide = [os.path.join(os.path.realpath(os.path.dirname(p)), os.path.basename(p))
            for p in own_distribution_entries() + _unused_base_site_packages()]
    view = {"ro": ro, "symlinks": symlinks, "files": files, "hide": hide,
            "dev": [d for d in DEVICES if os.path.exists(f"/dev/{d}")]}
    return _relocate_scratch(view, (*SCRATCH_MOUNTS, home))


def _relocate_scratch(view: dict, covered: tuple[str, ...]) -> dict:
    """Move the view's trees and symlinks that lie under a directory a session mounts its
    own file system on (``covered``: /tmp, /dev/shm, the work directory; a repository or venv
    under /tmp would be hidden by it) to ``RELOCATED_ROOT/<n>``, and list in
    ``scratch_links`` the [path, target] symlinks the session makes on its scratch file
    systems so the original paths still lead there. Sets ``visible`` (every path import
    paths may name)."""
    def hidden(path: str) -> bool:
        return any(path == c or path.startswith(c.rstrip("/") + "/") for c in covered)

    moved: list[tuple[str, str]] = []  # (original dst, relocated dst)
    links: list[list[str]] = []
    for i, (src, dst) in enumerate(view["ro"]):
        if hidden(dst):
            new = f"{RELOCATED_ROOT}/{i}"
            view["ro"][i] = [src, new]
            moved.append((dst, new))
            links.append([dst, new])

    def mapped(path: str) -> str:
        for old, new in moved:
            if path == old or path.startswith(old.rstrip("/") + "/"):
                return new + path[len(old):]
        return path

    keep = []
    for path, target in view["symlinks"]:
        target = mapped(target) if os.path.isabs(target) else target
        (links if hidden(path) else keep).append([path, target])
    view["symlinks"] = keep
    view["hide"] = [mapped(p) for p in view["hide"]]
    view["scratch_links"] = links
    view["visible"] = ([dst for _, dst in view["ro"]] + [p for p, _ in keep]
                       + [p for p, _ in links])
    return view


def protected_paths() -> list[str]:
    """Host paths no cell may see: the repository, ``QUERYLAB_HOME``, the artifact root (when
    local), the trials' work root (``QUERYLAB_WORK_DIR``), ``PREFECT_HOME`` and the shared data
    directory (``QUERYLAB_SHARED_DATA``). Each setting is read on its own, so a bad value of
    another variable never drops one of them."""
    out = [str(Path(__file__).resolve().parents[2])]
    for name in ("home", "artifacts", "work_dir", "shared_data"):
        try:
            value = Settings.read(name)
        except SettingsError:  # a bad setting is reported where it is used
            continue
        if value is None:
            continue
        value = str(value)
        if name == "artifacts":
            if "://" in value and not value.startswith("file://"):
                continue
            value = value.removeprefix("file://")
        out.append(value)
    if env_get("PREFECT_HOME"):
        out.append(env_get("PREFECT_HOME"))
    return sorted({os.path.realpath(os.path.expanduser(p)) for p in out})


def check_view(view: dict, protected: list[str] | None = None) -> str | None:
    """None when no protected path lies inside a bound source, else a one-line reason."""
    for src, _ in view["ro"]:
        real = os.path.realpath(src)
        for p in protected if protected is not None else protected_paths():
            if _under(p, real):
                return (f"the sandbox's read-only view would include {p} (it lies under the "
                        f"bound {real}); install querylab and its data outside {real}")
    return None


# -- cgroups -----------------------------------------------------------------------------------


def _mountinfo() -> list[tuple[str, str, str, set[str]]]:
    """(mount point, root inside the file system, fs type, super options) per mount."""
    out = []
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        left, _, right = line.partition(" - ")
        f, r = left.split(), right.split()
        if len(f) >= 5 and len(r) >= 3:
            out.append((f[4].replace("\\040", " "), f[3], r[0], set(r[2].split(","))))
    return out


def _own_cgroups() -> dict[str, str]:
    """controller (or "" for v2) → our cgroup path, from /proc/self/cgroup."""
    out = {}
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        _, ctls, path = line.split(":", 2)
        for c in ctls.split(",") if ctls else [""]:
            out[c] = path
    return out


def _join(mount: str, mount_root: str, path: str) -> str | None:
    if mount_root != "/" and not _under(path, mount_root):
        return None
    rel = path[len(mount_root):] if mount_root != "/" else path
    return os.path.join(mount, rel.lstrip("/"))


def cgroup_dirs() -> tuple[int, dict[str, str]] | None:
    """Our cgroup directories with the controllers the sandbox uses: ``(1, {"memory": dir,
    "pids": dir, "cpu": dir, "cpuacct": dir})`` on cgroup v1 (a controller missing or not
    writable is left out), ``(2, {"unified": dir})`` on a cgroup v2 whose memory and pids
    controllers we may use, or None."""
    own = _own_cgroups()
    mounts = _mountinfo()
    v1: dict[str, str] = {}
    for mnt, root, fstype, opts in mounts:
        if fstype != "cgroup":
            continue
        for ctl in ("memory", "pids", "cpu", "cpuacct"):
            if ctl in opts and ctl in own and ctl not in v1:
                d = _join(mnt, root, own[ctl])
                if d and os.path.isdir(d) and os.access(d, os.W_OK):
                    v1[ctl] = d
    if "memory" in v1 and "pids" in v1:
        return 1, v1
    for mnt, root, fstype, _ in mounts:
        if fstype == "cgroup2" and "" in own:
            d = _join(mnt, root, own[""])
            try:
                ctls = set(Path(d, "cgroup.controllers").read_text().split())
            except (OSError, TypeError):
                continue
            if {"memory", "pids"} <= ctls and os.access(d, os.W_OK):
                return 2, {"unified": d}
    return (1, v1) if v1 else None


def cgroup_reason(ctl: str) -> str:
    """Why this process cannot give cells a cgroup limit of controller ``ctl`` (``memory``,
    ``pids`` or ``cpu``): not mounted, our cgroup not visible, read-only or not delegated."""
    own, mounts = _own_cgroups(), _mountinfo()
    v1 = [(m, r) for m, r, t, o in mounts if t == "cgroup" and ctl in o]
    v2 = [(m, r) for m, r, t, _ in mounts if t == "cgroup2"]
    for mnt, root in v1:
        d = _join(mnt, root, own.get(ctl, "/"))
        if not d or not os.path.isdir(d):
            return f"our {ctl} cgroup ({own.get(ctl)}) is not visible under {mnt}"
        if not os.access(d, os.W_OK):
            if os.statvfs(d).f_flag & os.ST_RDONLY:
                return f"{d} is mounted read-only"
            return f"{d} is not writable by uid {os.geteuid()} (not delegated to this user)"
        return f"{d} is writable, but the session's cgroup could not be made there"
    for mnt, root in v2:
        d = _join(mnt, root, own.get("", "/"))
        try:
            ctls = set(Path(d or "", "cgroup.controllers").read_text().split())
        except OSError as exc:
            return f"cgroup v2 at {mnt}: our cgroup {d} is not readable ({exc.strerror})"
        if ctl not in ctls:
            return f"cgroup v2 at {mnt}: the {ctl} controller is not enabled for {d}"
        if not os.access(d or "", os.W_OK):
            return f"cgroup v2: {d} is not writable by uid {os.geteuid()} (not delegated)"
        return f"cgroup v2: {d} is writable, but the session's cgroup could not be made there"
    return f"no cgroup hierarchy with the {ctl} controller is mounted"


def create_cgroup_base(name: str) -> dict | None:
    """Create ``<our cgroup>/<name>`` for each controller; returns ``{"version", "dirs"}``
    (JSON-able, passed to the zygote) or None when no cgroup can be created here. On v2 the
    memory, pids and cpu controllers are enabled for the new directory's children."""
    found = cgroup_dirs()
    if found is None:
        return None
    version, dirs = found
    made: dict[str, str] = {}
    for ctl, parent in dirs.items():
        d = os.path.join(parent, name)
        try:
            os.makedirs(d, exist_ok=True)
        except OSError:
            continue
        made[ctl] = d
    if version == 2 and "unified" in made:
        d, parent = made["unified"], dirs["unified"]
        try:
            enabled = set(Path(parent, "cgroup.subtree_control").read_text().split())
            want = {"memory", "pids", "cpu"} & set(
                Path(parent, "cgroup.controllers").read_text().split())
            if want - enabled:
                Path(parent, "cgroup.subtree_control").write_text(
                    " ".join(f"+{c}" for c in sorted(want - enabled)))
            Path(d, "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in sorted(want)))
        except OSError:
            remove_cgroup_base({"version": 2, "dirs": made})
            return None
    return {"version": version, "dirs": made} if made else None


def remove_cgroup_base(base: dict | None, kill: bool = True) -> None:
    """Remove a base directory and the session directories left in it (with ``kill``, their
    processes are killed first: a session killed with SIGKILL cannot remove its own)."""
    for d in set((base or {}).get("dirs", {}).values()):
        try:
            children = [e.path for e in os.scandir(d) if e.is_dir()]
        except OSError:
            continue
        for c in children:
            if kill:
                _kill_cgroup(c)
            _rmdir(c, 100 if kill else 1)
        _rmdir(d, 100 if kill else 1)


def _kill_cgroup(d: str) -> None:
    try:
        pids = Path(d, "cgroup.procs").read_text().split()
    except OSError:
        return
    for p in pids:
        try:
            os.kill(int(p), 9)
        except (OSError, ValueError):
            pass


def _rmdir(d: str, tries: int) -> None:
    import time

    for _ in range(tries):
        try:
            os.rmdir(d)
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.01)


def sweep_stale_cgroups() -> None:
    """Remove the empty cgroup directories of sandboxes whose process (named in the directory)
    is gone; never kills anything (a directory still holding a process stays)."""
    found = cgroup_dirs()
    if found is None:
        return
    for parent in set(found[1].values()):
        try:
            entries = [e for e in os.scandir(parent) if e.name.startswith(CGROUP_PREFIX)]
        except OSError:
            continue
        for e in entries:
            pid = e.name[len(CGROUP_PREFIX):].split("-")[0]
            if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
                remove_cgroup_base({"dirs": {"x": e.path}}, kill=False)
