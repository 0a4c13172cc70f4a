"""Query workers: agents' SQLite, DuckDB and mongomock queries run outside querylab's process.

An agent's query is hostile input, and the in-process engines cannot bound what it costs:
DuckDB builds strings outside its ``memory_limit`` (``SELECT repeat('x', 100000000) FROM t``
grows the process by gigabytes), SQLite materialises every value a row holds, and mongomock is
pure Python (a ``$lookup`` self-join cannot be interrupted and, sharing one process, stalls
every other query). So querylab runs them in worker processes it can limit and kill:

- the **SQL worker** (one per querylab process, started on first use): SQLite and DuckDB
  queries on a pool of threads. A watchdog stops every running query once the worker's
  resident memory passes :data:`SQL_WORKER_MEMORY_MB` (they fail with an out-of-memory error,
  the worker survives; one that still grows past 1.5× is ended), ``RLIMIT_AS`` is a backstop;
  a worker left large by a huge query is replaced after it answered. Engines enforce the
  statement time limit themselves, and a worker that does not answer within the limit plus
  :data:`GRACE_S` is killed and restarted.
- the **mongomock worker** (a zygote): holds the mongomock data, loads in its own process,
  and ``fork()``s one child per query or listing. The child has an address-space limit of the
  zygote's size + :data:`MONGO_QUERY_MEMORY_MB` and an interval timer that kills it at the time
  limit; querylab also kills it (SIGKILL) when the limit passes. Concurrent queries run in
  concurrent children, so a runaway query stalls nobody else. If the zygote dies it is
  restarted and every load is replayed from the documents kept here.

Protocol: a ``SOCK_SEQPACKET`` control socket per worker; each request creates a socket pair
and passes one end to the worker (``SCM_RIGHTS``). Requests (querylab → worker) are pickles;
replies (worker → querylab) are JSON only, with a size limit, because the worker processes
hostile input and a pickle from it could run code here. Workers get a minimal environment (no
API keys, no database URLs) and exit when querylab's end of the control socket closes.
POSIX only.
"""

from __future__ import annotations

import atexit
import gc
import json
import os
import pickle
import resource
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from tasks.db.mongo import insert_batches
from tasks.db.results import (
    ColumnInfo,
    QueryError,
    QueryResult,
    ResultLimits,
    TableInfo,
)
from tasks.core.settings import env_get, env_subset

#: Resident memory the SQL worker's queries may use (MiB): ``QUERYLAB_QUERY_WORKER_MEMORY_MB``.
#: A watchdog samples the worker's RSS every few milliseconds and stops every running query
#: past it; its address space is limited to 4× this (DuckDB reserves far more than it uses).
SQL_WORKER_MEMORY_MB = int(env_get("QUERYLAB_QUERY_WORKER_MEMORY_MB") or 1536)
#: Memory a mongomock query child may add to the zygote's size (MiB):
#: ``QUERYLAB_MONGO_QUERY_MEMORY_MB``.
MONGO_QUERY_MEMORY_MB = int(env_get("QUERYLAB_MONGO_QUERY_MEMORY_MB") or 1024)
#: Seconds past a query's time limit before querylab gives up on an SQL worker and restarts it.
GRACE_S = 10.0
#: Seconds a worker may take to start, or the mongomock zygote to get to a request.
START_TIMEOUT_S = 60.0
#: Environment variables a worker keeps (everything else, keys and URLs included, is dropped).
_SAFE_ENV = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ")

_HDR = struct.Struct("!Q")


class WorkerError(RuntimeError):
    """A worker process could not be started."""


# --------------------------------------------------------------------------------------------
# framing
# --------------------------------------------------------------------------------------------


def _send(sock: socket.socket, data: bytes) -> None:
    sock.sendall(_HDR.pack(len(data)))
    sock.sendall(data)


def _recv_exact(sock: socket.socket, n: int, deadline: float | None) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            sock.settimeout(left)
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise EOFError
        buf += chunk
    return bytes(buf)


