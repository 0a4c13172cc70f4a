"""Reasoning graphs for Progressive-Text2SQL, built from gold SQL with sqlglot, and their
level-k perturbations.

Building a graph (:func:`build_reasoning_graph`)
-------------------------------------------------
The gold query is parsed (Spider SQL is read as MySQL) and decomposed, innermost first, into
nodes — each a sub-task with a local description, a standalone SQLite query (its SQL fragment)
and the nodes it depends on:

- each **CTE** is a node (``WITH`` the CTEs it needs, ``SELECT *`` from it);
- each **subquery** (derived table, ``IN``/``EXISTS``/scalar/comparison subquery) is
  decomposed into its own nodes; the node that uses it depends on its last node;
- each **set operation** (UNION/INTERSECT/EXCEPT) is a node depending on its two branches;
- each SELECT block contributes up to four progressive steps, each a query over the previous
  one's rows: **join** (``SELECT *`` over the FROM items and joins, when there is a join),
  **filter** (adds the WHERE clause), **aggregate** (the select list with GROUP BY/HAVING, and
  aggregates used in ORDER BY, when the block aggregates) and the **final** block (DISTINCT,
  ORDER BY, LIMIT); a step identical to the one before is not repeated.

The last node is the full query. Descriptions are rendered from the AST with the SQL of
conditions and select lists, a subquery shown as ``[nK]``. A graph is kept only when every
node's SQL executes on the database (:func:`check_graph`); a correlated subquery, for instance,
cannot run alone, and its graph is dropped and counted.

Perturbations (:func:`perturb_graph`)
-------------------------------------
A level-k perturbation applies ``k`` operations to the SQL fragments of non-final nodes (the
fragments a model is shown), each of one of four kinds: ``syntax`` (a keyword misspelt,
``GROUP BY`` without ``BY``, a parenthesis dropped, a stray comma), ``schema`` (a table or
column name replaced by one the database does not have, e.g. ``age`` → ``age_value``),
``logic`` (contradictory logic: a comparison flipped, ``LIKE``/``IN`` negated, MAX↔MIN or
AVG↔SUM swapped; with nothing left to flip, the fragment's rows are emptied) and ``remove``
(the node is taken out of the graph; its dependents inherit its dependencies; the last remaining
non-final node is never removed). A node may take several operations; they compose and never
undo each other. The RNG is seeded with ``"<seed>:perturb:<graph key>:<k>"``, so a level is
reproducible from the seed, and every operation is recorded with its target.
"""

from __future__ import annotations

import random
import re
import sqlite3
from pathlib import Path

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError

from tasks.text2sql.spider import run_sqlite

__all__ = [
    "PERTURBATION_KINDS",
    "GraphError",
    "PerturbationError",
    "build_reasoning_graph",
    "check_graph",
    "perturb_graph",
    "render_perturbed",
]

PERTURBATION_KINDS = ("syntax", "schema", "logic", "remove")

_FROM = "from_" if "from_" in exp.Select.arg_types else "from"
_WITH = "with_" if "with_" in exp.Select.arg_types else "with"
_QUERY_TYPES = (exp.Select, exp.SetOperation)


class GraphError(ValueError):
    """A query cannot be decomposed into a reasoning graph (unsupported construct)."""


def _sql(e: exp.Expression) -> str:
    return e.sql(dialect="sqlite")


def _parent_query(node: exp.Expression) -> exp.Expression | None:
    p = node.parent
    while p is not None and not isinstance(p, _QUERY_TYPES):
        p = p.parent
    return p


def _region(node: exp.Expression, owner: exp.Expression) -> str:
    """The arg of ``owner`` under which ``node`` sits (``where``, ``from_``, ``expressions``...)."""
    child = node
    while child.parent is not None and child.parent is not owner:
        child = child.parent
    return child.arg_key or ""


def _unwrap(q: exp.Expression) -> exp.Expression:
    while isinstance(q, (exp.Subquery, exp.Paren)):
        q = q.this
    return q


def _placeholder_sql(e: exp.Expression) -> str:
    """SQL of ``e`` with every decomposed subquery shown as ``[nK]``."""
    e2 = e.copy()
    inner = _unwrap(e2)
    if inner is not e2 and inner.meta.get("graph_node"):
        alias = e2.alias if isinstance(e2, exp.Subquery) else ""
        return f"[{inner.meta['graph_node']}]" + (f" AS {alias}" if alias else "")
    for sub in list(e2.find_all(*_QUERY_TYPES)):
        nid = sub.meta.get("graph_node")
        if not nid or sub is e2:
            continue
        target = sub.parent if isinstance(sub.parent, exp.Subquery) else sub
        if target is not e2:
            target.replace(exp.Var(this=f"[{nid}]"))
    return _sql(e2)


