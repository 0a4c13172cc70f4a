"""Extracting the structural features of one parsed SQL query (:class:`_Extractor`): scopes and
their FROM items, alias normalisation and column attribution, WHERE basic predicates in canonical
form, join pairs, aggregates, window functions, functions and constants (definitions in
:mod:`tasks.text2sql.sql_features`, whose :func:`~tasks.text2sql.sql_features.extract_features`
parses the text and runs it).

Split out of :mod:`tasks.text2sql.sql_features`; the code moved verbatim."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sqlglot import exp
from sqlglot.optimizer.scope import Scope, ScopeType, traverse_scope

from tasks.text2sql.sql_feature_types import SchemaIndex, SQLFeatureError, SQLFeatures


_RENDER = {"dialect": "postgres", "normalize_functions": "lower"}
# Func subclasses that are not function calls: CASE, EXISTS, AND/OR/XOR, COLLATE
_NOT_FUNCTIONS = (exp.Case, exp.Exists, exp.Connector, exp.Collate)
_SUBQUERY_PLACEHOLDER = "(subquery)"
# comparison flipped when its sides are swapped into canonical order
_FLIP = {
    exp.EQ: exp.EQ,
    exp.NEQ: exp.NEQ,
    exp.GT: exp.LT,
    exp.LT: exp.GT,
    exp.GTE: exp.LTE,
    exp.LTE: exp.GTE,
    exp.NullSafeEQ: exp.NullSafeEQ,
}


@dataclass
class _Source:
    key: tuple[int, str]  # (id of scope, alias): identity of one FROM item
    relation: str  # base table / CTE name / derived-table alias (lower-case)
    columns: frozenset[str] | None  # known column names, None when unknown
    base: bool  # a base table (not a CTE or derived table)


def _from_clause(select: exp.Select) -> exp.From | None:
    return select.args.get("from_") or select.args.get("from")


def _scope_nodes(root: exp.Expression) -> Iterable[exp.Expression]:
    """Nodes of ``root``'s own scope: a DFS that does not enter nested queries."""
    stack = [root]
    while stack:
        node = stack.pop()
        yield node
        for child in node.iter_expressions():
            if isinstance(child, exp.Query):
                continue
            stack.append(child)