def _recv(sock: socket.socket, deadline: float | None = None, limit: int | None = None) -> bytes:
    (n,) = _HDR.unpack(_recv_exact(sock, _HDR.size, deadline))
    if limit is not None and n > limit:
        raise QueryError(f"the query worker's reply ({n} bytes) is larger than allowed ({limit})")
    return _recv_exact(sock, n, deadline)


def _error_text(e: BaseException) -> str:
    from tasks.db.results import _short

    return _short(e)


# --------------------------------------------------------------------------------------------
# querylab's side
# --------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------
# the worker's side
# --------------------------------------------------------------------------------------------


def _address_space_mb() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE") >> 20


def _limit_memory(mb: int) -> None:
    limit = mb << 20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _reply(sock: socket.socket, reply: dict) -> None:
    try:
        data = json.dumps(reply, default=str).encode()
    except (MemoryError, ValueError, RecursionError, TypeError) as exc:
        data = json.dumps({"ok": False, "error": f"the result could not be encoded: {exc!r}"[:500]}).encode()
    try:
        _send(sock, data)
    except OSError:
        pass  # querylab gave up on this request


def _receive(ctrl: socket.socket) -> tuple[bytes, socket.socket] | None:
    """The next ``(op, request socket)`` querylab hands over on the control socket; None once
    querylab's end closed (it is gone, or replaced this worker). Safe from several threads:
    each message goes to one of them."""
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(ctrl, 16, 4)
        except OSError:
            return None
        if not msg and not fds:
            return None
        for extra in fds[1:]:  # pragma: no cover - querylab sends one per message
            os.close(extra)
        if fds:
            return msg, socket.socket(fileno=fds[0])


def _rss_mb() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") >> 20


def _sql_request(sock: socket.socket, memory_mb: int) -> None:
    from tasks.db import databases as d

    try:
        req = pickle.loads(_recv(sock, time.monotonic() + START_TIMEOUT_S))
        run = d.sqlite_run_local if req["engine"] == "sqlite" else d.duckdb_run_local
        res = run(req["path"], req["sql"], req["timeout_ms"], ResultLimits(*req["limits"]))
        reply = {"ok": True, "result": res.to_json()}
    except d.QueryError as exc:
        reply = {"ok": False, "error": str(exc)}
    except MemoryError:
        reply = {"ok": False, "error": f"the query ran out of memory (queries may use at most "
                                       f"{memory_mb} MiB; select less, or aggregate in SQL)"}
    except RecursionError:
        reply = {"ok": False, "error": "the query or a value is nested too deeply"}
    except BaseException as exc:  # noqa: BLE001 - reported to querylab, the worker goes on
        reply = {"ok": False, "error": f"query worker error: {type(exc).__name__}: {_error_text(exc)}"}
    reply["rss_mb"] = _rss_mb()
    _reply(sock, reply)
    sock.close()


#: Threads of the SQL worker (concurrent queries; more wait in line).
SQL_WORKER_THREADS = 8


class _Busy:
    """How many requests the SQL worker is serving; the watchdog sleeps while there are none."""

    def __init__(self):
        self.n = 0
        self.cond = threading.Condition()

    def __enter__(self):
        with self.cond:
            self.n += 1
            self.cond.notify_all()

    def __exit__(self, *exc):
        with self.cond:
            self.n -= 1

    def wait(self) -> None:
        with self.cond:
            while self.n == 0:
                self.cond.wait()


def _watch_memory(memory_mb: int, busy: _Busy) -> None:
    """The SQL worker's watchdog: while requests run, stop every running query past
    ``memory_mb`` resident and end the worker past 1.5× (querylab restarts it)."""
    from tasks.db import databases as d

    reason = (f"the query ran out of memory (queries may use at most {memory_mb} MiB; "
              "select less, or aggregate in SQL)")
    while True:
        busy.wait()
        time.sleep(0.005)
        rss = _rss_mb()
        if rss > memory_mb * 3 // 2:
            os._exit(3)
        if rss > memory_mb:
            d.stop_running_queries(reason)