def _own_aggregates(s: exp.Select, where: list[exp.Expression]) -> list[exp.AggFunc]:
    out = []
    for e in where:
        for agg in e.find_all(exp.AggFunc):
            if _parent_query(agg) is s and not isinstance(agg.parent, exp.Window):
                out.append(agg)
    return out


class _Builder:
    def __init__(self) -> None:
        self.nodes: list[dict] = []

    def add(self, kind: str, description: str, expr: exp.Expression, deps: list[str]) -> str:
        sql = _sql(expr)
        for n in self.nodes:  # the same fragment twice (e.g. a repeated subquery) is one node
            if n["sql"] == sql:
                return n["id"]
        nid = f"n{len(self.nodes) + 1}"
        seen: list[str] = []
        for d in deps:
            if d and d not in seen and d != nid:
                seen.append(d)
        self.nodes.append(
            {"id": nid, "kind": kind, "description": description, "sql": sql, "depends_on": seen}
        )
        return nid

    def query(self, q: exp.Expression) -> str:
        q = _unwrap(q)
        if isinstance(q, exp.SetOperation):
            left = self.query(q.left)
            right = self.query(q.right)
            op = type(q).__name__.upper()
            if isinstance(q, exp.Union) and not q.args.get("distinct"):
                op = "UNION ALL"
            desc = f"Combine the results of [{left}] and [{right}] with {op}"
            if q.args.get("order") is not None:
                desc += f", ordered by {_sql(q.args['order']).removeprefix('ORDER BY ')}"
            if q.args.get("limit") is not None:
                desc += f", keeping the first {_sql(q.args['limit'].expression)} rows"
            return self.add("set_operation", desc, q, [left, right])
        if isinstance(q, exp.Select):
            return self.select(q)
        raise GraphError(f"unsupported query construct {type(q).__name__}")

    def select(self, s: exp.Select) -> str:
        cte_deps: list[str] = []
        with_ = s.args.get(_WITH)
        if with_ is not None:
            for i, cte in enumerate(with_.expressions):
                prefix = with_.copy()
                prefix.set("expressions", [c.copy() for c in with_.expressions[: i + 1]])
                body = exp.select("*").from_(cte.alias_or_name)
                body.set(_WITH, prefix)
                cte_deps.append(
                    self.add(
                        "cte",
                        f"Compute the intermediate result {cte.alias_or_name}",
                        body,
                        cte_deps[-1:],
                    )
                )
        subs: dict[str, list[str]] = {}
        for node in list(s.walk()):
            if node is s or not isinstance(node, _QUERY_TYPES) or _parent_query(node) is not s:
                continue
            region = _region(node, s)
            if region == _WITH:
                continue
            nid = self.query(node)
            node.meta["graph_node"] = nid
            subs.setdefault(region, []).append(nid)

        def deps(*regions: str) -> list[str]:
            return [d for r in regions for d in subs.get(r, [])]

        from_ = s.args.get(_FROM)
        joins = s.args.get("joins") or []
        where = s.args.get("where")
        group = s.args.get("group")
        having = s.args.get("having")
        order = s.args.get("order")
        aggs = _own_aggregates(s, list(s.expressions) + ([having] if having else []))
        order_aggs = _own_aggregates(s, [order]) if order is not None else []
        prev: str | None = None
        base = None
        if from_ is not None:
            base = exp.Select(expressions=[exp.Star()])
            base.set(_FROM, from_.copy())
            if joins:
                base.set("joins", [j.copy() for j in joins])
            if with_ is not None:
                base.set(_WITH, with_.copy())
        if joins and base is not None:
            items = [from_.this] + [j.this for j in joins]
            names = []
            for it in items:
                if isinstance(it, exp.Table):
                    alias = it.alias
                    names.append(f"{it.name} ({alias})" if alias and alias != it.name else it.name)
                else:
                    names.append(_placeholder_sql(it))
            conds = [_placeholder_sql(j.args["on"]) for j in joins if j.args.get("on") is not None]
            desc = "Join " + ", ".join(names) + (" on " + " and ".join(conds) if conds else "")
            prev = self.add("join", desc, base, cte_deps[-1:] + deps(_FROM, "joins"))
        if where is not None and base is not None:
            f = base.copy()
            f.set("where", where.copy())
            step_deps = [prev] if prev else cte_deps[-1:] + deps(_FROM, "joins")
            prev = self.add(
                "filter",
                f"Keep the rows where {_placeholder_sql(where.this)}",
                f,
                step_deps + deps("where"),
            )
        if group is not None or having is not None or aggs or order_aggs:
            a = s.copy()
            for arg in ("order", "limit", "offset", "distinct"):
                a.set(arg, None)
            shown = {_sql(e) for e in a.expressions}
            for agg in order_aggs:
                if _sql(agg) not in shown:
                    a.append("expressions", agg.copy())
                    shown.add(_sql(agg))
            cols = ", ".join(_placeholder_sql(e) for e in a.expressions)
            if group is not None:
                keys = ", ".join(_placeholder_sql(e) for e in group.expressions)
                desc = f"Group the rows by {keys} and compute {cols}"
            else:
                desc = f"Compute {cols} over the rows"
            if having is not None:
                desc += f", keeping the groups where {_placeholder_sql(having.this)}"
            step_deps = [prev] if prev else cte_deps[-1:] + deps(_FROM, "joins")
            prev = self.add(
                "aggregate", desc, a, step_deps + deps("expressions", "group", "having")
            )
        full_sql = _sql(s)
        if prev is not None and self._node(prev)["sql"] == full_sql:
            return prev
        desc = "Return " + ", ".join(_placeholder_sql(e) for e in s.expressions)
        if s.args.get("distinct") is not None:
            desc += " without duplicate rows"
        if order is not None:
            desc += f", ordered by {_placeholder_sql(order).removeprefix('ORDER BY ')}"
        if s.args.get("limit") is not None:
            desc += f", keeping the first {_sql(s.args['limit'].expression)} rows"
        if prev is not None:
            step_deps = [prev] + deps("expressions", "order")
        else:
            step_deps = cte_deps[-1:] + [d for ds in subs.values() for d in ds]
        return self.add("final", desc, s, step_deps)

    def _node(self, nid: str) -> dict:
        return next(n for n in self.nodes if n["id"] == nid)


