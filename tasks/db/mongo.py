"""The MongoDB engine: :class:`MongoDatabase` (requests checked by
:mod:`tasks.db.guard`; ``maxTimeMS`` on a real server, a killable child in the mongomock worker),
:func:`mongo_client` (a real server when a URI is given, else the mongomock worker of
:mod:`tasks.db.db_worker`), the load markers kept outside the dataset's database
(:func:`mongo_loaded_version`, :func:`mongo_mark_loaded`) and the bulk loader :func:`load_mongo`.
Collections named ``system.*`` or ``_querylab*`` are hidden. Moved verbatim from
``tasks/db/databases.py``; registered as engine ``mongodb`` in :mod:`tasks.db.engines`.
"""

from __future__ import annotations

import datetime as _dt
import decimal
import threading
from typing import Any, Iterable
from tasks.db.base import Database
from tasks.db.guard import check_read_only_mongo, parse_mongo_query
from tasks.db.registry import Engine, physical_name, placed_tables, register_engine
from tasks.db.results import (
    ColumnInfo,
    DatabaseUnavailable,
    DEFAULT_MAX_RESULT_BYTES,
    DEFAULT_MAX_ROWS,
    DEFAULT_MAX_VALUE_BYTES,
    DEFAULT_TIMEOUT_MS,
    _limits,
    QueryError,
    QueryResult,
    _ResultBuilder,
    ResultLimits,
    _short,
    TableInfo,
)


# ---- MongoDB --------------------------------------------------------------------------------

#: Collection names agents never see or reach: MongoDB's own and querylab's markers.
_HIDDEN_PREFIXES = ("system.", "_querylab")


def _visible_collection(name: str) -> bool:
    return isinstance(name, str) and not name.startswith(_HIDDEN_PREFIXES)


def _mongo_type_name(v: Any) -> str:
    return type(v).__name__


def referenced_collections(query: dict) -> list[str]:
    """Every collection a Mongo request names: its ``collection`` and the ``from`` of each
    ``$lookup`` / ``$graphLookup`` and the collection of each ``$unionWith``, searched through
    nested pipelines (``$facet``, ``$lookup.pipeline``, ...). A name that is not a string is
    returned as its ``repr``."""
    found: list[str] = [query.get("collection")]

    def walk(v: Any, depth: int = 0) -> None:
        if depth > 200:
            raise QueryError("Refused: the query is nested too deeply.")
        if isinstance(v, dict):
            for k, x in v.items():
                if k in ("$lookup", "$graphLookup") and isinstance(x, dict) and "from" in x:
                    found.append(x["from"])
                elif k == "$unionWith":
                    found.append(x.get("coll") if isinstance(x, dict) else x)
                walk(x, depth + 1)
        elif isinstance(v, (list, tuple)):
            for x in v:
                walk(x, depth + 1)

    walk(query.get("aggregate") or [])
    return [f if isinstance(f, str) else repr(f) for f in found]


def mongo_list_local(db: Any) -> list[TableInfo]:
    """:meth:`MongoDatabase.list_tables` on a pymongo/mongomock database object in this
    process (what the mongomock worker runs)."""
    out = []
    for name in sorted(c for c in db.list_collection_names() if _visible_collection(c)):
        coll = db[name]
        fields: dict[str, list[str]] = {}
        for doc in coll.find({}, limit=100):
            for k, v in doc.items():
                if k == "_id":
                    continue
                types = fields.setdefault(k, [])
                t = _mongo_type_name(v)
                if t not in types:
                    types.append(t)
        cols = [ColumnInfo(k, "|".join(v)) for k, v in fields.items()]
        out.append(TableInfo(name, cols, int(coll.count_documents({}))))
    return out


