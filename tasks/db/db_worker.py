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

Code: this module holds the limits, the framing and the workers' side (what
``python -m tasks.db.db_worker`` runs; it stays light at import); querylab's side (starting,
restarting and killing workers, sending requests, the mongomock client) is
:mod:`tasks.db.db_worker_client`.
"""

from __future__ import annotations

import gc
import json
import os
import pickle
import resource
import signal
import socket
import struct
import sys
import threading
import time
from typing import Any

from tasks.db.mongo import insert_batches
from tasks.db.results import QueryError, ResultLimits
from tasks.core.settings import Settings

#: Resident memory the SQL worker's queries may use (MiB): ``QUERYLAB_QUERY_WORKER_MEMORY_MB``.
#: A watchdog samples the worker's RSS every few milliseconds and stops every running query
#: past it; its address space is limited to 4× this (DuckDB reserves far more than it uses).
SQL_WORKER_MEMORY_MB: int = Settings.read("query_worker_memory_mb")
#: Memory a mongomock query child may add to the zygote's size (MiB):
#: ``QUERYLAB_MONGO_QUERY_MEMORY_MB``.
MONGO_QUERY_MEMORY_MB: int = Settings.read("mongo_query_memory_mb")
#: Seconds past a query's time limit before querylab gives up on an SQL worker and restarts it.
GRACE_S = 10.0
#: Seconds a worker may take to start, or the mongomock zygote to get to a request.
START_TIMEOUT_S = 60.0

_HDR = struct.Struct("!Q")


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