def build_reasoning_graph(sql: str, read: str = "mysql") -> list[dict]:
    """The reasoning graph of ``sql`` (see module docstring): nodes in topological order, each
    ``{"id": "n1", "kind", "description", "sql" (SQLite), "depends_on": [ids]}``; the last
    node is the full query (kind ``final``, or the step that already equals it). Raises
    :class:`GraphError` when the SQL does not parse or uses an unsupported construct."""
    try:
        tree = sqlglot.parse_one(sql, read=read)
    except (ParseError, TokenError) as e:
        raise GraphError(f"cannot parse: {str(e).splitlines()[0][:200]}") from None
    b = _Builder()
    last = b.query(tree)
    nodes = b.nodes
    # the final node last (a set operation or a merged step already is)
    idx = next(i for i, n in enumerate(nodes) if n["id"] == last)
    if idx != len(nodes) - 1:
        raise GraphError("the full query is not the last node")
    return nodes


def check_graph(
    nodes: list[dict], db_path: str | Path, timeout_ms: int = 10_000, max_rows: int = 100_000
) -> str | None:
    """None when every node's SQL executes on ``db_path`` (read-only) and returns at most
    ``max_rows`` rows, else the reason the graph must be dropped (``"n2: no such column:
    T1.x"``)."""
    for n in nodes:
        try:
            rows = run_sqlite(db_path, n["sql"], timeout_ms)
        except (sqlite3.Error, sqlite3.Warning, ValueError) as e:
            return f"{n['id']}: {e}"
        if len(rows) > max_rows:
            return f"{n['id']}: {len(rows)} rows (more than {max_rows})"
    return None


# --------------------------------------------------------------------------------------------
# Perturbations
# --------------------------------------------------------------------------------------------