def mongo_run_local(db: Any, q: dict, limits: ResultLimits, timeout_ms: int | None) -> QueryResult:
    """Run a parsed, checked Mongo request (:func:`parse_mongo_query`) on a pymongo/mongomock
    database object in this process: unknown or hidden collections (also in ``$lookup`` /
    ``$unionWith``) raise QueryError; ``timeout_ms`` is sent as ``maxTimeMS`` (None for
    mongomock, which the worker bounds by killing the query); documents are read in batches
    into a :class:`_ResultBuilder`."""
    names = sorted(c for c in db.list_collection_names() if _visible_collection(c))
    for ref in referenced_collections(q):
        if ref not in names:
            raise QueryError(f"Unknown collection {ref[:100]!r}; collections: "
                             f"{', '.join(names) or '(none)'}.")
    coll = db[q["collection"]]
    cap = limits.max_rows + 1
    keep_id = False
    if "aggregate" in q:
        pipeline = list(q["aggregate"]) + [{"$limit": cap}]
        akw = {} if timeout_ms is None else {"maxTimeMS": int(timeout_ms), "batchSize": 100}
        cursor = coll.aggregate(pipeline, **akw)
    else:
        proj = q.get("projection")
        keep_id = bool(proj and proj.get("_id"))
        limit = q.get("limit") or 0
        args: dict[str, Any] = {"limit": cap if limit == 0 else min(limit, cap)}
        if timeout_ms is not None:
            args.update(max_time_ms=int(timeout_ms), batch_size=100)
        if q.get("sort"):
            args["sort"] = [(f, d) for f, d in q["sort"]]
        cursor = coll.find(q["find"], proj, **args)
    builder = _ResultBuilder(limits)
    for doc in cursor:
        if "_id" in doc and not keep_id and type(doc["_id"]).__name__ == "ObjectId":
            doc = {k: v for k, v in doc.items() if k != "_id"}
        if not builder.add_doc(doc):
            break
    return builder.result()



def _mongo_error(e: Exception, timeout_ms: int) -> Exception:
    if isinstance(e, QueryError | DatabaseUnavailable):
        return e
    if type(e).__name__ in ("ServerSelectionTimeoutError", "AutoReconnect", "NetworkTimeout",
                            "ConnectionFailure", "NotPrimaryError"):
        # a real MongoDB server that cannot be reached: infrastructure, not the query
        return DatabaseUnavailable(f"MongoDB server unavailable: {_short(e)}")
    if type(e).__name__ == "ExecutionTimeout":
        return QueryError(f"Query timed out after {timeout_ms} ms.")
    if isinstance(e, RecursionError):
        return QueryError("MongoDB error: the query or a document is nested too deeply.")
    if isinstance(e, MemoryError):
        return QueryError("MongoDB error: the query ran out of memory.")
    return QueryError(f"MongoDB error: {_short(e)}")


class MongoDatabase(Database):
    """A MongoDB database: ``db`` is a ``pymongo.database.Database`` (a real server:
    ``timeout_ms`` is sent as ``maxTimeMS``) or a :class:`tasks.db.db_worker_client.MockMongoDatabase`
    (the mongomock fallback: every query runs in a child process of the mongomock worker that
    is killed at ``timeout_ms``, so a runaway query neither outlives its limit nor blocks
    other trials' queries). Collections named ``system.*`` or ``_querylab*`` are neither
    listed nor queryable."""

    engine = "mongodb"

    def __init__(self, name: str, db: Any, timeout_ms: int = DEFAULT_TIMEOUT_MS):
        self.name = name
        self.db = db
        self.timeout_ms = int(timeout_ms)
        self._worker = bool(getattr(db, "querylab_worker", False))
        if not self._worker and type(db).__module__.split(".")[0] == "mongomock":
            raise TypeError("pass mongo_client(None)[name] (the mongomock worker), not a "
                            "mongomock database: in-process mongomock has no time limit")

    def list_tables(self) -> list[TableInfo]:
        """See :meth:`Database.list_tables`: each collection's fields (excluding ``_id``) and the
        Python type names seen in up to 100 sampled documents (``"int|NoneType"`` when mixed)."""
        try:
            if self._worker:
                return self.db.list_tables(self.timeout_ms)
            return mongo_list_local(self.db)
        except Exception as e:
            raise _mongo_error(e, self.timeout_ms) from None

    def query(self, query: str | dict, max_rows: int = DEFAULT_MAX_ROWS,
              max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
              max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES) -> QueryResult:
        """See :meth:`Database.query`; ``query`` as :func:`parse_mongo_query` accepts. ``_id``
        is dropped from returned documents when it is an ObjectId (kept when a projection or
        ``$group`` produced it with another value)."""
        limits = _limits(max_rows, max_result_bytes, max_value_bytes)
        q = parse_mongo_query(query)
        check_read_only_mongo(q)
        return self._execute(q, limits)

    def _execute(self, q: dict, limits: ResultLimits | int) -> QueryResult:
        limits = _limits(limits)
        try:
            if self._worker:
                return self.db.run_query(q, limits, self.timeout_ms)
            return mongo_run_local(self.db, q, limits, self.timeout_ms)
        except Exception as e:
            raise _mongo_error(e, self.timeout_ms) from None



