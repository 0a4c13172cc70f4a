"""What a query's SQL leaves to the engine: :func:`plan_query` reads a parsed query into a
:class:`QueryPlan` — its top-level sort keys, LIMIT/OFFSET/FETCH cut, the *wildcard* columns
(order-sensitive aggregates, peer-order window functions, DISTINCT ON, bare columns,
``random()``) and the choices made elsewhere — from which
:func:`tasks.equivalence.outcomes.build_space` builds the allowed results. Reading the SQL
for those choices is :mod:`tasks.equivalence.choice_analysis`.

Split out of :mod:`tasks.equivalence.outcomes`; the code moved verbatim."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlglot import exp

from tasks.equivalence.choice_analysis import _Analyzer, _int_arg, _sql


@dataclass
class QueryPlan:
    """How to find what one query may return (see the module docstring).

    - ``probe``: the query in the engine's SQL with its top-level LIMIT/OFFSET removed and its
      sort keys appended (``extra_keys`` columns at the end); None when the query has neither
      ORDER BY nor LIMIT/OFFSET at the top;
    - ``keys``: per ORDER BY item, ``("out", i)`` (output column ``i``) or ``("extra", k)``;
      ``order``: the query has a top-level ORDER BY; ``order_known``: its keys are computed;
    - ``limit`` / ``offset`` / ``with_ties``: the top-level cut (None: no LIMIT);
    - ``wildcards``: output columns whose values are an engine's choice; ``opaque``: why the
      whole result may vary in a way not modelled (then nothing can be certified);
    - ``choices``: one line per arbitrary choice the SQL leaves (for notes and verdicts);
    - ``cuts``: the plans of uncorrelated subqueries with a LIMIT over no total order: on a
      given database the query is deterministic when none of their tie groups reaches the cut
      with different rows (:func:`tasks.equivalence.outcomes.resolve_cuts`), else opaque there.
    """

    probe: str | None = None
    extra_keys: int = 0
    keys: list[tuple[str, int]] = field(default_factory=list)
    order: bool = False
    order_known: bool = True
    limit: int | None = None
    offset: int = 0
    with_ties: bool = False
    wildcards: frozenset[int] = frozenset()
    opaque: list[str] = field(default_factory=list)
    choices: list[str] = field(default_factory=list)
    cuts: list[QueryPlan] = field(default_factory=list)

    @property
    def cut(self) -> bool:
        """The query has a top-level LIMIT or OFFSET."""
        return self.limit is not None or self.offset > 0

    def needs_probe(self, ordered: bool) -> bool:
        """A probe is needed to know the allowed results (comparing in order or not)."""
        return self.probe is not None and (self.cut or (ordered and self.order))


def _top_keys(top: exp.Query, an: _Analyzer) -> tuple[list[tuple[str, int]], list[exp.Expression], bool, str]:
    """Resolve the top-level ORDER BY: ``(keys, extra expressions, known, why unknown)``."""
    order = top.args.get("order")
    if order is None:
        return [], [], False, ""
    keys: list[tuple[str, int]] = []
    extra: list[exp.Expression] = []
    if isinstance(top, exp.Select):
        items = top.expressions
        star = any(isinstance(e, exp.Star) or (isinstance(e, exp.Column) and isinstance(e.this, exp.Star))
                   for e in items)
        names = {} if star else {e.alias_or_name.lower(): i for i, e in enumerate(items) if e.alias_or_name}
        exprs = {} if star else {_sql(e.unalias()): i for i, e in enumerate(items)}
        wild = {_sql(e.unalias()) for e in an.wildcard_exprs}
        for o in order.expressions:
            e = o.this
            if isinstance(e, exp.Literal) and not e.is_string and e.this.isdigit():
                n = int(e.this)
                if star or not 1 <= n <= len(items):
                    return [], [], False, "an ORDER BY position after *"
                keys.append(("out", n - 1))
                continue
            if isinstance(e, exp.Column) and not e.table and e.name.lower() in names:
                keys.append(("out", names[e.name.lower()]))
                continue
            if _sql(e) in exprs:
                keys.append(("out", exprs[_sql(e)]))
                continue
            if top.args.get("distinct") is not None:
                return [], [], False, "an ORDER BY expression under SELECT DISTINCT"
            if any(_sql(n) in wild for n in e.walk() if isinstance(n, exp.Expression)):
                return [], [], False, "an ORDER BY key that is itself an arbitrary choice"
            e2 = e.copy()
            aliased = {a.alias.lower(): a.this for a in items if isinstance(a, exp.Alias)}
            for c in list(e2.find_all(exp.Column)):
                if not c.table and c.name.lower() in aliased:
                    c.replace(aliased[c.name.lower()].copy())
            keys.append(("extra", len(extra)))
            extra.append(e2)
        for kind, i in keys:
            if kind == "out" and i in an.wildcard_items:
                return [], [], False, "an ORDER BY key that is itself an arbitrary choice"
        return keys, extra, True, ""
    # a set operation: keys name output columns
    first = top
    while isinstance(first, exp.SetOperation):
        first = first.this
    items = first.expressions if isinstance(first, exp.Select) else []
    names = {e.alias_or_name.lower(): i for i, e in enumerate(items) if e.alias_or_name}
    for o in order.expressions:
        e = o.this
        if isinstance(e, exp.Literal) and not e.is_string and e.this.isdigit() and 1 <= int(e.this) <= len(items):
            keys.append(("out", int(e.this) - 1))
        elif isinstance(e, exp.Column) and e.name.lower() in names:
            keys.append(("out", names[e.name.lower()]))
        else:
            return [], [], False, "an ORDER BY of a set operation that names no output column"
    return keys, extra, True, ""


def plan_query(tree: exp.Expression, schema: Any, *, engine: str, bare_columns: bool,
               to_sql, dialect: str = "") -> QueryPlan:
    """The :class:`QueryPlan` of one normalised query tree. ``to_sql(tree)`` writes a tree
    in the engine's SQL (the probe); ``bare_columns``: the dialect or engine accepts bare
    columns (MySQL, SQLite)."""
    an = _Analyzer(tree, schema, bare_columns, dialect)
    an.run()
    plan = QueryPlan(wildcards=frozenset(an.wildcard_items), opaque=list(an.opaque),
                     choices=list(dict.fromkeys(an.choices)))
    for select in an.cuts:
        sub = select.copy()
        if tree.args.get("with") is not None and sub.args.get("with") is None:
            sub.set("with", tree.args["with"].copy())  # the CTEs it may read
        plan.cuts.append(plan_query(sub, schema, engine=engine, bare_columns=bare_columns,
                                    to_sql=to_sql, dialect=dialect))
    if not isinstance(tree, exp.Query):
        return plan
    limit_node = tree.args.get("limit")
    offset_node = tree.args.get("offset")
    plan.order = tree.args.get("order") is not None
    if limit_node is not None:
        plan.limit = _int_arg(limit_node)
        if plan.limit is None:
            plan.opaque.append(f"a LIMIT that is not a constant ({limit_node.sql()[:40]})")
        opts = limit_node.args.get("limit_options")
        plan.with_ties = bool(opts is not None and opts.args.get("with_ties"))
        if opts is not None and opts.args.get("percent"):
            plan.opaque.append("FETCH ... PERCENT")
    if offset_node is not None:
        off = _int_arg(offset_node)
        if off is None:
            plan.opaque.append(f"an OFFSET that is not a constant ({offset_node.sql()[:40]})")
        plan.offset = off or 0
    if not plan.order and not plan.cut:
        return plan
    keys, extra, known, why = _top_keys(tree, an)
    plan.keys, plan.extra_keys = keys, len(extra)
    plan.order_known = known if plan.order else False
    if plan.order and not known:
        plan.choices.append(f"the order of the rows is not computable ({why}): every row ties")
    probe = tree.copy()
    probe.set("limit", None)
    probe.set("offset", None)
    if extra and isinstance(probe, exp.Select):
        probe.set("expressions", list(probe.expressions)
                  + [exp.alias_(e, f"__ql_key{i}", quoted=True) for i, e in enumerate(extra)])
    plan.probe = to_sql(probe)
    total = False
    if plan.order and known and isinstance(tree, exp.Select):
        order_keys = [o.this for o in tree.args["order"].expressions]
        total = an.total(tree, order_keys) or an.covers_outputs(tree, order_keys)
    if total:
        return plan
    if plan.cut and plan.order and known:
        plan.choices.append("LIMIT/OFFSET over tied rows keeps any of them")
    elif plan.cut:
        plan.choices.append("LIMIT/OFFSET without a known order keeps any rows")
    if plan.order and known:
        plan.choices.append("rows tied under the ORDER BY come in any order")
    return plan