_QUOTED = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|`[^`]*`")


def _unquoted_matches(sql: str, pattern: re.Pattern) -> list[re.Match]:
    """Matches of ``pattern`` outside quoted strings/identifiers, in text order."""
    spans = [m.span() for m in _QUOTED.finditer(sql)]
    return [m for m in pattern.finditer(sql) if not any(a <= m.start() < b for a, b in spans)]


#: Syntax corruptions, each applied at most once per node (at its first match).
_SYNTAX_EDITS = {
    "misspelt_select": (re.compile(r"\bSELECT\b", re.IGNORECASE), "SELEC"),
    "misspelt_from": (re.compile(r"\bFROM\b", re.IGNORECASE), "FORM"),
    "misspelt_where": (re.compile(r"\bWHERE\b", re.IGNORECASE), "WHER"),
    "group_without_by": (re.compile(r"\bGROUP BY\b", re.IGNORECASE), "GROUP"),
    "dropped_parenthesis": (re.compile(r"\)"), ""),
    "stray_comma": (re.compile(r"\bSELECT\b", re.IGNORECASE), "SELECT ,"),
}
#: Contradictions: comparison flips, LIKE/IN/BETWEEN negation, aggregate swaps.
_FLIPS = (
    re.compile(r">=|<=|<>|!=|(?<![<>!=])=(?!=)|(?<![<>-])>(?!=)|<(?![=>])"),
    re.compile(r"\bNOT\s+LIKE\b|\bLIKE\b", re.IGNORECASE),
    re.compile(r"\bNOT\s+IN\s*\(|\bIN\s*\(", re.IGNORECASE),
    re.compile(r"\bNOT\s+BETWEEN\b|\bBETWEEN\b", re.IGNORECASE),
    re.compile(r"\b(?:MAX|MIN|AVG|SUM)\(", re.IGNORECASE),
)
_OPPOSITE = {
    ">=": "<",
    "<=": ">",
    "<>": "=",
    "!=": "=",
    "=": "<>",
    ">": "<=",
    "<": ">=",
    "MAX(": "MIN(",
    "MIN(": "MAX(",
    "AVG(": "SUM(",
    "SUM(": "AVG(",
}


def _logic_targets(sql: str) -> list[re.Match]:
    """Every place a contradiction can be injected, in text order (their ordinals are stable
    under flips, which replace one operator by another)."""
    found = [m for rx in _FLIPS for m in _unquoted_matches(sql, rx)]
    return sorted(found, key=lambda m: m.start())


def _flip(token: str) -> str:
    t = token.upper()
    if t in _OPPOSITE:
        return _OPPOSITE[t]
    if t.startswith("NOT"):
        return re.sub(r"^NOT\s+", "", token, flags=re.IGNORECASE)
    return "NOT " + token


def _names_in(sql: str, names: list[str]) -> list[str]:
    out = []
    for name in sorted(set(names), key=str.lower):
        if _unquoted_matches(sql, _name_rx(name)):
            out.append(name)
    return out


def _name_rx(name: str) -> re.Pattern:
    return re.compile(rf"(?<![\w\"`'])({re.escape(name)})(?![\w\"`'])", re.IGNORECASE)


def _misaligned_name(name: str, known: set[str]) -> str:
    for suffix in ("_value", "_info", "_code", "_data", "_x"):
        if (name + suffix).lower() not in known:
            return name + suffix
    return name + "_unknown"


def render_perturbed(sql: str, state: dict, names: list[str]) -> str:
    """The fragment ``sql`` under a node's perturbation ``state`` (``{"logic": [ordinals],
    "wrapped": bool, "schema": [names], "syntax": [edit names]}``): contradictions first (on
    the gold text), then schema misalignments, then syntax corruptions. Applying every
    operation to the gold text (not to earlier output) makes operations compose without ever
    undoing each other."""
    out = sql
    targets = _logic_targets(out)
    for ordinal in sorted(state.get("logic", []), reverse=True):
        m = targets[ordinal]
        out = out[: m.start()] + _flip(m.group(0)) + out[m.end() :]
    if state.get("wrapped"):
        out = f"SELECT * FROM ({out}) WHERE 1 = 0"
    known = {n.lower() for n in names}
    for name in state.get("schema", []):
        matches = _unquoted_matches(out, _name_rx(name))
        new = _misaligned_name(name, known)
        for m in reversed(matches):
            out = out[: m.start()] + new + out[m.end() :]
    for edit in state.get("syntax", []):
        rx, text = _SYNTAX_EDITS[edit]
        found = _unquoted_matches(out, rx)
        if found:
            out = out[: found[0].start()] + text + out[found[0].end() :]
    return out