_mongo_clients: dict[str | None, Any] = {}
_mongo_clients_lock = threading.Lock()
#: Database and collection where querylab records finished loads on a real MongoDB server
#: (never inside a dataset's database, so agents can neither list nor query the markers).
MONGO_META_DB, MONGO_META_COLLECTION = "querylab_meta", "loaded"


def mongo_client(mongo_uri: str | None):
    """One client per process and URI: ``pymongo.MongoClient(mongo_uri)`` when ``mongo_uri``
    (``QUERYLAB_MONGO_URI``) is given, else the process's mongomock worker
    (:class:`tasks.db.db_worker_client.MockMongoClient`: mongomock in a separate process, each query in
    a killable child). Both are thread-safe to share. Data in the mongomock worker lives only
    as long as this process (it is reloaded if the worker is restarted)."""
    with _mongo_clients_lock:
        client = _mongo_clients.get(mongo_uri or None)
        if client is None:
            if mongo_uri:
                import pymongo

                client = pymongo.MongoClient(mongo_uri)
            else:
                from tasks.db.db_worker_client import MockMongoClient

                client = MockMongoClient()
            _mongo_clients[mongo_uri or None] = client
        return client


def mongo_loaded_version(db: Any) -> str | None:
    """The dataset version recorded by :func:`mongo_mark_loaded` for database ``db`` (a
    pymongo Database or a mongomock-worker database), or None."""
    if getattr(db, "querylab_worker", False):
        return db.loaded_version()
    doc = db.client[MONGO_META_DB][MONGO_META_COLLECTION].find_one({"_id": db.name})
    return None if doc is None else doc.get("version")


def mongo_mark_loaded(db: Any, version: str) -> None:
    """Record that database ``db`` holds dataset version ``version`` (outside ``db``)."""
    if getattr(db, "querylab_worker", False):
        db.mark_loaded(version)
        return
    db.client[MONGO_META_DB][MONGO_META_COLLECTION].replace_one(
        {"_id": db.name}, {"_id": db.name, "version": version}, upsert=True)