class _Extractor:
    def __init__(self, tree: exp.Query, schema: SchemaIndex | None):
        self.tree = tree
        self.schema = schema
        self.sources: dict[int, dict[str, _Source]] = {}
        self.resolved: dict[int, _Source | None] = {}

    # -- sources and column attribution ------------------------------------------------------

    def scope_sources(self, scope: Scope) -> dict[str, _Source]:
        cached = self.sources.get(id(scope))
        if cached is not None:
            return cached
        out: dict[str, _Source] = {}
        for alias, (node, source) in scope.selected_sources.items():
            key = (id(scope), alias.lower())
            if isinstance(source, exp.Table):
                rel = source.name.lower()
                cols = self.schema.columns(rel) if self.schema is not None else None
                out[alias.lower()] = _Source(key, rel, cols, True)
            elif isinstance(source, Scope):
                if source.scope_type == ScopeType.CTE and isinstance(node, exp.Table):
                    rel = node.name.lower()
                else:
                    rel = alias.lower()
                try:
                    names = frozenset(n.lower() for n in source.expression.named_selects)
                except Exception:  # pragma: no cover - exotic sources
                    names = None
                if names is not None and "*" in names:
                    names = None
                out[alias.lower()] = _Source(key, rel, names or None, False)
        self.sources[id(scope)] = out
        return out

    def resolve(self, column: exp.Column, scope: Scope) -> _Source | None:
        qualifier = column.table.lower()
        name = column.name.lower()
        s: Scope | None = scope
        while s is not None:
            srcs = self.scope_sources(s)
            if qualifier:
                if qualifier in srcs:
                    return srcs[qualifier]
            elif srcs:
                known = [v for v in srcs.values() if v.columns is not None and name in v.columns]
                if len(known) == 1:
                    return known[0]
                if len(known) > 1:
                    return None
                unknown = [v for v in srcs.values() if v.columns is None]
                if unknown:
                    return unknown[0] if len(srcs) == 1 else None
            s = s.parent
        return None

    def normalise_columns(self, scopes: list[Scope]) -> None:
        """Attribute every column, then rewrite it in place as ``relation.column`` (lower case);
        interval units are made singular (``'60 days'`` → ``'60' DAY``)."""
        plan: list[tuple[exp.Column, _Source | None, str]] = []
        for scope in scopes:
            for node in _scope_nodes(scope.expression):
                if isinstance(node, exp.Interval):
                    unit = node.args.get("unit")
                    if (
                        isinstance(unit, exp.Var)
                        and len(unit.name) > 1
                        and unit.name.upper().endswith("S")
                    ):
                        node.set("unit", exp.Var(this=unit.name.upper()[:-1]))
                elif isinstance(node, exp.Column):
                    src = self.resolve(node, scope)
                    qualifier = src.relation if src is not None else node.table.lower()
                    plan.append((node, src, qualifier))
        for col, src, qualifier in plan:
            self.resolved[id(col)] = src
            if isinstance(col.this, exp.Star):
                col.set("table", exp.to_identifier(qualifier) if qualifier else None)
            else:
                col.set("this", exp.to_identifier(col.name.lower()))
                col.set("table", exp.to_identifier(qualifier) if qualifier else None)
            col.set("db", None)
            col.set("catalog", None)

    # -- rendering ---------------------------------------------------------------------------

    @staticmethod
    def render(node: exp.Expression) -> str:
        if isinstance(node, exp.Query):
            return _SUBQUERY_PLACEHOLDER
        if node.find(exp.Query) is not None:
            node = node.copy()
            for q in list(node.find_all(exp.Query)):
                if q is node:
                    continue
                parent = q.parent
                if isinstance(parent, exp.Subquery):
                    continue  # replaced with its wrapper
                text = "subquery" if isinstance(parent, exp.Exists) else _SUBQUERY_PLACEHOLDER
                q.replace(exp.Var(this=text))
        return node.sql(**_RENDER)

    def render_predicate(self, pred: exp.Expression) -> str:
        cls = type(pred)
        if cls in _FLIP:
            left, right = self.render(pred.this), self.render(pred.expression)
            # canonical order: a side with a column first, then alphabetical
            lkey = (not _has_column(pred.this), left)
            rkey = (not _has_column(pred.expression), right)
            if rkey < lkey:
                left, right = right, left
                cls = _FLIP[cls]
            op = cls(this=exp.Var(this="\x00L"), expression=exp.Var(this="\x00R")).sql(**_RENDER)
            return op.replace("\x00L", left, 1).replace("\x00R", right, 1)
        return self.render(pred)

    @staticmethod
    def column_text(col: exp.Column) -> str:
        name = "*" if isinstance(col.this, exp.Star) else col.name
        return f"{col.table}.{name}" if col.table else name

    @staticmethod
    def constant_text(lit: exp.Expression) -> str | None:
        if isinstance(lit, exp.Interval):
            value = (
                lit.this.name
                if isinstance(lit.this, exp.Literal)
                else lit.this.sql()
                if lit.this
                else ""
            )
            unit = lit.args.get("unit")
            unit_text = unit.name.lower() if unit is not None else ""
            if unit_text.endswith("s") and len(unit_text) > 1:
                unit_text = unit_text[:-1]
            return f"interval '{value} {unit_text}'" if unit_text else f"interval '{value}'"
        if not isinstance(lit, exp.Literal):
            return None
        if lit.is_string:
            return "'" + lit.this.replace("'", "''") + "'"
        text = lit.this
        try:
            value: float | int = int(text)
        except ValueError:
            try:
                f = float(text)
            except ValueError:
                return text
            value = int(f) if f.is_integer() and "e" not in text.lower() and "." not in text else f
        sign = "-" if isinstance(lit.parent, exp.Neg) else ""
        return f"{sign}{value}"

    # -- the walk ----------------------------------------------------------------------------

    def run(self) -> SQLFeatures:
        try:
            scopes = list(traverse_scope(self.tree))
        except Exception as e:
            raise SQLFeatureError(
                f"cannot analyse query blocks: {type(e).__name__}: {e}"[:300]
            ) from None
        self.normalise_columns(scopes)

        columns: list[str] = []
        relations: list[str] = []
        predicates: list[str] = []
        pairs: list[str] = []
        aggs: list[str] = []
        windows: list[str] = []
        funcs: list[str] = []
        consts: list[str] = []
        cte_count = subquery_count = join_count = 0

        for scope in scopes:
            if scope.scope_type == ScopeType.CTE:
                cte_count += 1
            elif scope.scope_type in (ScopeType.SUBQUERY, ScopeType.DERIVED_TABLE):
                subquery_count += 1
            srcs = self.scope_sources(scope)
            relations.extend(s.relation for s in srcs.values() if s.base)
            root = scope.expression
            windowed: set[int] = set()
            for node in _scope_nodes(root):
                if isinstance(node, exp.Window) and isinstance(node.this, exp.Func):
                    fn = node.this
                    windowed.add(id(fn))
                    windows.append(self.render(fn))
                elif isinstance(node, exp.Func):
                    if id(node) in windowed or isinstance(node, _NOT_FUNCTIONS):
                        continue
                    if isinstance(node, exp.AggFunc):
                        aggs.append(self.render(node))
                    else:
                        funcs.append(
                            node.name.lower()
                            if isinstance(node, exp.Anonymous)
                            else node.sql_name().lower()
                        )
                elif isinstance(node, (exp.Literal, exp.Interval)):
                    parent = node.parent
                    if isinstance(node, exp.Literal) and isinstance(parent, exp.Interval):
                        continue
                    if isinstance(parent, (exp.Limit, exp.Offset, exp.Fetch)):
                        continue
                    if (
                        isinstance(parent, (exp.Ordered, exp.Group))
                        and isinstance(node, exp.Literal)
                        and not node.is_string
                    ):
                        continue  # a position number, not a value
                    text = self.constant_text(node)
                    if text is not None:
                        consts.append(text)
            if not isinstance(root, exp.Select):
                continue

            # selected columns
            for proj in root.expressions:
                target = proj.this if isinstance(proj, exp.Alias) else proj
                if isinstance(target, exp.Star):
                    if srcs:
                        columns.extend(f"{s.relation}.*" for s in srcs.values())
                    else:
                        columns.append("*")
                    continue
                for node in _scope_nodes(proj):
                    if isinstance(node, exp.Column):
                        columns.append(self.column_text(node))

            # joins
            joins = root.args.get("joins") or []
            join_count += len(joins)
            add_pair = _PairCollector(pairs)

            from_ = _from_clause(root)
            items = ([from_.this] if from_ is not None else []) + [j.this for j in joins]
            item_src = [srcs.get(it.alias_or_name.lower()) for it in items]
            for i, join in enumerate(joins, start=1):
                on = join.args.get("on")
                explicit = (
                    (join.args.get("kind") or "").upper() not in ("", "CROSS")
                    or join.args.get("side")
                    or join.args.get("method")
                    or join.args.get("using")
                    or on is not None
                )
                found = False
                if on is not None:
                    for pred in _basic_predicates(on):
                        found |= self._equality_pair(pred, scope, add_pair)
                if explicit and not found:
                    add_pair(item_src[i - 1], item_src[i])

            # WHERE
            where = root.args.get("where")
            if where is not None:
                for pred in _basic_predicates(where.this):
                    predicates.append(self.render_predicate(pred))
                    self._equality_pair(pred, scope, add_pair)

        return SQLFeatures(
            columns=tuple(sorted(columns)),
            relations=tuple(sorted(relations)),
            where_predicates=tuple(sorted(predicates)),
            join_pairs=tuple(sorted(pairs)),
            aggregations=tuple(sorted(aggs)),
            window_functions=tuple(sorted(windows)),
            functions=tuple(sorted(funcs)),
            constants=tuple(sorted(consts)),
            cte_count=cte_count,
            subquery_count=subquery_count,
            join_count=join_count,
        )

    def _equality_pair(self, pred: exp.Expression, scope: Scope, add_pair) -> bool:
        if not isinstance(pred, exp.EQ):
            return False
        left, right = pred.this.unnest(), pred.expression.unnest()
        if not (isinstance(left, exp.Column) and isinstance(right, exp.Column)):
            return False
        return add_pair(self.resolved.get(id(left)), self.resolved.get(id(right)))


