"""Files in the work directory, never following a symlink (the cell controls its contents):
put / get / rename as the sandbox uid, and emptying a directory tree without recursion.

Part of the zygote program (see :mod:`tasks.sandbox.zygote`): standard library only.
"""

from __future__ import annotations

import errno
import os
import stat
import time

#: Where a cell's stdout / stderr go in a sealed session: a fresh small tmpfs per cell, outside
#: the work directory (a full work directory never stops the next cell from reporting).
OUT_DIR = "/run/cell"
_NOFOLLOW_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _parts(rel: str) -> list[str]:
    parts = rel.split("/")
    if not rel or rel.startswith("/") or any(p in ("", ".", "..") for p in parts) or any(
            len(p.encode()) > 255 for p in parts) or "\0" in rel:
        raise ValueError(f"bad work-directory path {rel[:80]!r}")
    return parts


class _Files:
    """put / get / rename relative to a directory, as the sandbox uid, never following a
    symlink (``O_NOFOLLOW`` on every component) and never opening anything but regular files."""

    def __init__(self, root: str, owner: tuple[int, int] | None):
        self.root = root
        self.owner = owner

    def _dir(self, parts: list[str], create: bool) -> int:
        fd = os.open(self.root, _NOFOLLOW_DIR)
        try:
            for p in parts:
                try:
                    nxt = os.open(p, _NOFOLLOW_DIR, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise
                    os.mkdir(p, 0o755, dir_fd=fd)
                    nxt = os.open(p, _NOFOLLOW_DIR, dir_fd=fd)
                    if self.owner:
                        os.fchown(nxt, *self.owner)
                os.close(fd)
                fd = nxt
        except BaseException:
            os.close(fd)
            raise
        return fd

    def put(self, rel: str, data: bytes) -> None:
        self._write(rel, [data])

    def copy_in(self, rel: str, src_fd: int) -> int:
        """Write the rest of ``src_fd`` to ``rel`` (like :meth:`put`, streamed); returns bytes."""
        return self._write(rel, iter(lambda: os.read(src_fd, 1 << 22), b""))

    def _write(self, rel: str, chunks) -> int:
        """Write ``chunks`` to a new file and rename it over ``rel`` (whatever ``rel`` was, a
        symlink included, is replaced, never written through); returns the bytes written."""
        parts = _parts(rel)
        d = self._dir(parts[:-1], True)
        tmp = f".put-{os.getpid()}-{time.monotonic_ns()}"
        n = 0
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o644, dir_fd=d)
            try:
                for chunk in chunks:
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(fd, view[: 1 << 22]):]
                    n += len(chunk)
                if self.owner:
                    os.fchown(fd, *self.owner)
            finally:
                os.close(fd)
            os.rename(tmp, parts[-1], src_dir_fd=d, dst_dir_fd=d)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=d)
            except OSError:
                pass
            raise
        finally:
            os.close(d)
        return n

    def _open_regular(self, rel: str) -> int:
        parts = _parts(rel)
        d = self._dir(parts[:-1], False)
        try:
            fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                         dir_fd=d)
        finally:
            os.close(d)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise ValueError(f"{rel} is not a regular file")
        return fd

    def head(self, rel: str, limit: int, missing_ok: bool = True) -> tuple[bytes, int]:
        """The first ``limit`` bytes of a file and its size; (b"", 0) when it is missing or
        not a regular file (``missing_ok``; else the OSError / ValueError)."""
        try:
            fd = self._open_regular(rel)
        except (ValueError, OSError):
            if not missing_ok:
                raise
            return b"", 0
        try:
            size = os.fstat(fd).st_size
            chunks, got = [], 0
            while got < limit:
                c = os.read(fd, min(limit - got, 1 << 22))
                if not c:
                    break
                chunks.append(c)
                got += len(c)
            return b"".join(chunks), size
        finally:
            os.close(fd)

    def tail(self, rel: str, limit: int) -> bytes:
        try:
            fd = self._open_regular(rel)
        except (FileNotFoundError, ValueError, OSError):
            return b""
        try:
            size = os.fstat(fd).st_size
            os.lseek(fd, max(size - limit, 0), os.SEEK_SET)
            return os.read(fd, limit)
        finally:
            os.close(fd)

    def rename(self, src: str, dst: str) -> None:
        sp, dp = _parts(src), _parts(dst)
        s = self._dir(sp[:-1], False)
        try:
            d = self._dir(dp[:-1], True)
            try:
                os.rename(sp[-1], dp[-1], src_dir_fd=s, dst_dir_fd=d)
            finally:
                os.close(d)
        finally:
            os.close(s)


def _empty_dir(top: int) -> None:
    """Remove everything inside the directory open as ``top``, never following a symlink.
    No recursion and two descriptors at a time, however deep a cell's tree: each directory's
    subdirectories are first moved up into ``top``, then its files unlinked and it removed."""
    moved = 0
    while True:
        with os.scandir(top) as it:
            entries = [(e.name, e.is_dir(follow_symlinks=False)) for e in it]
        if not entries:
            return
        for name, is_dir in entries:
            if not is_dir:
                os.unlink(name, dir_fd=top)
                continue
            fd = os.open(name, _NOFOLLOW_DIR, dir_fd=top)
            try:
                with os.scandir(fd) as it:
                    inner = [(e.name, e.is_dir(follow_symlinks=False)) for e in it]
                for iname, idir in inner:
                    if not idir:
                        os.unlink(iname, dir_fd=fd)
                        continue
                    while True:  # a free name in top (a cell may have made ".wiped-N" too)
                        moved += 1
                        try:
                            os.rename(iname, f".wiped-{moved}", src_dir_fd=fd, dst_dir_fd=top)
                            break
                        except OSError as exc:
                            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR):
                                raise
            finally:
                os.close(fd)
            os.rmdir(name, dir_fd=top)


def _wipe(path: str, mode: int, owner: tuple[int, int] | None) -> None:
    """Empty the directory ``path`` (never following a symlink) and reset its own mode,
    owner, extended attributes and times."""
    top = os.open(path, _NOFOLLOW_DIR)
    try:
        _empty_dir(top)
        os.fchmod(top, mode)
        if owner:
            os.fchown(top, *owner)
        for attr in os.listxattr(top):
            os.removexattr(top, attr)
        os.utime(top, (0, 0))
    finally:
        os.close(top)
