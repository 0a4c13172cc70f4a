"""Read-only checks by parsing, the first of the two read-only guards (the engines' own
read-only modes are the second, see :mod:`tasks.db.databases`): :func:`check_read_only_sql`
(sqlglot; exactly one SELECT / set operation, optionally with WITH, and nothing that writes
anywhere inside it), :func:`resolve_unicode_escapes`, :func:`parse_mongo_query` and
:func:`check_read_only_mongo` (no ``$out``/``$merge``/``$function``/``$where``/``$accumulator``
anywhere). Security-relevant: moved verbatim from ``tasks/db/databases.py``. The one guarded
SQLite executor stays :mod:`tasks.db.sqlite_guard`.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any
from tasks.db.results import QueryError, _short


# --------------------------------------------------------------------------------------------
# Read-only checks
# --------------------------------------------------------------------------------------------

_SQL_DIALECTS = ("postgres", "sqlite", "duckdb")

# Node types that must not appear anywhere in an agent's statement.
_FORBIDDEN_NODE_NAMES = (
    "Insert", "Update", "Delete", "Merge", "Create", "Drop", "Alter", "Command", "Copy", "Pragma",
    "Attach", "Detach", "Set", "Use", "Transaction", "Commit", "Rollback", "Install", "Load",
    "LoadData", "TruncateTable", "Grant", "Revoke", "Analyze", "Refresh", "Cache", "Uncache",
    "Export", "Kill", "Lock", "Into", "Describe", "Summarize", "Show",
)

# Functions with side effects (server state, files) refused by name, all dialects.
_FORBIDDEN_FUNCTIONS = frozenset({
    "set_config", "pg_terminate_backend", "pg_cancel_backend", "pg_reload_conf",
    "pg_rotate_logfile", "pg_promote", "pg_switch_wal", "pg_create_restore_point",
    "pg_read_file", "pg_read_binary_file", "pg_ls_dir", "pg_stat_file", "pg_file_write",
    "lo_import", "lo_export", "lo_unlink", "lo_create", "lo_put", "lo_from_bytea",
    "pg_advisory_lock", "pg_advisory_xact_lock", "dblink", "dblink_exec",
    "load_extension", "writefile", "readfile", "edit",
})


def _holds_session_state(fname: str) -> bool:
    """PostgreSQL's advisory-lock functions (``pg_try_advisory_lock``, ``..._shared``,
    ``pg_advisory_unlock_all``, ...): a lock outlives the rolled-back query on the connection,
    which later trials reuse, and other connections see it held."""
    return fname.startswith("pg_") and "advisory" in fname


def _forbidden_node_types() -> tuple[type, ...]:
    from sqlglot import exp

    return tuple(t for t in (getattr(exp, n, None) for n in _FORBIDDEN_NODE_NAMES) if t is not None)


def _parse_error_message(e: Exception) -> str:
    """sqlglot's first parse error as one line: description, position and the text around it."""
    errors = getattr(e, "errors", None) or []
    if not errors:
        return _short(e)
    err = errors[0]
    desc = re.sub(r"<Token token_type: [^,]*, text: (.*?), line: .*?>", r"'\1'", str(err.get("description", "")))
    where = f" (line {err.get('line')}, col {err.get('col')})" if err.get("line") else ""
    ctx = f"{err.get('start_context', '')}{err.get('highlight', '')}".strip()
    near = f" near: {ctx[-60:]!r}" if ctx else ""
    return _short(f"{desc}{where}{near}", max_lines=2)


_U_ESCAPED = re.compile(
    r"""(?is)\bU&(?P<q>["'])(?P<body>(?:(?!(?P=q)).|(?P=q)(?P=q))*)(?P=q)"""
    r"""(?:\s*UESCAPE\s*'(?P<esc>[^'])')?""")