def _options(gold: str, state: dict, names: list[str], kind: str) -> list:
    """What operation ``kind`` can still do to a node (nothing already done is offered)."""
    if kind == "logic":
        done = set(state.get("logic", []))
        free = [i for i in range(len(_logic_targets(gold))) if i not in done]
        return free or ([] if state.get("wrapped") else ["wrap"])
    if kind == "schema":
        done = {n.lower() for n in state.get("schema", [])}
        return [n for n in _names_in(gold, names) if n.lower() not in done]
    if kind == "syntax":
        current = render_perturbed(gold, state, names)
        done = set(state.get("syntax", []))
        return [
            e
            for e, (rx, _) in _SYNTAX_EDITS.items()
            if e not in done and _unquoted_matches(current, rx)
        ]
    raise ValueError(kind)


class PerturbationError(ValueError):
    """A graph has too few places left to apply the requested number of operations."""


def perturb_graph(
    nodes: list[dict], level: int, seed: int, key: str, schema_names: list[str]
) -> tuple[list[dict], list[dict]]:
    """Apply a level-``level`` perturbation (module docstring) to a graph.

    Each of the ``level`` operations draws (seeded) a kind, then a non-final node that can
    still take that kind, then a target within the node (a comparison not yet flipped, a name
    not yet misaligned, a syntax corruption not yet applied); operations on one node compose
    and never undo each other (:func:`render_perturbed`). ``schema_names``: the database's
    table and column names; ``key``: the graph's stable id.

    Returns ``(nodes, operations)``: the perturbed graph (removed nodes left out, dependencies
    rewired, fragments replaced) and one record per operation ``{"step", "node", "kind",
    "target", "sql"}`` (``sql``: the node's fragment after the operation; None for
    ``remove``). Level 0 returns the graph unchanged. Raises ValueError for a negative level,
    :class:`PerturbationError` when a level > 0 cannot be applied (no non-final node, or no
    place left for another operation)."""
    if level < 0:
        raise ValueError(f"perturbation level must be >= 0, got {level}")
    out = [dict(n, depends_on=list(n["depends_on"])) for n in nodes]
    if level == 0:
        return out, []
    candidates = [n["id"] for n in out[:-1]]
    if not candidates:
        raise PerturbationError("a graph with a single node cannot be perturbed")
    rng = random.Random(f"{seed}:perturb:{key}:{level}")
    by_id = {n["id"]: n for n in out}
    gold = {n["id"]: n["sql"] for n in out}
    states: dict[str, dict] = {
        c: {"logic": [], "wrapped": False, "schema": [], "syntax": []} for c in candidates
    }
    removed: set[str] = set()
    ops: list[dict] = []
    for step in range(level):
        alive = [c for c in candidates if c not in removed]
        choices = []
        for kind in PERTURBATION_KINDS:
            if kind == "remove":
                if len(alive) > 1:
                    choices.append((kind, alive))
                continue
            able = [c for c in alive if _options(gold[c], states[c], schema_names, kind)]
            if able:
                choices.append((kind, able))
        if not choices:
            raise PerturbationError(f"no place left for operation {step + 1} of level {level}")
        kind, able = rng.choice(choices)
        nid = rng.choice(able)
        if kind == "remove":
            removed.add(nid)
            ops.append({"step": step, "node": nid, "kind": kind, "target": None, "sql": None})
            continue
        target = rng.choice(_options(gold[nid], states[nid], schema_names, kind))
        st = states[nid]
        if kind == "logic":
            if target == "wrap":
                st["wrapped"] = True
            else:
                st["logic"].append(target)
        else:
            st[kind].append(target)
        by_id[nid]["sql"] = render_perturbed(gold[nid], st, schema_names)
        ops.append(
            {"step": step, "node": nid, "kind": kind, "target": target, "sql": by_id[nid]["sql"]}
        )

    def resolve(d: str, seen: frozenset = frozenset()) -> list[str]:
        if d not in removed:
            return [d]
        res: list[str] = []
        for x in by_id[d]["depends_on"]:
            if x not in seen:
                res += resolve(x, seen | {d})
        return res

    kept = []
    for n in out:
        if n["id"] in removed:
            continue
        new: list[str] = []
        for d in n["depends_on"]:
            for x in resolve(d):
                if x not in new:
                    new.append(x)
        n["depends_on"] = new
        kept.append(n)
    return kept, ops
