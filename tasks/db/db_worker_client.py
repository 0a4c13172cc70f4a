"""querylab's side of the query workers (:mod:`tasks.db.db_worker`): starting a worker process
on first use with a minimal environment, handing it requests over its control socket,
restarting it when it died, killing it past the time limit (:class:`SqlWorker`, this process's
:func:`sql_worker`), and the mongomock client whose database lives in the zygote
(:class:`MockMongoClient`, :class:`MockMongoDatabase`).

Split out of :mod:`tasks.db.db_worker`; the code moved verbatim. The worker process itself runs
``python -m tasks.db.db_worker`` and never imports this module."""

from __future__ import annotations

import atexit
import json
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from tasks.core.settings import env_subset
from tasks.db.db_worker import (
    GRACE_S,
    MONGO_QUERY_MEMORY_MB,
    SQL_WORKER_MEMORY_MB,
    START_TIMEOUT_S,
    _HDR,
    _recv,
    _recv_exact,
    _send,
)
from tasks.db.results import ColumnInfo, QueryError, QueryResult, ResultLimits, TableInfo


#: Environment variables a worker keeps (everything else, keys and URLs included, is dropped).
_SAFE_ENV = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ")


class WorkerError(RuntimeError):
    """A worker process could not be started."""


def _worker_env() -> dict[str, str]:
    env = env_subset(_SAFE_ENV)
    env.setdefault("PATH", "/usr/bin:/bin")
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["MALLOC_ARENA_MAX"] = "2"  # fewer malloc arenas: less memory kept after huge queries
    return env


