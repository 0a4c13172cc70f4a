"""Reading the SQL of equivalence pairs in any dialect, with every non-obvious reading stated.

Published pair sets mix dialects: Calcite rewrite pairs come with MySQL DDL (backticks) and
ANSI queries written by a rewrite engine (``$f0``, ``EXPR$0``, ``||`` for concatenation,
``GROUP BY`` a literal), Spider ships MySQL DDL for SQLite queries. This module reads them with
sqlglot and says what it had to decide, so that no reading is silent:

- :func:`read_ddl`: the statements of a schema script, each parsed with the dialect given, else
  with the dialect its text points to (backticks → MySQL, ``AUTOINCREMENT`` → SQLite, ...), else
  with the other dialects in turn. A statement that parses in none is a :class:`SQLReadError`
  naming it — never dropped — and every statement read in another dialect than the one given
  is listed in the returned notes.
- :func:`read_query`: one query, normalised for execution: rewrite-engine identifiers
  (``$f0``, ``$g_1``, ``EXPR$0``) are identifiers, not parameters; MySQL's ``||`` is read as
  string concatenation when an operand is not a condition (MySQL itself would read OR);
  ``GROUP BY <integer>`` is a column position only where the dialect has positions and the
  position names a plain select item, otherwise the constant; ``UNIX_TIMESTAMP`` becomes the
  engine's epoch seconds. :attr:`ReadQuery.readings` lists each such decision.
- :func:`engine_sql`: the query written for DuckDB or SQLite (``VALUES ... AS t(c)`` rewritten
  for SQLite, which has no column aliases on VALUES).

Dialect names are sqlglot's (``duckdb``, ``mysql``, ``sqlite``, ``postgres``, ...) plus
``ansi`` and ``calcite`` (read with sqlglot's dialect-neutral parser, GROUP BY literals are
constants, as in Calcite's default conformance).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import ClassVar

import sqlglot
from sqlglot import exp
from sqlglot.dialects.dialect import Dialect
from sqlglot.dialects.mysql import MySQL
from sqlglot.errors import SqlglotError
from sqlglot.tokens import TokenType

#: Dialect names accepted besides sqlglot's own: read with its neutral (ANSI-like) parser.
NEUTRAL_DIALECTS = ("ansi", "calcite")

#: Dialects in which ``GROUP BY <integer>`` names a select item by position.
_GROUP_BY_POSITIONS = {
    "duckdb", "mysql", "sqlite", "postgres", "redshift", "snowflake", "bigquery", "spark",
    "spark2", "databricks", "hive", "presto", "trino", "athena", "clickhouse", "doris",
    "starrocks", "materialize", "risingwave", "singlestore", "drill", "dune",
}

#: The order in which other dialects are tried for DDL that does not parse in the given one.
_DDL_FALLBACKS = ("mysql", "postgres", "duckdb", "sqlite")

#: Leading keywords of statements that do not change a schema (ignored when sqlglot keeps them
#: as an opaque command).
_HARMLESS_COMMANDS = {
    "SET", "LOCK", "UNLOCK", "PRAGMA", "BEGIN", "START", "COMMIT", "ROLLBACK", "USE", "DROP",
    "GRANT", "REVOKE", "COMMENT", "ANALYZE", "VACUUM", "DELIMITER", "INSERT", "REPLACE",
    "COPY", "SHOW", "DESCRIBE", "EXPLAIN", "TRUNCATE", "DELETE", "UPDATE", "END", "SAVEPOINT",
    "RELEASE", "REINDEX", "OPTIMIZE", "FLUSH", "CHECKPOINT", "ATTACH", "DETACH", "INSTALL",
    "LOAD",
}

_PLAIN_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class SQLReadError(ValueError):
    """A statement or query cannot be read; the message names it and the dialects tried."""


@functools.lru_cache(maxsize=64)
def sqlglot_dialect(dialect: str | None) -> str:
    """The sqlglot dialect name for ``dialect`` (``ansi``/``calcite``/None → the neutral
    parser ``""``). Raises SQLReadError for a name sqlglot does not know."""
    if dialect is None or dialect.lower() in NEUTRAL_DIALECTS or dialect == "":
        return ""
    name = dialect.lower()
    if name not in Dialect.classes:
        known = sorted(k for k in Dialect.classes if k and not k.startswith("ql"))
        raise SQLReadError(f"unknown SQL dialect {dialect!r}; use one of {known + list(NEUTRAL_DIALECTS)}")
    return name


def _short(text: str, n: int = 100) -> str:
    one = " ".join(text.split())
    return one if len(one) <= n else one[: n - 1] + "…"


def _first_line(exc: Exception) -> str:
    lines = [ln for ln in re.sub(r"\x1b\[[0-9;]*m", "", str(exc)).splitlines() if ln.strip()]
    return lines[0][:200] if lines else type(exc).__name__


# --------------------------------------------------------------------------------------------
# DDL
# --------------------------------------------------------------------------------------------


def split_statements(text: str, dialect: str | None) -> list[str]:
    """The statements of a script, split at top-level semicolons by sqlglot's tokenizer for
    ``dialect`` (so ``;`` inside strings and quoted names is kept); comments between
    statements are dropped. Raises SQLReadError when the text does not tokenize."""
    try:
        tokens = sqlglot.tokenize(text, read=sqlglot_dialect(dialect))
    except SqlglotError as exc:
        raise SQLReadError(f"cannot split the script into statements ({dialect}): {_first_line(exc)}") from None
    out: list[str] = []
    start: int | None = None
    end = 0
    for tok in tokens:
        if tok.token_type == TokenType.SEMICOLON:
            if start is not None:
                out.append(text[start:end + 1])
            start = None
            continue
        if start is None:
            start = tok.start
        end = tok.end
    if start is not None:
        out.append(text[start:end + 1])
    return [s.strip() for s in out if s.strip()]


def detect_ddl_dialects(text: str) -> list[str]:
    """Dialects the text of a schema script points to, most telling first (may be empty):
    backtick identifiers, ``AUTO_INCREMENT``, ``ENGINE=`` → MySQL; ``AUTOINCREMENT``,
    ``PRAGMA``, ``WITHOUT ROWID`` → SQLite; ``SERIAL``, ``::`` casts → PostgreSQL."""
    found: list[str] = []
    upper = text.upper()
    if "`" in text or "AUTO_INCREMENT" in upper or re.search(r"\bENGINE\s*=", upper):
        found.append("mysql")
    if re.search(r"\bAUTOINCREMENT\b|\bPRAGMA\b|WITHOUT\s+ROWID", upper):
        found.append("sqlite")
    if re.search(r"\b(BIG|SMALL)?SERIAL\b|::", upper):
        found.append("postgres")
    return found


#: Statement kinds a schema script may hold; anything else (sqlglot reads ``FROBNICATE t`` as
#: the expression ``FROBNICATE AS t``) is not understood.
_STATEMENTS = (
    exp.Create, exp.Alter, exp.Drop, exp.Insert, exp.Set, exp.Pragma, exp.Command,
    exp.Transaction, exp.Commit, exp.Rollback, exp.Use, exp.Delete, exp.Update, exp.Comment,
    exp.Query, exp.Copy, exp.Describe, exp.Analyze, exp.TruncateTable,
)


def _markers(text: str, dialect: str) -> list[str]:
    upper = text.upper()
    found = {
        "mysql": [("`" in text, "backtick identifiers"), ("AUTO_INCREMENT" in upper, "AUTO_INCREMENT"),
                  (bool(re.search(r"\bENGINE\s*=", upper)), "ENGINE=")],
        "sqlite": [(bool(re.search(r"\bAUTOINCREMENT\b", upper)), "AUTOINCREMENT"),
                   (bool(re.search(r"\bPRAGMA\b", upper)), "PRAGMA"),
                   (bool(re.search(r"WITHOUT\s+ROWID", upper)), "WITHOUT ROWID")],
        "postgres": [(bool(re.search(r"\b(BIG|SMALL)?SERIAL\b", upper)), "SERIAL"), ("::" in text, ":: casts")],
    }.get(dialect, [])
    return [name for hit, name in found if hit]


_USING_INDEX_TYPE = re.compile(
    r"((?:PRIMARY\s+KEY|UNIQUE(?:\s+(?:KEY|INDEX))?|KEY|INDEX)(?:\s+(?:`[^`]*`|\"[^\"]*\"|\w+))??)"
    r"\s+USING\s+(?:BTREE|HASH)\s*\(", re.IGNORECASE)
_CONFLICT_CLAUSE = re.compile(r"\s+ON\s+CONFLICT\s+(?:ROLLBACK|ABORT|FAIL|IGNORE|REPLACE)\b", re.IGNORECASE)
_CLUSTERING = re.compile(r"\b(PRIMARY\s+KEY|UNIQUE)\s+(?:NON)?CLUSTERED\b", re.IGNORECASE)
_KEY_LIST = re.compile(r"\b(PRIMARY\s+KEY|UNIQUE)\s*\(([^()]*)\)", re.IGNORECASE)


_CHECK_START = re.compile(r"(,\s*)?(?:\bCONSTRAINT\s+(?:`[^`]*`|\"[^\"]*\"|\w+)\s+)?\bCHECK\s*\(", re.IGNORECASE)
_NOT_ENFORCED = re.compile(r"\s*NOT\s+ENFORCED\b", re.IGNORECASE)


def _drop_unenforced_checks(text: str) -> str:
    """MySQL's ``[CONSTRAINT c] CHECK (...) NOT ENFORCED`` removed (MySQL does not check it,
    and sqlglot does not read it); a table-level one takes its leading comma along."""
    out, pos = [], 0
    for m in _CHECK_START.finditer(text):
        if m.start() < pos:
            continue
        depth, i = 1, m.end()
        while i < len(text) and depth:
            if text[i] == "'":  # skip a string literal
                j = text.find("'", i + 1)
                i = len(text) if j < 0 else j
            elif text[i] == "(":
                depth += 1
            elif text[i] == ")":
                depth -= 1
            i += 1
        tail = _NOT_ENFORCED.match(text, i)
        if depth or tail is None:
            continue
        out.append(text[pos:m.start()])
        out.append(" " if m.group(1) is None else "")
        pos = tail.end()
    out.append(text[pos:])
    return "".join(out)


def normalise_ddl(text: str) -> tuple[str, list[str]]:
    """Rewrite clauses of one DDL statement that sqlglot does not read but that do not change
    which rows a table may hold: MySQL's index type before the key columns (``PRIMARY KEY
    USING BTREE (id)``), T-SQL's ``PRIMARY KEY [NON]CLUSTERED``, MySQL's ``CHECK (...) NOT ENFORCED`` (not checked, dropped), SQLite's conflict clauses (``ON CONFLICT REPLACE``) and sort orders /
    collations inside PRIMARY KEY / UNIQUE column lists (``PRIMARY KEY (id DESC)``). Returns
    the text and one line per kind of change made (empty when nothing changed)."""
    changes = []
    out = _USING_INDEX_TYPE.sub(lambda m: m.group(1) + " (", text)
    if out != text:
        changes.append("index type (USING BTREE / HASH) before the key columns ignored (no effect on the rows)")
    text, out = out, _drop_unenforced_checks(out)
    if out != text:
        changes.append("MySQL CHECK ... NOT ENFORCED ignored (MySQL does not check it)")
    text, out = out, _CLUSTERING.sub(lambda m: m.group(1), out)
    if out != text:
        changes.append("T-SQL CLUSTERED / NONCLUSTERED after PRIMARY KEY / UNIQUE ignored (index "
                       "storage, no effect on the rows)")
    text, out = out, _CONFLICT_CLAUSE.sub("", out)
    if out != text:
        changes.append("SQLite conflict clauses (ON CONFLICT ...) ignored (they change how INSERT "
                       "resolves a conflict, not which rows a table may hold)")

    def strip_orders(m: re.Match) -> str:
        inner = re.sub(r"\s+(?:ASC|DESC)\b", "", m.group(2), flags=re.IGNORECASE)
        inner = re.sub(r"\s+COLLATE\s+(?:\w+|\"[^\"]*\")", "", inner, flags=re.IGNORECASE)
        return f"{m.group(1)} ({inner})"

    text, out = out, _KEY_LIST.sub(strip_orders, out)
    if out != text:
        changes.append("sort orders / collations in key column lists ignored (no effect on the rows)")
    return out, changes


#: ALTER statements (pg_dump writes them) that change nothing about which rows a table holds.
_HARMLESS_ALTER = re.compile(
    r"^\s*ALTER\s+(?:TABLE|SEQUENCE|SCHEMA|TYPE|FUNCTION|INDEX|VIEW|DATABASE|DOMAIN|MATERIALIZED\s+VIEW)\b"
    r".*\b(?:OWNER\s+TO|OWNED\s+BY|SET\s+SCHEMA|SET\s+STATISTICS|REPLICA\s+IDENTITY|CLUSTER\s+ON|"
    r"SET\s+DEFAULT|DROP\s+DEFAULT|SET\s+TABLESPACE|RESET\s*\(|SET\s*\(|ENABLE\s+TRIGGER|DISABLE\s+TRIGGER|"
    r"RENAME\s+CONSTRAINT|ATTACH\s+PARTITION)\b", re.IGNORECASE | re.DOTALL)


def _harmless_alter(stmt: exp.Expression) -> bool:
    return isinstance(stmt, exp.Command) and str(stmt.this).upper() == "ALTER" and bool(
        _HARMLESS_ALTER.match(f"ALTER {stmt.expression.this if isinstance(stmt.expression, exp.Expression) else stmt.expression}"))


def _is_opaque_create(stmt: exp.Expression) -> bool:
    """sqlglot's fallback for syntax it does not know: an opaque Command holding the text
    (an ALTER that changes nothing about the rows, :data:`_HARMLESS_ALTER`, is fine)."""
    return isinstance(stmt, exp.Command) and str(stmt.this).upper().split()[0:1] in (["CREATE"], ["ALTER"]) \
        and not _harmless_alter(stmt)


def _parse_statement(text: str, dialect: str) -> tuple[exp.Expression | None, str]:
    """Parse one statement: ``(tree, "")``, or ``(None, why)`` when it does not parse, parses
    only as an opaque CREATE/ALTER command, or is no statement at all."""
    import logging

    logger = logging.getLogger("sqlglot")
    level = logger.level
    logger.setLevel(logging.ERROR)  # the "falling back to Command" warning is handled here
    try:
        trees = [t for t in sqlglot.parse(text, read=sqlglot_dialect(dialect)) if t is not None]
    except SqlglotError as exc:
        return None, _first_line(exc)
    finally:
        logger.setLevel(level)
    if len(trees) != 1:
        return None, f"{len(trees)} statements where one was expected"
    if _is_opaque_create(trees[0]):
        return None, "sqlglot reads it only as an opaque command"
    if not isinstance(trees[0], _STATEMENTS):
        return None, f"not a statement (read as the expression {_short(trees[0].sql(), 40)})"
    misread = _misread_column(trees[0])
    if misread:
        return None, f"{misread} read as a column or a function"
    return trees[0], ""


#: Words that start a table constraint or index in some dialect: a column of that (unquoted)
#: name means the dialect misread the line (SQLite reads MySQL's ``INDEX ix (c)`` as a column
#: named INDEX).
_CONSTRAINT_WORDS = {"INDEX", "KEY", "UNIQUE", "CONSTRAINT", "PRIMARY", "FOREIGN", "CHECK",
                     "FULLTEXT", "SPATIAL"}


def _misread_column(tree: exp.Expression) -> str | None:
    if not (isinstance(tree, exp.Create) and isinstance(tree.this, exp.Schema)):
        return None
    for item in tree.this.expressions:
        if isinstance(item, exp.ColumnDef) and isinstance(item.this, exp.Identifier) \
                and not item.this.quoted and item.name.upper() in _CONSTRAINT_WORDS:
            return f"{item.name.upper()} {_short(item.sql(), 40)}"
        if isinstance(item, (exp.Anonymous, exp.Column)):
            return f"the item {_short(item.sql(), 40)}"
    return None


@dataclass
class DDLStatement:
    """One statement of a schema script: its ``tree``, ``text`` and the ``dialect`` it was
    read in."""

    tree: exp.Expression
    text: str
    dialect: str


@dataclass
class DDLRead:
    """A schema script read statement by statement: ``statements`` (every one parsed),
    ``dialect`` the one most statements were read in, ``notes`` what had to be decided
    (another dialect than the one given, statements kept as opaque commands)."""

    statements: list[DDLStatement]
    dialect: str
    notes: list[str] = field(default_factory=list)


def read_ddl(text: str, dialect: str | None = None, query_dialect: str | None = None) -> DDLRead:
    """Parse a schema script. Each statement is tried with ``dialect`` (the DDL's own, when
    given), then with the dialects its text points to (:func:`detect_ddl_dialects`), then with
    ``query_dialect`` (the queries' dialect, a weaker hint), then with the others. A statement
    read in another dialect than the first of ``dialect`` / ``query_dialect`` is noted.

    Returns a :class:`DDLRead`. Raises SQLReadError naming the first statement that parses in
    no dialect (its position, its first 100 characters and the error in the preferred
    dialect)."""
    own = sqlglot_dialect(dialect) if dialect else None
    hint = sqlglot_dialect(query_dialect) if query_dialect else None
    given = own if own is not None else hint
    order = list(dict.fromkeys(
        ([own] if own is not None else []) + detect_ddl_dialects(text)
        + ([hint] if hint is not None else []) + list(_DDL_FALLBACKS)))
    texts: list[str] | None = None
    split_errors = []
    for d in order:
        try:
            texts = split_statements(text, d)
            break
        except SQLReadError as exc:
            split_errors.append(str(exc))
    if texts is None:
        raise SQLReadError(split_errors[0])
    statements: list[DDLStatement] = []
    moved: dict[str, list[int]] = {}
    opaque: list[str] = []
    normalised: dict[str, list[int]] = {}
    for i, st in enumerate(texts, start=1):
        st, changes = normalise_ddl(st)
        for c in changes:
            normalised.setdefault(c, []).append(i)
        tree = used = None
        reasons = []
        for d in order:
            tree, why = _parse_statement(st, d)
            if tree is not None:
                used = d
                break
            reasons.append(why)
        if tree is None or used is None:
            raise SQLReadError(
                f"schema statement {i} does not parse in any of {order} "
                f"({order[0]}: {reasons[0]}): {_short(st)}")
        if isinstance(tree, exp.Command):
            word = str(tree.this).upper().split()[0] if str(tree.this).split() else "?"
            if _harmless_alter(tree):
                word = "ALTER (ownership, defaults, storage)"
            elif word not in _HARMLESS_COMMANDS:
                raise SQLReadError(f"schema statement {i} is not understood (read only as an "
                                   f"opaque {word} command): {_short(st)}")
            opaque.append(word)
        if given is not None and used != given:
            moved.setdefault(used, []).append(i)
        statements.append(DDLStatement(tree, st, used))
    notes = []
    shown = given or (query_dialect or dialect or "the neutral (ANSI) dialect")
    for d, idx in moved.items():
        why = ("its text points to it: " + ", ".join(_markers(text, d))) if d in detect_ddl_dialects(text) \
            else f"they do not parse as {shown}"
        notes.append(f"schema DDL: statement(s) {', '.join(map(str, idx[:8]))}"
                     f"{' …' if len(idx) > 8 else ''} read as {d}, not {shown} ({why})")
    for change, idx in normalised.items():
        notes.append(f"schema DDL: statement(s) {', '.join(map(str, idx[:8]))}: {change}")
    if opaque:
        notes.append(f"schema DDL: {len(opaque)} statement(s) kept as commands and ignored "
                     f"({', '.join(sorted(set(opaque)))})")
    counts: dict[str, int] = {}
    for s in statements:
        counts[s.dialect] = counts.get(s.dialect, 0) + 1
    main = max(counts, key=counts.get) if counts else (given or order[0])
    return DDLRead(statements, main, notes)


# --------------------------------------------------------------------------------------------
# Queries
# --------------------------------------------------------------------------------------------


class QlMySQLPipes(MySQL):
    """MySQL with ``PIPES_AS_CONCAT`` (ANSI mode): ``||`` concatenates strings."""

    DPIPE_IS_STRING_CONCAT = True

    class Parser(MySQL.Parser):  # type: ignore[name-defined]
        DISJUNCTION: ClassVar[dict] = {
            k: v for k, v in MySQL.Parser.DISJUNCTION.items() if k != TokenType.DPIPE}

        def _parse_bitwise(self):
            this = super()._parse_bitwise()
            while self._match(TokenType.DPIPE):
                this = self.expression(exp.DPipe(this=this, expression=super()._parse_bitwise(),
                                                 safe=not self.dialect.STRICT_STRING_CONCAT))
            return this


_CONDITIONS = (exp.Predicate, exp.Connector, exp.Not, exp.Boolean, exp.Xor)


def _is_condition(node: exp.Expression) -> bool:
    while isinstance(node, exp.Paren):
        node = node.this
    return isinstance(node, _CONDITIONS)


@dataclass
class ReadQuery:
    """A parsed and normalised query: ``tree`` (a SELECT / set operation), ``text`` as given,
    ``dialect`` (sqlglot name), ``readings`` the decisions taken (one line each), ``changed``
    whether the tree differs from a plain parse (then the SQL must be regenerated)."""

    tree: exp.Query
    text: str
    dialect: str
    readings: list[str] = field(default_factory=list)
    changed: bool = False


def _parse_one_query(sql: str, read) -> exp.Expression:
    trees = [t for t in sqlglot.parse(sql, read=read) if t is not None]
    if len(trees) != 1:
        raise SQLReadError(f"{len(trees)} statements where one SELECT query was expected")
    if not isinstance(trees[0], exp.Query):
        kind = type(trees[0]).__name__.upper()
        if isinstance(trees[0], exp.Command):
            kind = str(trees[0].this).upper()
        raise SQLReadError(f"is a {kind} statement, not a query (the queries compared must be "
                           "SELECT / WITH / set operations)")
    return trees[0]


def read_query(sql: str, dialect: str | None) -> ReadQuery:
    """Parse one query in ``dialect`` and normalise it (see the module docstring).

    Raises SQLReadError (a ValueError) with a short message when it does not parse or is not a
    single SELECT / WITH / set-operation statement."""
    name = sqlglot_dialect(dialect)
    try:
        tree = _parse_one_query(sql, name)
        out = ReadQuery(tree, sql, name)  # type: ignore[arg-type]
        if name == "mysql":
            _mysql_pipes(out)
        _rewrite_engine_identifiers(out)
        _group_by_literals(out)
        _unix_timestamp(out)
        _freeze_time(out)
        out.tree.sql()  # a tree too deep to write is found here, not in the engine
    except SqlglotError as exc:
        raise SQLReadError(f"does not parse ({dialect}): {_first_line(exc)}") from None
    except RecursionError:
        raise SQLReadError(f"is nested too deeply to read ({len(sql)} characters; sqlglot's "
                           "recursion limit)") from None
    return out


def _mysql_pipes(q: ReadQuery) -> None:
    try:
        has_pipes = any(t.token_type == TokenType.DPIPE for t in sqlglot.tokenize(q.text, read="mysql"))
    except SqlglotError:
        return
    if not has_pipes:
        return
    bad = [o for o in q.tree.find_all(exp.Or) if not (_is_condition(o.this) and _is_condition(o.expression))
           and not _boolean_context(o) and not (_is_number(o.this) and _is_number(o.expression))]
    if not bad:
        q.readings.append("`||` read as OR (MySQL's default): its operands are conditions")
        return
    try:
        concat = _parse_one_query(q.text, QlMySQLPipes)
    except (SqlglotError, SQLReadError):
        q.readings.append("`||` read as OR (MySQL's default); as concatenation the query does not parse")
        return
    q.tree = concat  # type: ignore[assignment]
    q.changed = True
    q.readings.append(
        f"`||` read as string concatenation (ANSI / PIPES_AS_CONCAT), not MySQL's default OR: "
        f"an operand is not a condition ({_short(bad[0].sql('mysql'), 60)})")


def _is_number(node: exp.Expression) -> bool:
    while isinstance(node, exp.Paren):
        node = node.this
    return (isinstance(node, exp.Literal) and not node.is_string) or isinstance(node, exp.Boolean)


def _boolean_context(node: exp.Expression) -> bool:
    """``node`` is a condition by its place: a WHERE / HAVING / ON / QUALIFY clause, a CASE
    WHEN condition, an operand of AND / OR / NOT."""
    child, parent = node, node.parent
    while isinstance(parent, exp.Paren):
        child, parent = parent, parent.parent
    if isinstance(parent, (exp.And, exp.Or, exp.Not, exp.Where, exp.Having, exp.Qualify)):
        return True
    if isinstance(parent, exp.Join) and child.arg_key == "on":
        return True
    return isinstance(parent, exp.If) and child.arg_key == "this"


def mysql_pipes_numeric(q: ReadQuery, numeric) -> None:
    """MySQL ``||`` read as concatenation whose operands are both numeric or boolean
    (``numeric(node)``: a column of such a type, a number): MySQL ORs them, so it becomes OR
    again (stated in :attr:`ReadQuery.readings`)."""
    if q.dialect != "mysql":
        return
    changed = []
    for node in list(q.tree.find_all(exp.DPipe)):
        if all(_is_number(x) or numeric(x) for x in (node.this, node.expression)):
            node.replace(exp.Or(this=node.this.copy(), expression=node.expression.copy()))
            changed.append(node.sql("mysql")[:40])
    if changed:
        q.changed = True
        if not any(True for _ in q.tree.find_all(exp.DPipe)):
            q.readings[:] = [r for r in q.readings if not r.startswith("`||` read as string concatenation")]
        q.readings.append(f"`||` with numeric / boolean operands read as OR, as MySQL does "
                          f"({', '.join(changed[:3])})")


def _rewrite_engine_identifiers(q: ReadQuery) -> None:
    seen: list[str] = []
    for node in list(q.tree.find_all(exp.Placeholder, exp.Parameter)):
        inner = node.this
        name = inner.name if isinstance(inner, exp.Expression) else inner
        if not isinstance(name, str) or not _PLAIN_IDENTIFIER.fullmatch(name or "") \
                or f"${name}" not in q.text:
            continue  # `?`, `$1`, `:name`: a real parameter, left for the engine to refuse
        ident = exp.Identifier(this=f"${name}", quoted=True)
        parent = node.parent
        if isinstance(parent, exp.Column) and node.arg_key == "this":
            node.replace(ident)
        else:
            node.replace(exp.Column(this=ident))
        seen.append(f"${name}")
        q.changed = True
    for ident in q.tree.find_all(exp.Identifier):
        if not ident.quoted and not _PLAIN_IDENTIFIER.fullmatch(ident.name or "x"):
            ident.set("quoted", True)
            q.changed = True
            if "$" in ident.name:
                seen.append(ident.name)
    if seen:
        names = ", ".join(dict.fromkeys(seen))
        q.readings.append(f"rewrite-engine names read as identifiers: {names}")


def _has_aggregate(node: exp.Expression) -> bool:
    return any(isinstance(n, (exp.AggFunc, exp.Window)) for n in node.walk())


def _group_by_literals(q: ReadQuery) -> None:
    positions = q.dialect in _GROUP_BY_POSITIONS
    for select in q.tree.find_all(exp.Select):
        group = select.args.get("group")
        if group is None:
            continue
        items = select.expressions
        for lit in list(group.expressions):
            if not (isinstance(lit, exp.Literal) and not lit.is_string and lit.this.isdigit()):
                continue
            n = int(lit.this)
            star = any(isinstance(e, exp.Star) or (isinstance(e, exp.Column) and isinstance(e.this, exp.Star))
                       for e in items)
            if positions and 1 <= n <= len(items) and not star and not _has_aggregate(items[n - 1]):
                continue  # a position, as the dialect reads it
            why = ("the dialect has no GROUP BY positions" if not positions else
                   f"select item {n} is an aggregate" if 1 <= n <= len(items) and not star
                   else f"there is no select item {n}")
            lit.replace(exp.Cast(this=lit.copy(), to=exp.DataType.build("INT")))
            q.changed = True
            q.readings.append(f"GROUP BY {n} read as the constant {n}, not a position ({why})")


def _unix_timestamp(q: ReadQuery) -> None:
    for fn in list(q.tree.find_all(exp.Anonymous)):
        if str(fn.this).upper() != "UNIX_TIMESTAMP" or len(fn.expressions) > 1:
            continue
        arg = fn.expressions[0] if fn.expressions else exp.CurrentTimestamp()
        epoch = exp.TimeToUnix(this=exp.Cast(this=arg.copy(), to=exp.DataType.build("TIMESTAMP")))
        fn.replace(exp.Cast(this=epoch, to=exp.DataType.build("BIGINT")))
        q.changed = True
        q.readings.append("UNIX_TIMESTAMP(x) read as whole epoch seconds of x as a UTC timestamp")


#: The instant ``now()`` and its kind stand for, in both queries of a pair.
FROZEN_NOW = "2000-01-02 12:00:00"
_NOW_CLASSES = tuple(getattr(exp, n) for n in (
    "CurrentTimestamp", "CurrentDatetime", "Localtimestamp", "Systimestamp", "UtcTimestamp",
    "CurrentTimestampLTZ") if hasattr(exp, n))
_NOW_NAMES = {"NOW", "SYSDATE", "GETDATE", "GETUTCDATE", "CLOCK_TIMESTAMP", "STATEMENT_TIMESTAMP",
              "TRANSACTION_TIMESTAMP", "LOCALTIMESTAMP", "SYSDATETIME", "UTC_TIMESTAMP",
              "CURRENT_TIMESTAMP", "GET_CURRENT_TIME", "GET_CURRENT_TIMESTAMP", "CURRENT_LOCALTIMESTAMP",
              "SYSDATETIMEOFFSET", "TODAY"}
_TODAY_NAMES = {"CURDATE", "UTC_DATE", "CURRENT_DATE", "TODAY"}
_SQLITE_TIME_FUNCTIONS = {"DATETIME", "DATE", "TIME", "JULIANDAY", "STRFTIME", "UNIXEPOCH", "TIMEDIFF"}


def _freeze_time(q: ReadQuery) -> None:
    """``now()``, ``CURRENT_TIMESTAMP``, ``CURRENT_DATE``, ``CURRENT_TIME`` (and SQLite's
    ``'now'``) become one fixed instant, :data:`FROZEN_NOW`: both queries of a pair then run
    at the same moment, as the statements of one transaction would."""
    date, time_ = FROZEN_NOW.split()
    found = []
    for node in list(q.tree.walk()):
        repl = None
        name = str(node.this).upper() if isinstance(node, exp.Anonymous) else ""
        if isinstance(node, _NOW_CLASSES) or name in _NOW_NAMES - {"TODAY"}:
            repl = exp.Cast(this=exp.Literal.string(FROZEN_NOW), to=exp.DataType.build("TIMESTAMP"))
        elif isinstance(node, exp.CurrentDate) or name in _TODAY_NAMES:
            repl = exp.Cast(this=exp.Literal.string(date), to=exp.DataType.build("DATE"))
        elif isinstance(node, (exp.CurrentTime, getattr(exp, "Localtime", exp.CurrentTime))) or name in ("CURTIME", "UTC_TIME"):
            repl = exp.Cast(this=exp.Literal.string(time_), to=exp.DataType.build("TIME"))
        elif isinstance(node, exp.Literal) and node.is_string and node.this.lower() == "now":
            fn = node.parent
            fname = str(fn.this).upper() if isinstance(fn, exp.Anonymous) else type(fn).__name__.upper()
            if fname in _SQLITE_TIME_FUNCTIONS or isinstance(fn, (exp.TimeToStr, exp.Date, exp.StrToTime)):
                node.replace(exp.Literal.string(FROZEN_NOW))
                found.append("'now'")
            continue
        if repl is not None:
            found.append(node.sql(q.dialect)[:30] if not isinstance(node, exp.Anonymous) else f"{node.this}()")
            node.replace(repl)
    if found:
        q.changed = True
        q.readings.append(f"{', '.join(dict.fromkeys(found))} frozen to {FROZEN_NOW} (one "
                          "instant for both queries)")


def strip_qualifiers(tree: exp.Expression) -> tuple[exp.Expression, list[str]]:
    """``hr.emp`` → ``emp`` in table references and ``hr.emp.id`` → ``emp.id`` in columns
    (the sandbox holds every table in one schema). Returns the new tree (a copy when changed)
    and the qualified names dropped."""
    dropped = []
    if not any(t.args.get("db") or t.args.get("catalog") for t in tree.find_all(exp.Table)) and \
            not any(c.args.get("db") or c.args.get("catalog") for c in tree.find_all(exp.Column)):
        return tree, dropped
    tree = tree.copy()
    ctes = {c.alias_or_name.lower() for c in tree.find_all(exp.CTE)}
    for t in tree.find_all(exp.Table):
        if t.args.get("db") or t.args.get("catalog"):
            if t.name.lower() in ctes:
                continue
            dropped.append(t.sql())
            t.set("db", None)
            t.set("catalog", None)
    for c in tree.find_all(exp.Column):
        if c.args.get("db") or c.args.get("catalog"):
            c.set("db", None)
            c.set("catalog", None)
    return tree, list(dict.fromkeys(dropped))


#: What MySQL semantics the DuckDB / SQLite approximation keeps and which it does not.
MYSQL_APPROXIMATION = (
    "MySQL semantics approximated by {engine} (no MySQL server here): text compared "
    "case-insensitively as by MySQL's default *_ci collations (columns declared COLLATE NOCASE, "
    "results compared case-folded), trailing spaces ignored as by PAD SPACE (string constants "
    "compared with a value lose trailing spaces, no generated value ends in a space, results "
    "compared without them), `/` of exact numbers rounded to MySQL's result scale (the "
    "dividend's + 4, div_precision_increment) and numbers compared within 1e-4 when a query "
    "divides; not modelled: accent-insensitive comparison, implicit "
    "string-to-number conversion ('abc' = 0), integer overflow and zero-date rules — a difference "
    "in these classes can still show")


def mysql_approximation(tree: exp.Expression, scale_of=None) -> exp.Expression:
    """A MySQL query tree rewritten for DuckDB / SQLite so that MySQL's comparisons hold (see
    :data:`MYSQL_APPROXIMATION`): string constants compared with a value lose trailing spaces
    (PAD SPACE), and the outermost arithmetic expression around ``x / y`` of exact numbers is
    rounded to MySQL's result scale (a division adds 4 decimals, div_precision_increment; a
    sum keeps the larger scale, a product adds them). ``scale_of(node)``: the scale of an exact
    operand (0 for integers), None for approximate or unknown ones."""
    tree = tree.copy()
    comparisons = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.NullSafeEQ,
                   exp.NullSafeNEQ, exp.In, exp.Between)
    for node in tree.find_all(*comparisons):
        for lit in [c for c in node.iter_expressions() if isinstance(c, exp.Literal) and c.is_string]:
            if lit.this != lit.this.rstrip(" "):
                lit.replace(exp.Literal.string(lit.this.rstrip(" ")))
    if scale_of is None:
        return tree
    arithmetic = (exp.Add, exp.Sub, exp.Mul, exp.Div, exp.Mod, exp.Neg, exp.Paren)

    def scale(node: exp.Expression) -> int | None:
        """MySQL's result scale of an exact-number expression (None: approximate / unknown)."""
        if isinstance(node, exp.Paren | exp.Neg):
            return scale(node.this)
        if isinstance(node, (exp.Add, exp.Sub, exp.Mod)):
            a, b = scale(node.this), scale(node.expression)
            return None if a is None or b is None else max(a, b)
        if isinstance(node, exp.Mul):
            a, b = scale(node.this), scale(node.expression)
            return None if a is None or b is None else a + b
        if isinstance(node, exp.Div):
            a, b = scale(node.this), scale(node.expression)
            return None if a is None or b is None else a + 4
        if isinstance(node, (exp.IntDiv, exp.Count)):
            return 0
        if isinstance(node, (exp.Sum, exp.Max, exp.Min)):
            return scale(node.this)
        if isinstance(node, exp.Avg):  # AVG of exact numbers: 4 more decimals, as `/`
            inner = scale(node.this)
            return None if inner is None else inner + 4
        return scale_of(node)

    # the outermost arithmetic around a division keeps MySQL's scale; inside it, MySQL
    # computes with more digits, as DuckDB does
    for div in list(tree.find_all(exp.Div, exp.Avg)):
        top = div
        while isinstance(top.parent, arithmetic):
            top = top.parent
        s_top = scale(top)
        if s_top is None or top.meta.get("ql_rounded"):
            continue
        rounded = exp.Round(this=top.copy(), decimals=exp.Literal.number(s_top))
        rounded.meta["ql_rounded"] = True
        top.replace(rounded)
    return tree


