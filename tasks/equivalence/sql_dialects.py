"""Reading the SQL of equivalence pairs in any dialect, with every non-obvious reading stated.

Published pair sets mix dialects: Calcite rewrite pairs come with MySQL DDL (backticks) and
ANSI queries written by a rewrite engine (``$f0``, ``EXPR$0``, ``||`` for concatenation,
``GROUP BY`` a literal), Spider ships MySQL DDL for SQLite queries. This module reads them with
sqlglot and says what it had to decide, so that no reading is silent:

- :func:`tasks.equivalence.sql_ddl.read_ddl`: the statements of a schema script, each parsed with the dialect given, else
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