class _Worker:
    """One worker process of ``kind`` (``"sql"`` or ``"mongomock"``), started on first use
    and restarted when it died. Thread-safe."""

    def __init__(self, kind: str, memory_mb: int):
        self.kind, self.memory_mb = kind, memory_mb
        self._lock = threading.RLock()
        self._proc: subprocess.Popen | None = None
        self._ctrl: socket.socket | None = None
        self.generation = 0
        atexit.register(self.stop)
        os.register_at_fork(after_in_child=self._forget)

    def _forget(self) -> None:
        """In a forked child of querylab: start its own worker on first use (the parent's
        stays the parent's; a lock held at the fork is not inherited)."""
        self._lock = threading.RLock()
        if self._ctrl is not None:
            self._ctrl.close()  # this process's copy only: the parent's worker is unaffected
        self._proc = self._ctrl = None

    def _alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None and self._ctrl is not None

    def _spawn(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "tasks.db.db_worker", self.kind, str(theirs.fileno()),
                 str(self.memory_mb)],
                pass_fds=(theirs.fileno(),), env=_worker_env(), cwd="/",
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True,
            )
        finally:
            theirs.close()
        ours.settimeout(START_TIMEOUT_S)
        try:
            ready = ours.recv(16)
        except OSError:
            ready = b""
        if ready != b"ready":
            proc.kill()
            proc.wait()
            ours.close()
            raise WorkerError(f"the {self.kind} query worker did not start "
                              f"(exit status {proc.poll()})")
        ours.settimeout(None)
        self._proc, self._ctrl = proc, ours
        self.generation += 1
        self._started()

    def _started(self) -> None:
        """Hook: runs (under the lock) after every (re)start."""

    def kill(self, generation: int | None = None) -> None:
        """Kill the worker (and its children) unless it was restarted since ``generation``."""
        with self._lock:
            if generation is not None and generation != self.generation:
                return
            proc, ctrl = self._proc, self._ctrl
            self._proc = self._ctrl = None
        if ctrl is not None:
            ctrl.close()
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:  # pragma: no cover - raced with its exit
                pass
            proc.wait()

    def start(self) -> None:
        """Start the worker now unless it runs (:class:`WorkerError` when it cannot start)."""
        with self._lock:
            if not self._alive():
                self.kill()
                self._spawn()

    def stop(self) -> None:
        """Stop the worker (it exits when its control socket closes)."""
        self.kill()

    def pid(self) -> int | None:
        """The worker's process id while it runs (tests, diagnostics)."""
        with self._lock:
            return self._proc.pid if self._alive() else None

    def submit(self, op: bytes) -> tuple[socket.socket, int]:
        """Hand the worker a new request socket for ``op``; returns querylab's end and the
        worker generation that got it. Starts or restarts the worker as needed."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with self._lock:
                for attempt in (1, 2):
                    if not self._alive():
                        self.kill()
                        self._spawn()
                    try:
                        socket.send_fds(self._ctrl, [op], [theirs.fileno()])
                        return ours, self.generation
                    except OSError:
                        self.kill()
                        if attempt == 2:
                            raise
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        raise AssertionError("unreachable")  # pragma: no cover


class SqlWorker(_Worker):
    """The SQL worker (see the module docstring). A worker whose resident memory passed
    ``recycle_mb`` after a query (DuckDB and malloc keep what a huge query took) is replaced:
    the next request starts a new one, the old one finishes what it has and exits."""

    def __init__(self, memory_mb: int = SQL_WORKER_MEMORY_MB, recycle_mb: int | None = None):
        super().__init__("sql", memory_mb)
        self.recycle_mb = recycle_mb or max(512, memory_mb // 4)
        self._retired: list[subprocess.Popen] = []

    def _death(self, generation: int) -> str:
        """Why the worker of ``generation`` stopped answering (it is replaced)."""
        with self._lock:
            proc = self._proc if generation == self.generation else None
        status = None
        if proc is not None:
            try:
                status = proc.wait(2)
            except subprocess.TimeoutExpired:
                pass
        self.kill(generation)
        if status in (3, -signal.SIGKILL):
            return (f"the query ran out of memory (queries may use at most {self.memory_mb} "
                    "MiB; select less, or aggregate in SQL)")
        return "the query worker process died while running this query (a new one is started)"

    def retire(self, generation: int) -> None:
        """Let the worker of ``generation`` finish its requests and exit; the next request
        starts a new one."""
        with self._lock:
            if generation != self.generation or self._proc is None:
                return
            proc, ctrl = self._proc, self._ctrl
            self._proc = self._ctrl = None
            self._retired = [p for p in self._retired if p.poll() is None] + [proc]
        if ctrl is not None:
            ctrl.close()  # the worker sees the end of its control socket and winds down

    def run(self, request: dict, timeout_s: float, reply_limit: int) -> dict:
        """Run one query request (``{"engine", "path", "sql", "timeout_ms", "limits"}``) and
        return its result as :meth:`QueryResult.to_json` made it. Raises QueryError with the
        engine's message, or when the worker died or did not answer in time (it is then
        killed; the next request starts a new one)."""
        sock, generation = self.submit(b"sql")
        deadline = time.monotonic() + timeout_s + GRACE_S
        try:
            try:
                sock.settimeout(GRACE_S)
                _send(sock, pickle.dumps(request))
                data = _recv(sock, deadline, limit=4 * reply_limit + (1 << 20))
            except TimeoutError:
                self.kill(generation)
                raise QueryError(
                    f"Query timed out after {request['timeout_ms']} ms (the engine did not stop "
                    "it, so its worker process was killed).") from None
            except (EOFError, OSError):
                raise QueryError(self._death(generation)) from None
        finally:
            sock.close()
        reply = _decode(data)
        rss = reply.get("rss_mb")
        if isinstance(rss, int) and rss > self.recycle_mb:
            self.retire(generation)
        return _parse_reply(reply, "result")


def _decode(data: bytes) -> dict:
    try:
        reply = json.loads(data)
    except ValueError:
        raise QueryError("the query worker sent a reply that is not JSON") from None
    if not isinstance(reply, dict):
        raise QueryError("the query worker sent a malformed reply")
    return reply


def _parse_reply(reply: bytes | dict, key: str) -> Any:
    if not isinstance(reply, dict):
        reply = _decode(reply)
    if not reply.get("ok"):
        raise QueryError(str(reply.get("error") or "the query failed")[:1000])
    return reply.get(key)


class MockMongoClient(_Worker):
    """The mongomock fallback behind :func:`tasks.db.databases.mongo_client` ``(None)``:
    ``client[name]`` is a :class:`MockMongoDatabase`. Documents loaded are kept here (pickled)
    so a restarted zygote gets them back."""

    def __init__(self, memory_mb: int = MONGO_QUERY_MEMORY_MB):
        super().__init__("mongomock", memory_mb)
        self._kept: dict[str, dict[str, bytes]] = {}
        self._versions: dict[str, str] = {}
        self._dbs: dict[str, MockMongoDatabase] = {}

    def __getitem__(self, name: str) -> "MockMongoDatabase":
        with self._lock:
            if name not in self._dbs:
                self._dbs[name] = MockMongoDatabase(self, name)
            return self._dbs[name]

    def _started(self) -> None:
        for db, colls in self._kept.items():
            self._load_now(db, colls)

    def _load_now(self, db: str, colls: dict[str, bytes]) -> None:
        sock, _ = self.submit(b"load")
        try:
            _send(sock, pickle.dumps({"db": db, "collections": colls}))
            _parse_reply(_recv(sock, time.monotonic() + 3600, limit=1 << 20), "ok")
        except (EOFError, OSError, TimeoutError) as exc:
            raise QueryError(f"the mongomock worker failed while loading {db!r}: {exc!r}") from None
        finally:
            sock.close()

    def load(self, db: str, collections: dict[str, list[dict]]) -> None:
        """Replace ``collections`` (name -> documents) of database ``db``."""
        pickled = {name: pickle.dumps(docs, protocol=pickle.HIGHEST_PROTOCOL)
                   for name, docs in collections.items()}
        with self._lock:
            self._kept.setdefault(db, {}).update(pickled)
            self._load_now(db, pickled)

    def request(self, op: str, payload: dict, timeout_ms: int, reply_limit: int) -> Any:
        """Run ``op`` (``"query"`` or ``"list"``) in a forked child; kill it at ``timeout_ms``.
        Returns the reply's ``result``; QueryError for failures and timeouts."""
        sock, _ = self.submit(b"fork")
        pid = 0
        try:
            try:
                sock.settimeout(START_TIMEOUT_S)
                _send(sock, pickle.dumps({"op": op, "timeout_ms": timeout_ms, **payload}))
                (pid,) = _HDR.unpack(_recv_exact(sock, _HDR.size, time.monotonic() + START_TIMEOUT_S))
                data = _recv(sock, time.monotonic() + timeout_ms / 1000,
                             limit=4 * reply_limit + (1 << 20))
            except TimeoutError:
                if pid:  # still running (it has not answered): stop it now
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:  # pragma: no cover - it ended meanwhile
                        pass
                raise QueryError(f"Query timed out after {timeout_ms} ms.") from None
            except (EOFError, OSError):
                raise QueryError("MongoDB error: the query process died (it ran out of memory "
                                 "or time)") from None
        finally:
            sock.close()
        return _parse_reply(data, "result")