def resolve_unicode_escapes(sql: str) -> str:
    """``sql`` with PostgreSQL's Unicode-escaped identifiers and strings (``U&"pg\\005fread"``,
    ``U&'\\0041'``, ``UESCAPE '!'``) written out as the plain quoted identifiers and strings
    the engine reads them as, so a parser that does not know the syntax (sqlglot reads
    ``U & "..."``) sees the real names. Malformed escapes are left as they are (the engine
    refuses them)."""
    if "&" not in sql:
        return sql

    def decode(m: re.Match) -> str:
        q, body, esc = m["q"], m["body"].replace(m["q"] * 2, m["q"]), m["esc"] or "\\"
        out, i = [], 0
        while i < len(body):
            c = body[i]
            if c != esc:
                out.append(c)
                i += 1
                continue
            if body[i + 1:i + 2] == esc:
                out.append(esc)
                i += 2
            elif body[i + 1:i + 2] == "+" and re.fullmatch(r"[0-9A-Fa-f]{6}", body[i + 2:i + 8]):
                out.append(chr(int(body[i + 2:i + 8], 16)))
                i += 8
            elif re.fullmatch(r"[0-9A-Fa-f]{4}", body[i + 1:i + 5]):
                out.append(chr(int(body[i + 1:i + 5], 16)))
                i += 5
            else:
                return m.group(0)
        text = "".join(out)
        return q + text.replace(q, q * 2) + q

    try:
        return _U_ESCAPED.sub(decode, sql)
    except (ValueError, OverflowError):
        return sql


def check_read_only_sql(sql: str, dialect: str) -> None:
    """Refuse anything but ONE read-only query, by parsing ``sql`` with sqlglot.

    Accepted: a single ``SELECT`` or set operation (``UNION``/``INTERSECT``/``EXCEPT``), possibly
    with ``WITH`` and a trailing ``;``. Refused with :class:`QueryError`: empty text, text that
    does not parse (the parser's message is kept), several ``;``-chained statements, any other
    statement kind, and any statement containing INSERT/UPDATE/DELETE/MERGE/CREATE/DROP/ALTER/
    COPY/PRAGMA/ATTACH/DETACH/SET/USE/transaction control/INSTALL/LOAD/``SELECT ... INTO`` or an
    unparsed command anywhere (e.g. a CTE wrapping DML), or a call to a side-effecting function
    (``set_config``, ``pg_read_file``, ``lo_export``, ...).

    ``dialect``: ``"postgres"`` | ``"sqlite"`` | ``"duckdb"`` (ValueError otherwise).

    The verdict depends on the text and the dialect only, so the verdicts of the last
    :data:`VERDICT_CACHE_SIZE` texts up to :data:`VERDICT_CACHE_MAX_BYTES` UTF-8 bytes are
    remembered (trials of one query send the same SQL again and again; a parse costs ~1.4 ms of
    CPU under the GIL, the lookup ~1 µs); a refusal is raised again with the same message.
    """
    if dialect not in _SQL_DIALECTS:
        raise ValueError(f"unknown SQL dialect {dialect!r}; expected one of {_SQL_DIALECTS}")
    if not isinstance(sql, str) or not sql.strip():
        raise QueryError("Refused: empty query; send one SELECT statement.")
    if len(sql) > MAX_SQL_CHARS:  # parsing 1M characters holds the GIL for seconds
        raise QueryError(f"Refused: the query is {len(sql):,} characters long; at most "
                         f"{MAX_SQL_CHARS:,} are accepted.")
    cacheable = (len(sql) <= VERDICT_CACHE_MAX_BYTES
                 and len(sql.encode("utf-8", "surrogatepass")) <= VERDICT_CACHE_MAX_BYTES)
    refusal = _cached_verdict(sql, dialect) if cacheable else _verdict(sql, dialect)
    if refusal is not None:
        raise QueryError(refusal)


#: Verdicts of :func:`check_read_only_sql` remembered (texts), and the longest text remembered
#: (UTF-8 bytes; a Python string of at most that many UTF-8 bytes holds at most that many bytes
#: of characters): ~17 MiB of SQL text at most, whatever texts an agent sends.
VERDICT_CACHE_SIZE = 4096
VERDICT_CACHE_MAX_BYTES = 4096
#: The longest SQL text accepted (characters): a query is one statement an agent typed.
MAX_SQL_CHARS = 100_000


def _verdict(sql: str, dialect: str) -> str | None:
    """The refusal message of :func:`check_read_only_sql` for ``sql`` (None: accepted)."""
    try:
        _check_read_only_sql(sql, dialect)
    except QueryError as exc:
        return str(exc)
    return None


_cached_verdict = functools.lru_cache(maxsize=VERDICT_CACHE_SIZE)(_verdict)


def warm_up() -> None:
    """Import and run the SQL parser once (~0.5 s the first time): a trials stage calls it in
    the background while its first model calls wait, so the first ``query_db`` of a run does
    not hold every trial behind the import lock."""
    for dialect in _SQL_DIALECTS:
        check_read_only_sql("SELECT 1", dialect)


