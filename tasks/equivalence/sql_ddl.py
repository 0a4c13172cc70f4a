"""Reading schema scripts (DDL) of equivalence pairs in any dialect, with every non-obvious
reading stated: :func:`read_ddl` parses each statement with the dialect given, else the one its
text points to (:func:`detect_ddl_dialects`), else the others in turn; a statement no dialect
reads is a :class:`tasks.equivalence.sql_dialects.SQLReadError`, never dropped.

Split out of :mod:`tasks.equivalence.sql_dialects`; the code moved verbatim."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError
from sqlglot.tokens import TokenType

from tasks.equivalence.sql_dialects import SQLReadError, _first_line, _short, sqlglot_dialect


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
