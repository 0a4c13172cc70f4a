"""The lease of a run: ``runs/<run_id>/lease.json`` names the one process running a run id, so
two ``querylab run`` / ``rerun`` of one id never both call (and pay) the model."""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime

from tasks.core import storage
from tasks.core.layout import RunLayout
from tasks.core.run_ids import LeaseHeld, now_iso, valid_run_id

log = logging.getLogger("querylab.runs")


LEASE_TTL_S = 300.0
LEASE_RENEW_S = 60.0


def lease_uri(artifacts_root: str, run_id: str) -> str:
    """URI of ``runs/<run_id>/lease.json``."""
    return RunLayout(artifacts_root, valid_run_id(run_id)).lease


def _process_started(pid: int) -> float | None:
    try:
        import psutil

        return psutil.Process(pid).create_time()
    except Exception:  # noqa: BLE001 - no such process (or no psutil)
        return None


def _epoch(stamp: str | None) -> float:
    try:
        return datetime.strptime(str(stamp), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return 0.0


def lease_is_stale(holder: dict, now: float | None = None) -> bool:
    """True when the process named by a lease record is gone: on this host, its pid is dead
    or belongs to a newer process (pid reuse); on another host, the lease was not renewed for
    :data:`LEASE_TTL_S` seconds. An unreadable record is stale."""
    now = time.time() if now is None else now
    if not isinstance(holder, dict) or "pid" not in holder:
        return True
    if holder.get("host") == socket.gethostname():
        started = _process_started(int(holder["pid"]))
        recorded = holder.get("pid_started")
        return started is None or (recorded is not None and abs(started - float(recorded)) > 1.0)
    return now - _epoch(holder.get("renewed_at")) > LEASE_TTL_S


class _Lease:
    """A lease this process holds (re-entrant: nested :func:`run_lease` share it)."""

    def __init__(self, root: str, run_id: str):
        self.root, self.run_id, self.uri = root, run_id, lease_uri(root, run_id)
        self.count = 0
        self.etag: str | None = None
        self.record = {
            "run_id": run_id, "host": socket.gethostname(), "pid": os.getpid(),
            "pid_started": _process_started(os.getpid()), "since": now_iso(),
            "renewed_at": now_iso(), "token": secrets.token_hex(16),
        }
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- local ---------------------------------------------------------------------------
    @contextmanager
    def _flock(self):
        import fcntl

        from tasks.core.fsperm import private_dir

        path = storage._local(self.uri)
        private_dir(storage._local(self.root))
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path.with_name(".lease.lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield path
        finally:
            os.close(fd)  # closing releases the lock

    def _read_local(self, path) -> dict | None:
        try:
            return json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return {}

    # -- S3 ------------------------------------------------------------------------------
    def _s3_put(self, **cond) -> str | None:
        """PUT the record with a condition (``IfNoneMatch='*'`` / ``IfMatch=etag``); its ETag,
        or None when the condition failed (412/409)."""
        from botocore.exceptions import ClientError

        bucket, key = storage._split(self.uri)
        body = json.dumps(self.record, indent=2, sort_keys=True).encode()
        try:
            resp = storage._s3().put_object(Bucket=bucket, Key=key, Body=body, **cond)
        except ClientError as exc:
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            code = exc.response.get("Error", {}).get("Code", "")
            if status in (409, 412) or code in ("PreconditionFailed", "ConditionalRequestConflict"):
                return None
            raise storage.StorageError(f"{self.uri}: lease write failed: {exc}") from exc
        return resp.get("ETag")

    def _s3_get(self) -> tuple[dict | None, str | None]:
        from botocore.exceptions import ClientError

        bucket, key = storage._split(self.uri)
        try:
            obj = storage._s3().get_object(Bucket=bucket, Key=key)
        except ClientError as exc:
            if storage._is_missing(exc):
                return None, None
            raise storage.StorageError(f"{self.uri}: lease read failed: {exc}") from exc
        try:
            return json.loads(obj["Body"].read()), obj.get("ETag")
        except ValueError:
            return {}, obj.get("ETag")

    def _s3_confirm(self, etag: str | None) -> bool:
        """Read-after-write: the stored lease is ours (a server that ignores conditional
        writes lets the last writer win; both writers read back and one sees the other)."""
        if etag is None:
            return False
        stored, _ = self._s3_get()
        return bool(stored) and stored.get("token") == self.record["token"]

    # -- acquire / renew / release -------------------------------------------------------
    def acquire(self) -> None:
        """Take the lease or raise :class:`LeaseHeld` naming its live holder; a stale lease
        (see :func:`lease_is_stale`) is taken over, with a warning."""
        if storage.is_s3(self.uri):
            etag = self._s3_put(IfNoneMatch="*")
            if etag is None:
                holder, old = self._s3_get()
                if holder is not None and not lease_is_stale(holder):
                    raise LeaseHeld(self.run_id, self.uri, holder)
                log.warning("run %s: taking over the stale lease of pid %s on %s", self.run_id,
                            (holder or {}).get("pid"), (holder or {}).get("host"))
                etag = self._s3_put(IfMatch=old) if old else self._s3_put(IfNoneMatch="*")
            if not self._s3_confirm(etag):
                holder, _ = self._s3_get()
                raise LeaseHeld(self.run_id, self.uri, holder or {})
            self.etag = etag
        else:
            with self._flock() as path:
                holder = self._read_local(path)
                if holder is not None:
                    if not lease_is_stale(holder):
                        raise LeaseHeld(self.run_id, self.uri, holder)
                    log.warning("run %s: taking over the stale lease of pid %s on %s since %s",
                                self.run_id, holder.get("pid"), holder.get("host"),
                                holder.get("since"))
                storage.write_json(self.uri, self.record)
        self._thread = threading.Thread(target=self._renew_loop, daemon=True,
                                        name=f"lease-{self.run_id}")
        self._thread.start()

    def _renew_loop(self) -> None:
        while not self._stop.wait(LEASE_RENEW_S):
            try:
                self.renew()
            except Exception as exc:  # noqa: BLE001 - keep running; the lease may go stale
                log.warning("run %s: could not renew its lease: %s", self.run_id, exc)

    def renew(self) -> None:
        """Record that the holder is alive (``renewed_at``), if the lease is still ours."""
        self.record["renewed_at"] = now_iso()
        if storage.is_s3(self.uri):
            etag = self._s3_put(IfMatch=self.etag) if self.etag else None
            if etag is None:
                log.warning("run %s: its lease was taken over by another process", self.run_id)
            self.etag = etag or self.etag
            return
        with self._flock() as path:
            current = self._read_local(path)
            if current and current.get("token") == self.record["token"]:
                storage.write_json(self.uri, self.record)

    def release(self) -> None:
        """Stop renewing and remove the lease if it is still ours."""
        self._stop.set()
        if storage.is_s3(self.uri):
            current, etag = self._s3_get()
            if current and current.get("token") == self.record["token"]:
                bucket, key = storage._split(self.uri)
                storage._s3().delete_object(Bucket=bucket, Key=key)
            return
        with self._flock() as path:
            current = self._read_local(path)
            if current and current.get("token") == self.record["token"]:
                path.unlink(missing_ok=True)


_LEASES: dict[tuple[str, str], _Lease] = {}
_LEASES_LOCK = threading.Lock()


@contextmanager
def run_lease(artifacts_root: str, run_id: str) -> Iterator[dict]:
    """Hold the lease on ``run_id`` for the block: ``runs/<run_id>/lease.json`` names this
    process (``host``, ``pid``, ``since``, renewed every :data:`LEASE_RENEW_S` s).

    A second process asking for a live lease gets :class:`LeaseHeld` at once (the message
    names the holder); a stale one (its process is dead, or on another host not renewed for
    :data:`LEASE_TTL_S` s) is taken over. Re-entrant within a process (the CLI, the benchmark
    flow and each stage take it; one lease is shared). Local roots: an ``flock``-guarded file
    (the root is made ``0700``); S3: conditional PUT (``If-None-Match: *`` to create,
    ``If-Match: <etag>`` to take over or renew) plus a read-back, so a server that ignores the
    conditions still lets only one writer believe it won. Yields the lease record."""
    key = (artifacts_root, valid_run_id(run_id))
    with _LEASES_LOCK:
        lease = _LEASES.get(key)
        if lease is None:
            lease = _Lease(artifacts_root, run_id)
            lease.acquire()
            _LEASES[key] = lease
        lease.count += 1
    try:
        yield dict(lease.record)
    finally:
        with _LEASES_LOCK:
            lease.count -= 1
            last = lease.count == 0
            if last:
                _LEASES.pop(key, None)
        if last:
            try:
                lease.release()
            except Exception as exc:  # noqa: BLE001 - the lease goes stale with this process
                log.warning("run %s: could not release its lease: %s", run_id, exc)


def lease_alive(artifacts_root: str, run_id: str) -> bool:
    """True when a live process holds the run's lease (see :func:`lease_is_stale`)."""
    uri = lease_uri(artifacts_root, run_id)
    try:
        return storage.exists(uri) and not lease_is_stale(storage.read_json(uri))
    except Exception:  # noqa: BLE001 - an unreadable lease holds nothing
        return False