def _serve_sql(ctrl: socket.socket, memory_mb: int) -> None:
    _limit_memory(4 * memory_mb)
    from tasks.db import duckdb as d

    # instance-wide DuckDB settings of every file this worker opens
    d._DUCKDB_WORKER_SETTINGS.update({"memory_limit": f"{max(256, memory_mb // 3)}MB", "threads": "2"})
    busy = _Busy()

    def serve() -> None:  # each thread takes requests straight off the control socket
        while (got := _receive(ctrl)) is not None:
            with busy:
                _sql_request(got[1], memory_mb)

    threading.stack_size(4 << 20)  # threads are made now, while the address space is free
    threads = [threading.Thread(target=serve, daemon=True) for _ in range(SQL_WORKER_THREADS)]
    for t in threads:
        t.start()
    threading.Thread(target=_watch_memory, args=(memory_mb, busy), daemon=True).start()
    ctrl.sendall(b"ready")
    for t in threads:  # querylab is gone, or replaced this worker: finish what was handed over
        t.join()
    os._exit(0)


def _mongo_child(sock: socket.socket, client: Any, memory_mb: int) -> None:
    """A forked query child of the mongomock zygote: never returns."""
    from tasks.db import mongo as d

    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        _limit_memory(_address_space_mb() + memory_mb)
        sock.sendall(_HDR.pack(os.getpid()))
        req = pickle.loads(_recv(sock, time.monotonic() + START_TIMEOUT_S))
        signal.signal(signal.SIGALRM, signal.SIG_DFL)  # the default action ends the process
        signal.setitimer(signal.ITIMER_REAL, req["timeout_ms"] / 1000 + 1.0)
        db = client[req["db"]]
        if req["op"] == "list":
            tables = d.mongo_list_local(db)
            reply = {"ok": True, "result": [
                {"name": t.name, "columns": [[c.name, c.type] for c in t.columns],
                 "row_count": t.row_count} for t in tables]}
        else:
            res = d.mongo_run_local(db, req["query"], ResultLimits(*req["limits"]), None)
            reply = {"ok": True, "result": res.to_json()}
    except BaseException as exc:  # noqa: BLE001 - everything becomes the reply
        reply = {"ok": False, "error": str(d._mongo_error(exc, 0)) if not isinstance(exc, SystemExit)
                 else "query process stopped"}
    _reply(sock, reply)
    os._exit(0)


def _mongo_load(client: Any, sock: socket.socket) -> None:
    """A load request, run in the zygote itself (its data is what children inherit)."""
    try:
        req = pickle.loads(_recv(sock))
        db = client[req["db"]]
        for name, blob in req["collections"].items():
            docs = pickle.loads(blob)
            db.drop_collection(name)
            if docs:
                insert_batches(db[name], docs)
            else:
                db.create_collection(name)
        reply: dict = {"ok": True}
    except BaseException as exc:  # noqa: BLE001 - reported to querylab
        reply = {"ok": False, "error": f"{type(exc).__name__}: {_error_text(exc)}"}
    _reply(sock, reply)
    gc.collect()
    gc.freeze()  # loaded documents stay out of the children's garbage collections


def _serve_mongomock(ctrl: socket.socket, memory_mb: int) -> None:
    import mongomock

    client = mongomock.MongoClient()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    ctrl.sendall(b"ready")
    while (got := _receive(ctrl)) is not None:
        msg, sock = got
        if msg == b"load":
            _mongo_load(client, sock)
        elif os.fork() == 0:
            ctrl.close()
            _mongo_child(sock, client, memory_mb)
        sock.close()
    os._exit(0)


def main(argv: list[str]) -> None:
    """``python -m tasks.db.db_worker sql|mongomock <control fd> <memory MiB>``."""
    kind, fd, memory_mb = argv[0], int(argv[1]), int(argv[2])
    ctrl = socket.socket(fileno=fd)
    if kind == "sql":
        _serve_sql(ctrl, memory_mb)
    elif kind == "mongomock":
        _serve_mongomock(ctrl, memory_mb)
    else:  # pragma: no cover
        raise SystemExit(f"unknown worker kind {kind!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