def _mongo_value(v: Any) -> Any:
    if isinstance(v, dict):
        return {str(k): _mongo_value(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_mongo_value(x) for x in v]
    if isinstance(v, _dt.datetime):
        return v
    if isinstance(v, _dt.date):
        return _dt.datetime(v.year, v.month, v.day)
    if isinstance(v, _dt.time):
        return v.isoformat()
    if isinstance(v, decimal.Decimal):
        return float(v)
    if isinstance(v, _dt.timedelta):
        return v.total_seconds()
    return v


def load_mongo(db: Any, collections: dict[str, "list[dict] | pa.Table"]) -> None:
    """Replace collections of ``db`` (a pymongo Database or a mongomock-worker database from
    ``mongo_client(None)``): for each name, drop the collection then ``insert_many`` its
    documents (a list of dicts, or a pyarrow Table or ``RecordBatchReader`` whose rows become
    documents; a reader is inserted batch by batch on a real server). Lists stay
    arrays, nested dicts stay documents; ``date`` values become midnight datetimes (BSON has
    no date type), Decimal becomes float. Input dicts are not modified. Lists and tables go
    in batches of :data:`MONGO_BATCH_DOCS` (:func:`insert_batches`)."""
    if getattr(db, "querylab_worker", False):  # in-process fallback: holds every document
        db.load({name: [_mongo_value(d) for d in _documents(docs)]
                 for name, docs in collections.items()})
        return
    for name, docs in collections.items():
        if not hasattr(docs, "to_pylist") and not isinstance(docs, list):  # a reader: stream
            db.drop_collection(name)
            db.create_collection(name)
            for batch in docs:
                if batch.num_rows:
                    db[name].insert_many([_mongo_value(d) for d in batch.to_pylist()],
                                         ordered=True)
            continue
        prepared = [_mongo_value(d) for d in _documents(docs)]
        db.drop_collection(name)
        if prepared:
            insert_batches(db[name], prepared)
        else:
            db.create_collection(name)


def _documents(docs: "list[dict] | pa.Table | pa.RecordBatchReader") -> Iterable[dict]:
    if isinstance(docs, list):
        return docs
    if hasattr(docs, "to_pylist"):
        return docs.to_pylist()
    return (d for batch in docs for d in batch.to_pylist())


#: Documents per ``insert_many`` of a bulk load.
MONGO_BATCH_DOCS = 10_000


def insert_batches(collection: Any, docs: list[dict], batch: int = MONGO_BATCH_DOCS) -> None:
    """Insert ``docs`` into ``collection`` (pymongo or mongomock) in order, ``batch``
    documents per ``insert_many`` (bulk writes, bounded request size)."""
    for i in range(0, len(docs), batch):
        collection.insert_many(docs[i:i + batch], ordered=True)


def _mongo_docs(table: Any) -> Any:
    """Rows as BSON-encodable documents (dates become ISO strings; lists stay arrays); a
    stream of batches stays a ``RecordBatchReader`` (its date columns cast to ISO text, batch
    by batch)."""
    import pyarrow as pa

    if not hasattr(table, "to_pylist"):
        def batches():
            for batch in table:
                yield pa.RecordBatch.from_arrays(
                    [c.cast(pa.string()) if pa.types.is_date(c.type) else c
                     for c in batch.columns],
                    names=batch.schema.names)
        schema = pa.schema([pa.field(f.name, pa.string()) if pa.types.is_date(f.type) else f
                            for f in table.schema])
        return pa.RecordBatchReader.from_batches(schema, batches())
    docs = table.to_pylist()
    for d in docs:
        for k, v in d.items():
            if isinstance(v, _dt.date) and not isinstance(v, _dt.datetime):
                d[k] = v.isoformat()
    return docs


@register_engine
class MongoEngine(Engine):
    """Engine ``mongodb``: database ``ql_<dataset>_<db>_<hash>`` on ``QUERYLAB_MONGO_URI``
    (the finished load is recorded in database ``querylab_meta``, outside the dataset's), else
    the process's mongomock worker (:mod:`tasks.db.db_worker`), loaded on first use."""

    name = "mongodb"

    def load(self, manifest: dict, db: str, settings: Any) -> None:
        client = mongo_client(settings.mongo_uri)
        mdb = client[physical_name(manifest, db)]
        if mongo_loaded_version(mdb) != manifest["version"]:
            with placed_tables(manifest, db) as tables:
                load_mongo(mdb, {n: _mongo_docs(t) for n, t in tables.items()})
            mongo_mark_loaded(mdb, manifest["version"])

    def open(self, manifest: dict, db: str, settings: Any, timeout_ms: int) -> "MongoDatabase":
        client = mongo_client(settings.mongo_uri)
        return MongoDatabase(db, client[physical_name(manifest, db)], timeout_ms=timeout_ms)
