"""Finding the arbitrary choices a query's SQL leaves to the engine (:class:`_Analyzer`):
order-sensitive aggregates, peer-order window functions, DISTINCT ON, bare columns,
``random()``, subqueries cut by a LIMIT over no total order — the *wildcard* output columns
and the reasons a whole result may vary, which :func:`tasks.equivalence.query_plan.plan_query`
turns into a :class:`tasks.equivalence.query_plan.QueryPlan`.

Split out of :mod:`tasks.equivalence.query_plan`; the code moved verbatim."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlglot import exp


#: Aggregates whose value depends on the order rows arrive in (unless ordered inside).
_ORDER_SENSITIVE_AGGS: tuple[type, ...] = (
    exp.GroupConcat, exp.ArrayAgg, exp.ArrayConcatAgg, exp.ArrayUnionAgg, exp.AnyValue,
    exp.First, exp.Last, exp.ArgMax, exp.ArgMin, exp.FirstValue, exp.LastValue, exp.NthValue,
    exp.JSONArrayAgg, exp.Mode,
)
_ORDER_SENSITIVE_NAMES = {
    "STRING_AGG", "LISTAGG", "LIST", "ARRAY_AGG", "JSON_AGG", "JSONB_AGG", "JSON_GROUP_ARRAY",
    "JSON_ARRAYAGG", "ARBITRARY", "ANY_VALUE", "FIRST", "LAST", "ARG_MAX", "ARG_MIN",
    "MAX_BY", "MIN_BY", "GROUP_CONCAT", "ARRAY_AGG_DISTINCT", "HISTOGRAM",
}
#: Window functions whose value depends on the order of peers.
_ORDER_SENSITIVE_WINDOWS: tuple[type, ...] = (
    exp.RowNumber, exp.Lag, exp.Lead, exp.FirstValue, exp.LastValue, exp.NthValue, exp.Ntile,
)
#: Functions whose value is random.
_RANDOM = (exp.Rand, exp.Randn, exp.Uuid, exp.Randstr)
_RANDOM_NAMES = {
    "RANDOM", "RAND", "UUID", "NEWID", "GEN_RANDOM_UUID", "UUID_GENERATE_V4", "RANDOM_UUID",
    "RANDOMBLOB", "SETSEED", "UUIDV4", "UUIDV7", "RANDINT", "UNIFORM", "NORMAL",
}


def _sql(node: exp.Expression) -> str:
    return node.sql(comments=False).lower()


def _from_sources(select: exp.Select) -> list[exp.Expression]:
    out: list[exp.Expression] = []
    frm = select.args.get("from_") or select.args.get("from")
    if frm is not None:
        out.append(frm.this)
    for j in select.args.get("joins") or []:
        out.append(j.this)
    return out


def _local(node: exp.Expression, kinds: tuple[type, ...] | type, root: exp.Expression) -> list:
    """Nodes of ``kinds`` under ``node`` that belong to the query level of ``root`` (not inside
    a nested subquery / SELECT)."""
    prune = lambda n: n is not node and n is not root and isinstance(n, (exp.Select, exp.Subquery))
    return [n for n in node.walk(prune=prune) if isinstance(n, kinds)]


def _is_random(node: exp.Expression) -> bool:
    return isinstance(node, _RANDOM) or (
        isinstance(node, exp.Anonymous) and str(node.this).upper() in _RANDOM_NAMES)


def _agg_order(agg: exp.Expression) -> exp.Order | None:
    inner = agg.this
    if isinstance(inner, exp.Order):
        return inner
    parent = agg.parent
    if isinstance(parent, exp.WithinGroup) and isinstance(parent.expression, exp.Order):
        return parent.expression
    for e in getattr(agg, "expressions", None) or []:
        if isinstance(e, exp.Order):
            return e
    return None


def _agg_values(agg: exp.Expression) -> list[exp.Expression]:
    inner = agg.this
    if isinstance(inner, exp.Order):
        inner = inner.this
    if isinstance(inner, exp.Distinct):
        return list(inner.expressions)
    vals = [inner] if isinstance(inner, exp.Expression) else []
    if isinstance(agg, exp.Anonymous):
        vals = [e for e in agg.expressions[:1] if not isinstance(e, exp.Order)]
    return vals


class _Analyzer:
    """Finds the arbitrary choices of one (normalised) query tree over ``schema``."""

    def __init__(self, tree: exp.Expression, schema: Any, bare_columns: bool, dialect: str = "") -> None:
        self.tree = tree
        self.dialect = dialect
        self.schema = schema
        self.bare_columns = bare_columns
        self.wildcard_items: set[int] = set()
        self.wildcard_exprs: list[exp.Expression] = []
        self.opaque: list[str] = []
        self.choices: list[str] = []
        self.cuts: list[exp.Select] = []

    # -- helpers ---------------------------------------------------------------------------

    def _table(self, name: str):
        try:
            return self.schema.table(name) if self.schema is not None else None
        except KeyError:
            return None

    def _sources(self, select: exp.Select) -> list[tuple[str, Any]] | None:
        """``(alias, Table)`` of the FROM clause's base tables; None when a source is not a
        base table of the schema (a derived table, a function, VALUES)."""
        out = []
        ctes = {c.alias_or_name.lower() for c in self.tree.find_all(exp.CTE)}
        for src in _from_sources(select):
            if not isinstance(src, exp.Table) or src.name.lower() in ctes:
                return None
            table = self._table(src.name)
            if table is None:
                return None
            out.append((src.alias_or_name.lower(), table))
        return out

    def _group_exprs(self, select: exp.Select) -> list[exp.Expression]:
        group = select.args.get("group")
        if group is None:
            return []
        items = select.expressions
        out = []
        for g in group.expressions:
            if isinstance(g, exp.Literal) and not g.is_string and g.this.isdigit() \
                    and 1 <= int(g.this) <= len(items):
                out.append(items[int(g.this) - 1].unalias())
                continue
            if isinstance(g, exp.Column) and not g.table:
                alias = next((e for e in items if isinstance(e, exp.Alias)
                              and e.alias.lower() == g.name.lower()), None)
                if alias is not None:
                    out.append(alias.this)
                    continue
            out.append(g)
        return out

    def _is_aggregate_select(self, select: exp.Select) -> bool:
        if select.args.get("group") is not None:
            return True
        return any(_local(e, exp.AggFunc, select) and not _local(e, exp.Window, select)
                   for e in select.expressions)

    def total(self, select: exp.Select, keys: Sequence[exp.Expression]) -> bool:
        """Whether ordering the rows of ``select`` by ``keys`` leaves no ties between
        different rows (see the module docstring)."""
        key_sqls = {_sql(k) for k in keys}
        group = self._group_exprs(select)
        if group:
            return all(_sql(g) in key_sqls for g in group)
        if self._is_aggregate_select(select):
            return True  # one row
        sources = self._sources(select)
        if not sources:
            return False
        key_cols = [k for k in keys if isinstance(k, exp.Column)]
        for alias, table in sources:
            names = set()
            for c in key_cols:
                q = c.table.lower()
                if q in (alias, table.name.lower()) or (not q and len(sources) == 1) or not q and _has_column(table, c.name) and not any(
                        _has_column(t2, c.name) for a2, t2 in sources if a2 != alias):
                    names.add(c.name.lower())
            ok = False
            for key in table.keys:
                cols = {k.lower() for k in key}
                nulls_ok = key == table.primary_key or all(table.column(k).not_null for k in key) \
                    or tuple(key) in getattr(table, "nulls_not_distinct", [])
                if cols and cols <= names and nulls_ok:
                    ok = True
                    break
            if not ok:
                return False
        return True

    @staticmethod
    def covers_outputs(select: exp.Select, keys: Sequence[exp.Expression]) -> bool:
        """Every output expression of ``select`` is among ``keys`` (tied rows are equal)."""
        if any(isinstance(e, exp.Star) or (isinstance(e, exp.Column) and isinstance(e.this, exp.Star))
               for e in select.expressions):
            return False
        key_sqls = {_sql(k) for k in keys}
        aliases = {}
        for e in select.expressions:
            if isinstance(e, exp.Alias):
                aliases[e.alias.lower()] = _sql(e.this)
        key_sqls |= {aliases[k] for k in list(key_sqls) if k in aliases}
        return all(_sql(e.unalias()) in key_sqls or e.alias_or_name.lower() in key_sqls
                   for e in select.expressions)

    def _where(self, node: exp.Expression) -> tuple[exp.Select | None, int | None]:
        """The SELECT ``node`` belongs to, and the index of the select item it is in (None
        when it is elsewhere in that SELECT)."""
        select = node.find_ancestor(exp.Select)
        if select is None:
            return None, None
        child = node
        while child.parent is not None and child.parent is not select:
            child = child.parent
        if child.arg_key == "expressions" and child in select.expressions:
            return select, select.expressions.index(child)
        return select, None

    def _choice(self, node: exp.Expression, why: str) -> None:
        """Record an arbitrary choice at ``node``: a wildcard column when it sits in a select
        item of the outermost SELECT (and nothing else reads that item), else opaque."""
        text = f"{why}: {node.sql(dialect=self.dialect)[:70]}"
        if text not in self.choices:
            self.choices.append(text)
        select, item = self._where(node)
        top = self.tree
        if select is top and item is not None and isinstance(top, exp.Select):
            inner = node.find_ancestor(exp.Subquery, exp.Select)
            if inner is top:
                star_before = any(
                    isinstance(e, exp.Star) or (isinstance(e, exp.Column) and isinstance(e.this, exp.Star))
                    for e in top.expressions[:item + 1])
                distinct = top.args.get("distinct") is not None
                name = top.expressions[item].alias_or_name.lower()
                used = name and any(
                    isinstance(c, exp.Column) and not c.table and c.name.lower() == name
                    for key in ("where", "having", "qualify", "group")
                    if top.args.get(key) is not None for c in top.args[key].find_all(exp.Column))
                group = top.args.get("group")
                by_position = group is not None and any(
                    isinstance(g, exp.Literal) and g.this == str(item + 1) for g in group.expressions)
                if not (star_before or distinct or used or by_position):
                    self.wildcard_items.add(item)
                    self.wildcard_exprs.append(top.expressions[item])
                    return
        reason = f"{why} outside the outermost select list ({node.sql(dialect=self.dialect)[:70]})"
        if reason not in self.opaque:
            self.opaque.append(reason)

    # -- the rules -------------------------------------------------------------------------

    def run(self) -> None:
        for node in list(self.tree.walk()):
            if isinstance(node, exp.TableSample):
                self.opaque.append(f"a sample of the rows ({node.sql()[:60]})")
            elif _is_random(node):
                self._choice(node, "a random value")
            elif isinstance(node, exp.Window):
                self._window(node)
            elif (isinstance(node, _ORDER_SENSITIVE_AGGS) or (
                    isinstance(node, exp.Anonymous) and str(node.this).upper() in _ORDER_SENSITIVE_NAMES)) \
                    and not _window_function(node):
                self._aggregate(node)
        for select in self.tree.find_all(exp.Select):
            self._limit(select)
            self._distinct_on(select)
            if self.bare_columns:
                self._bare(select)

    def _aggregate(self, agg: exp.Expression) -> None:
        select = agg.find_ancestor(exp.Select)
        order = _agg_order(agg)
        if order is not None and select is not None:
            keys = [o.this for o in order.expressions]
            values = _agg_values(agg)
            key_sqls = {_sql(k) for k in keys}
            if (values and all(_sql(v) in key_sqls for v in values)) or self.total(select, keys):
                return
        if isinstance(agg, (exp.ArgMax, exp.ArgMin)):
            why = "ARG_MAX/ARG_MIN picks one of the rows tied at the extreme"
        elif isinstance(agg, exp.Mode):
            why = "MODE picks one of the values tied as most frequent"
        elif isinstance(agg, (exp.AnyValue, exp.First, exp.Last)) or (
                isinstance(agg, exp.Anonymous) and str(agg.this).upper() in ("ARBITRARY", "ANY_VALUE", "FIRST", "LAST")):
            why = "an aggregate that returns any one row's value"
        else:
            why = "an order-sensitive aggregate without an ORDER BY that fixes the order"
        self._choice(agg, why)

    def _window(self, win: exp.Window) -> None:
        fn = win.this
        if isinstance(fn, exp.IgnoreNulls | exp.RespectNulls):
            fn = fn.this
        spec = win.args.get("spec")
        rows_frame = spec is not None and str(spec.args.get("kind") or "").upper() in ("ROWS", "GROUPS")
        sensitive = isinstance(fn, (_ORDER_SENSITIVE_WINDOWS, _ORDER_SENSITIVE_AGGS)) or (
            isinstance(fn, exp.Anonymous) and str(fn.this).upper() in _ORDER_SENSITIVE_NAMES)
        if not (sensitive or rows_frame):
            return
        select = win.find_ancestor(exp.Select)
        keys = list(win.args.get("partition_by") or [])
        order = win.args.get("order")
        if order is not None:
            keys += [o.this for o in order.expressions]
        if select is not None and order is not None and self.total(select, keys):
            return
        self._choice(win, "a window function over rows in no total order")

    def _limit(self, select: exp.Select) -> None:
        if select is self.tree:
            return  # the top-level cut is modelled exactly (tie groups)
        cut = select.args.get("limit") or select.args.get("offset")
        if cut is None:
            return
        n = _int_arg(select.args.get("limit"))
        if n == 0:
            return
        order = select.args.get("order")
        keys = [o.this for o in order.expressions] if order is not None else []
        if keys and (self.covers_outputs(select, keys) or self.total(select, keys)):
            return
        why = "a LIMIT/OFFSET in a subquery without a total ORDER BY"
        text = select.sql(dialect=self.dialect)[:70]
        self.choices.append(f"{why}: {text}")
        if self._correlated(select):
            self.opaque.append(f"{why}, correlated with the outer query ({text})")
        else:
            self.cuts.append(select)  # decided per database: do its ties reach the cut?

    def _correlated(self, select: exp.Select) -> bool:
        """``select`` may read a column of an enclosing query (then it cannot run alone)."""
        inner = {t.alias_or_name.lower() for t in select.find_all(exp.Table)} \
            | {t.name.lower() for t in select.find_all(exp.Table)} \
            | {q.alias.lower() for q in select.find_all(exp.Subquery) if q.alias}
        tables = [self._table(t.name) for t in select.find_all(exp.Table)]
        aliases = {e.alias.lower() for sel in select.find_all(exp.Select) for e in sel.expressions
                   if isinstance(e, exp.Alias)}
        for c in select.find_all(exp.Column):
            if isinstance(c.this, exp.Star):
                continue
            if c.table:
                if c.table.lower() not in inner:
                    return True
            elif c.name.lower() not in aliases and not any(t is not None and _has_column(t, c.name) for t in tables):
                return True
        return False

    def _distinct_on(self, select: exp.Select) -> None:
        d = select.args.get("distinct")
        on = d.args.get("on") if d is not None else None
        if on is None:
            return
        order = select.args.get("order")
        keys = [o.this for o in order.expressions] if order is not None else []
        if keys and (self.covers_outputs(select, keys) or self.total(select, keys)):
            return
        on_sqls = {_sql(e) for e in (on.expressions if isinstance(on, exp.Tuple) else [on])}
        if select is self.tree:
            for i, e in enumerate(select.expressions):
                if _sql(e.unalias()) not in on_sqls:
                    self._choice(e, "DISTINCT ON keeps any one row of each group")
        else:
            self.opaque.append(f"DISTINCT ON in a subquery without a total ORDER BY ({select.sql()[:60]})")

    def _bare(self, select: exp.Select) -> None:
        """MySQL/SQLite bare columns: neither grouped, nor aggregated, nor functionally
        determined by the groups (a grouped primary key, directly or through join / WHERE
        equalities, determines its table's columns)."""
        if not self._is_aggregate_select(select):
            return
        group_exprs = self._group_exprs(select)
        group = {_sql(g) for g in group_exprs}
        sources = self._sources(select)
        aliases = {e.alias.lower() for e in select.expressions if isinstance(e, exp.Alias)}

        def resolve(c: exp.Column) -> tuple[str, str] | None:
            if sources is None:
                return None
            q = c.table.lower()
            owners = [a for a, t in sources if (a == q if q else _has_column(t, c.name))]
            return (owners[0], c.name.lower()) if len(owners) == 1 else None

        parent: dict = {}

        def find(k):
            parent.setdefault(k, k)
            while parent[k] != k:
                parent[k] = parent[parent[k]]
                k = parent[k]
            return k

        conditions = [select.args.get("where")] + [j.args.get("on") for j in select.args.get("joins") or []]
        for cond in conditions:
            node = cond.this if isinstance(cond, exp.Where) else cond
            stack = [node] if node is not None else []
            while stack:  # the conjuncts col = col
                n = stack.pop()
                if isinstance(n, (exp.And, exp.Paren)):
                    stack.extend(x for x in (n.this, n.args.get("expression")) if x is not None)
                elif isinstance(n, exp.EQ) and isinstance(n.this, exp.Column) and isinstance(n.expression, exp.Column):
                    a, b = resolve(n.this), resolve(n.expression)
                    if a and b:
                        parent[find(a)] = find(b)
        grouped = {find(k) for g in group_exprs if isinstance(g, exp.Column) and (k := resolve(g))}
        determined = set()
        for alias, table in sources or []:
            for key in table.keys:
                if key and (key == table.primary_key or all(table.column(c).not_null for c in key)) \
                        and all(find((alias, c.lower())) in grouped for c in key):
                    determined.add(alias)
        local_aliases = {a for a, _ in sources} if sources else set()
        places = [(e, True) for e in select.expressions]
        for key in ("having", "order"):
            if select.args.get(key) is not None:
                places.append((select.args[key], False))
        for place, is_item in places:
            if is_item and _sql(place.unalias()) in group:
                continue
            for c in _local(place, exp.Column, select):
                if isinstance(c.this, exp.Star):
                    continue
                if c.find_ancestor(exp.AggFunc, exp.Window, exp.Select) is not select:
                    continue  # inside an aggregate or a window function of this SELECT
                if _sql(c) in group:
                    continue
                if not is_item and not c.table and c.name.lower() in aliases:
                    continue
                if sources is not None and c.table and c.table.lower() not in local_aliases:
                    continue  # an outer query's column: one value here
                if sources is not None and not c.table and not any(_has_column(t, c.name) for _, t in sources):
                    continue  # an outer query's column
                k = resolve(c)
                if k is not None and (find(k) in grouped or k[0] in determined):
                    continue  # grouped, or determined by a grouped key
                self._choice(c, "a bare column (neither grouped nor aggregated: any row of the group)")
                break


def _window_function(node: exp.Expression) -> bool:
    """``node`` is the function of a window (``ROW_NUMBER() OVER ...``, ``FIRST_VALUE(x)
    IGNORE NULLS OVER ...``): the window rule decides."""
    parent = node.parent
    while isinstance(parent, (exp.IgnoreNulls, exp.RespectNulls)):
        parent = parent.parent
    return isinstance(parent, exp.Window)


def _has_column(table: Any, name: str) -> bool:
    try:
        table.index(name)
        return True
    except KeyError:
        return False


def _int_arg(node: exp.Expression | None) -> int | None:
    if node is None:
        return None
    for key in ("expression", "count", "this"):
        value = node.args.get(key)
        if isinstance(value, exp.Literal) and not value.is_string:
            try:
                return int(value.this)
            except ValueError:
                return None
    return None