class MockMongoDatabase:
    """One database of the mongomock worker (what ``mongo_client(None)[name]`` returns); used
    through :class:`tasks.db.databases.MongoDatabase` and :func:`tasks.db.databases.load_mongo`."""

    querylab_worker = True

    def __init__(self, client: MockMongoClient, name: str):
        self.client, self.name = client, name

    def load(self, collections: dict[str, list[dict]]) -> None:
        """Replace these collections (name -> BSON-ready documents)."""
        self.client.load(self.name, collections)

    def loaded_version(self) -> str | None:
        """The version recorded by :meth:`mark_loaded` (kept in querylab's process)."""
        return self.client._versions.get(self.name)

    def mark_loaded(self, version: str) -> None:
        """Record that this database holds dataset ``version``."""
        self.client._versions[self.name] = version

    def list_tables(self, timeout_ms: int) -> list[TableInfo]:
        """:func:`tasks.db.databases.mongo_list_local` in a child of the worker."""
        raw = self.client.request("list", {"db": self.name}, timeout_ms, 64 << 20)
        return [TableInfo(t["name"], [ColumnInfo(c, ty) for c, ty in t["columns"]], t["row_count"])
                for t in raw]

    def run_query(self, q: dict, limits: ResultLimits, timeout_ms: int) -> QueryResult:
        """:func:`tasks.db.databases.mongo_run_local` in a child of the worker."""
        raw = self.client.request(
            "query",
            {"db": self.name, "query": q,
             "limits": [limits.max_rows, limits.max_value_bytes, limits.max_result_bytes]},
            timeout_ms, limits.max_result_bytes,
        )
        return QueryResult.from_json(raw)


_sql_worker: SqlWorker | None = None
_sql_worker_lock = threading.Lock()


def sql_worker() -> SqlWorker:
    """This process's SQL worker (created on first use, started on first request)."""
    global _sql_worker
    with _sql_worker_lock:
        if _sql_worker is None:
            _sql_worker = SqlWorker()
        return _sql_worker