def _check_read_only_sql(sql: str, dialect: str) -> None:
    """The parse behind :func:`check_read_only_sql` (uncached; ``sql`` not blank, ``dialect``
    known): QueryError with the refusal."""
    import sqlglot
    from sqlglot import exp
    from sqlglot.errors import ParseError, TokenError

    if dialect == "postgres":  # U&"..." names: checked as the engine reads them
        sql = resolve_unicode_escapes(sql)
    try:
        statements = [s for s in sqlglot.parse(sql, read=dialect)  # a trailing comment after
                      if s is not None and not isinstance(s, getattr(exp, "Semicolon", ()))]  # ';'
    except ParseError as e:
        raise QueryError(f"Could not parse SQL ({dialect}): {_parse_error_message(e)}") from None
    except TokenError as e:
        raise QueryError(f"Could not parse SQL ({dialect}): {_short(e)}") from None
    except Exception as e:  # sqlglot can raise other errors on odd input
        raise QueryError(f"Could not parse SQL ({dialect}): {_short(e)}") from None
    if not statements:
        raise QueryError("Refused: empty query; send one SELECT statement.")
    if len(statements) > 1:
        raise QueryError(
            f"Refused: {len(statements)} statements found; send exactly one SELECT statement "
            "(no ';'-chained statements)."
        )
    stmt = statements[0]
    top = stmt.unnest() if isinstance(stmt, exp.Subquery) else stmt
    forbidden = _forbidden_node_types()
    for node in stmt.walk():
        if isinstance(node, forbidden):
            kind = type(node).__name__.upper()
            if isinstance(node, exp.Into):
                kind = "SELECT ... INTO"
            elif isinstance(node, exp.Command):
                kind = str(node.this).upper() or "COMMAND"
            raise QueryError(
                f"Refused: {kind} is not allowed; the database is read-only, only a single "
                "SELECT (optionally WITH ... / UNION) is accepted."
            )
        if isinstance(node, exp.Func):
            fname = (node.name if isinstance(node, exp.Anonymous) else node.sql_name()).lower()
            if fname in _FORBIDDEN_FUNCTIONS or _holds_session_state(fname):
                raise QueryError(f"Refused: function {fname}() is not allowed (side effects).")
    if not isinstance(top, (exp.Select, exp.SetOperation)):
        raise QueryError(
            f"Refused: {type(top).__name__.upper()} statements are not allowed; only a single "
            "SELECT (optionally WITH ... / UNION) is accepted."
        )


_MONGO_FORBIDDEN = frozenset({"$out", "$merge", "$function", "$where", "$accumulator"})
_MONGO_SHAPES = (
    'Accepted shapes: {"collection": "<name>", "find": {<filter>}, "projection": {...}, '
    '"sort": [["<field>", 1 or -1], ...], "limit": <int>} (all but "collection" optional), or '
    '{"collection": "<name>", "aggregate": [<stage>, ...]}.'
)


#: Deepest nesting of a Mongo request (MongoDB refuses documents nested deeper than 100).
MONGO_MAX_DEPTH = 100


def _depth_over(value: Any, limit: int) -> bool:
    """True when ``value`` (dicts and lists) nests deeper than ``limit`` (iterative)."""
    stack = [(value, 0)]
    while stack:
        v, d = stack.pop()
        if d > limit:
            return True
        if isinstance(v, dict):
            stack.extend((x, d + 1) for x in v.values())
        elif isinstance(v, (list, tuple)):
            stack.extend((x, d + 1) for x in v)
    return False