class _PairCollector:
    """Adds ``"a JOIN b"`` to ``out`` once per pair of FROM items of one scope; calling it
    returns True when the two sources are two different known FROM items."""

    def __init__(self, out: list[str]):
        self.out = out
        self.seen: set[tuple] = set()

    def __call__(self, a: _Source | None, b: _Source | None) -> bool:
        if a is None or b is None or a.key == b.key:
            return False
        k = tuple(sorted((a.key, b.key)))
        if k not in self.seen:
            self.seen.add(k)
            r1, r2 = sorted((a.relation, b.relation))
            self.out.append(f"{r1} JOIN {r2}")
        return True


def _has_column(node: exp.Expression) -> bool:
    """True when ``node`` references a column of its own scope (nested queries not entered)."""
    return any(isinstance(n, exp.Column) for n in _scope_nodes(node))


def _basic_predicates(cond: exp.Expression) -> list[exp.Expression]:
    """Split a condition through AND / OR / parentheses (and NOT over a compound condition)."""
    out: list[exp.Expression] = []
    stack = [cond]
    while stack:
        node = stack.pop()
        if isinstance(node, exp.Paren):
            stack.append(node.this)
        elif isinstance(node, exp.Connector):  # And, Or (, Xor)
            stack.append(node.expression)
            stack.append(node.this)
        elif isinstance(node, exp.Not) and isinstance(node.this.unnest(), exp.Connector):
            stack.append(node.this)
        else:
            out.append(node)
    return out