def _sqlite_values(tree: exp.Expression) -> exp.Expression:
    """``(VALUES ...) AS t(a, b)`` → ``(SELECT column1 AS a, column2 AS b FROM (VALUES ...)) AS t``
    (SQLite names VALUES columns column1, column2, ... and has no alias list for them)."""
    tree = tree.copy()
    for values in list(tree.find_all(exp.Values)):
        alias = values.args.get("alias")
        cols = alias.columns if isinstance(alias, exp.TableAlias) else []
        if not cols:
            continue
        inner = values.copy()
        inner.set("alias", None)
        select = exp.select(*[exp.alias_(exp.column(f"column{i + 1}"), c.copy())
                              for i, c in enumerate(cols)]).from_(exp.Subquery(this=inner))
        values.replace(exp.Subquery(this=select, alias=exp.TableAlias(this=alias.this.copy())))
    return tree


def engine_tree(tree: exp.Expression, dialect: str | None, engine: str, scale_of=None) -> exp.Expression:
    """A normalised query tree made ready for ``engine``: qualifiers dropped
    (:func:`strip_qualifiers`), the MySQL approximation applied for a MySQL query on another
    engine (:func:`mysql_approximation`), ``VALUES ... AS t(c)`` rewritten for SQLite."""
    tree, _ = strip_qualifiers(tree)
    if sqlglot_dialect(dialect) == "mysql" and engine != "mysql":
        tree = mysql_approximation(tree, scale_of)
    if engine == "sqlite":
        tree = _sqlite_values(tree)
    return tree


def engine_sql(query: ReadQuery | str, dialect: str | None, engine: str, scale_of=None) -> str:
    """The query written for ``engine`` (``duckdb``, ``sqlite``, ``postgres``, or any sqlglot
    dialect): the original text when the dialect is the engine's own and normalising changed
    nothing, else generated by sqlglot from the tree of :func:`engine_tree`. Raises
    SQLReadError / sqlglot errors."""
    q = query if isinstance(query, ReadQuery) else read_query(query, dialect)
    tree = engine_tree(q.tree, q.dialect, engine, scale_of)
    if q.dialect == engine and not q.changed and tree is q.tree:
        return q.text
    return tree.sql(dialect=engine)