def parse_mongo_query(query: str | dict) -> dict:
    """Normalise a Mongo request.

    ``query``: a dict, or JSON text (MongoDB extended JSON such as ``{"$date": "..."}`` and
    ``{"$oid": "..."}`` is understood; dates become naive UTC datetimes).

    Returns either ``{"collection": str, "find": dict, ["projection": dict], ["sort": [[field,
    1|-1], ...]], ["limit": int]}`` (``find`` defaults to ``{}``; ``sort`` may also be given as
    an ordered ``{field: 1|-1}`` dict; ``limit`` 0 means no limit) or ``{"collection": str,
    "aggregate": [stage, ...]}``. Anything else raises :class:`QueryError` explaining the
    accepted shapes.
    """
    if isinstance(query, (str, bytes)):
        text = query.decode() if isinstance(query, bytes) else query
        if not text.strip():
            raise QueryError("Empty Mongo query. " + _MONGO_SHAPES)
        try:
            from bson import json_util

            q = json_util.loads(text, json_options=json_util.JSONOptions(tz_aware=False))
        except ImportError:  # pragma: no cover - pymongo missing
            try:
                q = json.loads(text)
            except json.JSONDecodeError as e:
                raise QueryError(f"Invalid JSON: {e}. " + _MONGO_SHAPES) from None
        except RecursionError:
            raise QueryError(f"Refused: the query is nested more than {MONGO_MAX_DEPTH} levels "
                             "deep (MongoDB's own limit for documents).") from None
        except Exception as e:
            raise QueryError(f"Invalid JSON: {_short(e, 1)}. " + _MONGO_SHAPES) from None
    else:
        q = query
    if not isinstance(q, dict):
        raise QueryError(f"A Mongo query must be a JSON object, got {type(q).__name__}. " + _MONGO_SHAPES)
    if _depth_over(q, MONGO_MAX_DEPTH):
        raise QueryError(f"Refused: the query is nested more than {MONGO_MAX_DEPTH} levels deep "
                         "(MongoDB's own limit for documents).")
    coll = q.get("collection")
    if not isinstance(coll, str) or not coll:
        raise QueryError('Missing "collection" (a non-empty string). ' + _MONGO_SHAPES)

    if "aggregate" in q:
        extra = set(q) - {"collection", "aggregate"}
        if extra:
            raise QueryError(f"Unexpected keys with \"aggregate\": {sorted(extra)}. " + _MONGO_SHAPES)
        pipeline = q["aggregate"]
        if not isinstance(pipeline, list) or not all(
            isinstance(s, dict) and len(s) == 1 and str(next(iter(s))).startswith("$") for s in pipeline
        ):
            raise QueryError(
                '"aggregate" must be a list of stages, each an object with one "$operator" key. '
                + _MONGO_SHAPES
            )
        return {"collection": coll, "aggregate": pipeline}

    allowed = {"collection", "find", "projection", "sort", "limit"}
    extra = set(q) - allowed
    if extra:
        raise QueryError(f"Unexpected keys: {sorted(extra)}. " + _MONGO_SHAPES)
    out: dict[str, Any] = {"collection": coll}
    flt = q.get("find", {})
    if flt is None:
        flt = {}
    if not isinstance(flt, dict):
        raise QueryError('"find" must be an object (a filter). ' + _MONGO_SHAPES)
    out["find"] = flt
    if q.get("projection") is not None:
        if not isinstance(q["projection"], dict):
            raise QueryError('"projection" must be an object. ' + _MONGO_SHAPES)
        out["projection"] = q["projection"]
    if q.get("sort") is not None:
        sort = q["sort"]
        if isinstance(sort, dict):
            sort = [[k, v] for k, v in sort.items()]
        ok = isinstance(sort, list) and all(
            isinstance(s, (list, tuple)) and len(s) == 2 and isinstance(s[0], str)
            and s[1] in (1, -1) and not isinstance(s[1], bool)
            for s in sort
        )
        if not ok:
            raise QueryError('"sort" must be a list of ["field", 1 or -1] pairs. ' + _MONGO_SHAPES)
        out["sort"] = [[s[0], int(s[1])] for s in sort]
    if q.get("limit") is not None:
        lim = q["limit"]
        if isinstance(lim, bool) or not isinstance(lim, int) or lim < 0:
            raise QueryError('"limit" must be a non-negative integer. ' + _MONGO_SHAPES)
        out["limit"] = lim
    return out


def check_read_only_mongo(query: dict) -> None:
    """Refuse (:class:`QueryError`) a Mongo request containing ``$out``, ``$merge``,
    ``$function``, ``$where`` or ``$accumulator`` as a key anywhere (searched recursively through
    dicts and lists)."""

    def walk(v: Any) -> None:
        if isinstance(v, dict):
            for k, x in v.items():
                if isinstance(k, str) and k in _MONGO_FORBIDDEN:
                    why = ("the database is read-only" if k in ("$out", "$merge")
                           else "server-side JavaScript is disabled")
                    raise QueryError(f"Refused: {k} is not allowed ({why}).")
                walk(x)
        elif isinstance(v, (list, tuple)):
            for x in v:
                walk(x)

    walk(query)
