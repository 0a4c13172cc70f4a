"""File-system permissions of querylab's state and artifact directories.

querylab's answers (ground truth, validators, built databases, the response cache) live in
``QUERYLAB_HOME`` and a local ``QUERYLAB_ARTIFACTS``. Other OS users must not read them: the
embedded PostgreSQL server runs as its own system user (``embedded_postgres`` when querylab
runs as root), and ``execute_python`` cells run unprivileged. So:

- :func:`private_dir`: a directory only its owner can enter (``0700``) — the artifact root and
  every directory under ``QUERYLAB_HOME`` except the server's data directory;
- :func:`traverse_only_dir`: ``0711`` — ``QUERYLAB_HOME`` itself, which the server must cross
  to reach ``<home>/postgres`` but must not list;
- :func:`secure_state`: both, for a :class:`schemas.settings.Settings` and artifact root.

Only directories owned by this process's user are changed (chmod would fail otherwise); a
directory that cannot be tightened is logged, not silently accepted.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

log = logging.getLogger("querylab.fsperm")


#: Entries of ``QUERYLAB_HOME`` whose modes others manage: the PostgreSQL data directory (the
#: server's, ``0700`` by initdb) and the trial working directories (the sandbox's).
_NOT_OURS = frozenset({"postgres", "work"})


def _set_mode(path: Path, mode: int) -> Path:
    st = path.stat()
    if stat.S_IMODE(st.st_mode) != mode:
        if st.st_uid != os.geteuid():
            log.warning("%s is owned by uid %d, not by querylab (uid %d): cannot set its mode "
                        "to %o; other users may read it", path, st.st_uid, os.geteuid(), mode)
            return path
        os.chmod(path, mode)
    return path


def private_dir(path: str | os.PathLike) -> Path:
    """Create ``path`` (and parents) if needed and make it ``0700``; returns it."""
    p = Path(path)
    p.mkdir(parents=True, exist_ok=True)
    return _set_mode(p, 0o700)


def traverse_only_dir(path: str | os.PathLike) -> Path:
    """Create ``path`` if needed and make it ``0711`` (others may cross it, not list it)."""
    p = Path(path)
    p.mkdir(parents=True, exist_ok=True)
    return _set_mode(p, 0o711)


def secure_state(home: str | os.PathLike, artifacts_root: str | None = None) -> None:
    """Tighten querylab's state: ``home`` ``0711``, each of its entries other than the
    PostgreSQL data directory ``0700`` (files ``0600``), and a local ``artifacts_root``
    ``0700``. S3 roots are left alone (their access is the bucket policy's). ``<home>/work``
    (trial working directories when ``/dev/shm`` is missing) is the sandbox's to manage."""
    h = traverse_only_dir(home)
    for entry in h.iterdir():
        if entry.name in _NOT_OURS or entry.is_symlink():
            continue
        try:
            if entry.is_dir():
                _set_mode(entry, 0o700)
            elif entry.is_file():
                _set_mode(entry, 0o600)
        except OSError as exc:  # pragma: no cover - raced with a delete
            log.warning("cannot tighten %s: %s", entry, exc)
    if artifacts_root and ("://" not in artifacts_root or artifacts_root.startswith("file://")):
        private_dir(artifacts_root.removeprefix("file://"))
