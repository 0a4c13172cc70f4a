"""Metrics of the lifecycle suite (DBLifeBench), per item; tables average them over items.

P1 Design — over the reference tables ``t`` (a reference table without a semantically matching
designed table contributes nothing to the numerators):

- **ACC-Entity** = Σ_t |E_t ∩ Ê_t| / Σ_t |Ê_t|: Ê_t the reference attributes (columns) of
  table ``t``, E_t those of the matched designed table; attributes match by name
  (:mod:`tasks.lifecycle.naming`).
- **ACC-Data** = the same with (attribute, data type) pairs: an attribute counts when it
  matches *and* its type class (:func:`tasks.db.relschema.type_class`) is the reference's.
- **ACC-Key** = the same with key constraints: each table's primary key (one constraint, its
  column set) and each foreign key (its (column, referenced column) pairs and the referenced
  table), compared through the table and column matching. None when the reference has no key.

P2 Implementation — on the schema SQLite created from the model's DDL (0 when it fails):

- **T-Level** = matched reference tables / reference tables;
- **F-Level** = Σ_t |F_t ∩ F̂_t| / Σ_t |F̂_t| over fields: a reference field (name, type class)
  counts when the created table matched to ``t`` has a field with a matching name and the same
  type class.

P3 Operation — **EX** (execution accuracy, :func:`tasks.scoring.result_match.results_match`);
**G-EX** = mean over graphs of node-level EX (:func:`graph_execution_accuracy`); UPDATE/DELETE
by **state comparison** (:func:`table_digests`: every table's rows as a bag).
P4 Debugging — EX of the corrected SQL, single-round and multi-round.
P5 Maintenance — **Assigner accuracy** (the chosen expert set equals the right set; Jaccard
reported as well) and **Expert tool-call correctness** (Jaccard similarity of the expected and
the made diagnostic calls, with precision and recall).
Robustness across schema variants — **coefficient of variation** of EX (population standard
deviation / mean, :func:`coefficient_of_variation`).
"""

from __future__ import annotations

import hashlib
import json
import math
import sqlite3
from collections.abc import Hashable, Iterable, Mapping, Sequence

from tasks.db.relschema import Table, type_class
from tasks.lifecycle.naming import match_names
from tasks.lifecycle.schema import Schema
from tasks.scoring.result_match import normalize_value

__all__ = [
    "assigner_scores",
    "coefficient_of_variation",
    "design_scores",
    "graph_execution_accuracy",
    "implementation_scores",
    "match_schemas",
    "state_difference",
    "table_digests",
    "tool_call_scores",
]


def match_schemas(reference: Schema, predicted: Schema) -> tuple[dict[int, int], dict]:
    """Semantic matching of two schemas: ``(table_map, column_maps)`` where ``table_map`` is
    ``{reference table index: predicted table index}`` and ``column_maps[i]`` is
    ``{reference column index: predicted column index}`` for each matched reference table."""
    table_map = match_names(
        [t.name for t in reference.tables], [t.name for t in predicted.tables], kind="table"
    )
    column_maps = {}
    for i, j in table_map.items():
        rt, pt = reference.tables[i], predicted.tables[j]
        column_maps[i] = match_names(
            [c.name for c in rt.columns],
            [c.name for c in pt.columns],
            kind="column",
            reference_table=rt.name,
            predicted_table=pt.name,
        )
    return table_map, column_maps


def _to_ref_names(rt: Table, pt: Table, cmap: Mapping[int, int], names: Iterable[str]):
    """Predicted column names of ``pt`` → reference column names of ``rt`` (None when one
    has no match)."""
    inverse = {j: i for i, j in cmap.items()}
    pidx = {c.name.lower(): j for j, c in enumerate(pt.columns)}
    out = []
    for n in names:
        j = pidx.get(str(n).lower())
        if j is None or j not in inverse:
            return None
        out.append(rt.columns[inverse[j]].name.lower())
    return out


def _key_constraints(schema: Schema, t: Table) -> list[tuple]:
    keys: list[tuple] = []
    if t.primary_key:
        keys.append(("pk", frozenset(c.lower() for c in t.primary_key)))
    for fk in t.foreign_keys:
        refs = schema.resolved_ref_columns(fk)
        pairs = frozenset(
            zip(
                (c.lower() for c in fk.columns), (c.lower() for c in refs or [""] * len(fk.columns))
            )
        )
        keys.append(("fk", fk.ref_table.lower(), pairs))
    return keys


def design_scores(reference: Schema, predicted: Schema) -> dict:
    """ACC-Entity, ACC-Data and ACC-Key of one design (definitions in the module docstring).

    Returns ``{"acc_entity", "acc_data", "acc_key" (None without reference keys),
    "n_attributes", "matched_attributes", "matched_types", "n_keys", "matched_keys",
    "matched_tables": {reference name: predicted name}}``."""
    table_map, column_maps = match_schemas(reference, predicted)
    pred_index = {t.name.lower(): j for j, t in enumerate(predicted.tables)}
    n_attr = sum(len(t.columns) for t in reference.tables)
    matched_attr = matched_type = 0
    n_keys = matched_keys = 0
    inverse_tables = {b: a for a, b in table_map.items()}
    for i, rt in enumerate(reference.tables):
        ref_keys = _key_constraints(reference, rt)
        n_keys += len(ref_keys)
        if i not in table_map:
            continue
        pt = predicted.tables[table_map[i]]
        cmap = column_maps[i]
        matched_attr += len(cmap)
        matched_type += sum(
            type_class(rt.columns[a].type) == type_class(pt.columns[b].type)
            for a, b in cmap.items()
        )
        # the predicted table's keys, translated into reference names
        translated: set[tuple] = set()
        if pt.primary_key:
            names = _to_ref_names(rt, pt, cmap, pt.primary_key)
            if names is not None:
                translated.add(("pk", frozenset(names)))
        for fk in pt.foreign_keys:
            cols = _to_ref_names(rt, pt, cmap, fk.columns)
            pj = pred_index.get(fk.ref_table.lower())
            if cols is None or pj is None or pj not in inverse_tables:
                continue
            ri = inverse_tables[pj]
            ref_t, pred_t = reference.tables[ri], predicted.tables[pj]
            refs = _to_ref_names(ref_t, pred_t, column_maps[ri], predicted.resolved_ref_columns(fk))
            if refs is None or len(refs) != len(cols):
                continue
            translated.add(("fk", ref_t.name.lower(), frozenset(zip(cols, refs))))
        matched_keys += sum(k in translated for k in ref_keys)
    return {
        "acc_entity": matched_attr / n_attr if n_attr else None,
        "acc_data": matched_type / n_attr if n_attr else None,
        "acc_key": matched_keys / n_keys if n_keys else None,
        "n_attributes": n_attr,
        "matched_attributes": matched_attr,
        "matched_types": matched_type,
        "n_keys": n_keys,
        "matched_keys": matched_keys,
        "matched_tables": {
            reference.tables[i].name: predicted.tables[j].name for i, j in table_map.items()
        },
    }


def implementation_scores(reference: Schema, created: Schema | None) -> dict:
    """T-Level and F-Level of the schema SQLite ``created`` from a model's DDL (None: the DDL
    did not execute → both 0). Returns ``{"t_level", "f_level", "n_tables",
    "matched_tables", "n_fields", "matched_fields"}``."""
    n_tables = len(reference.tables)
    n_fields = sum(len(t.columns) for t in reference.tables)
    if created is None:
        return {
            "t_level": 0.0,
            "f_level": 0.0,
            "n_tables": n_tables,
            "matched_tables": 0,
            "n_fields": n_fields,
            "matched_fields": 0,
        }
    table_map, column_maps = match_schemas(reference, created)
    matched_fields = 0
    for i, j in table_map.items():
        rt, ct = reference.tables[i], created.tables[j]
        matched_fields += sum(
            type_class(rt.columns[a].type) == type_class(ct.columns[b].type)
            for a, b in column_maps[i].items()
        )
    return {
        "t_level": len(table_map) / n_tables if n_tables else 0.0,
        "f_level": matched_fields / n_fields if n_fields else 0.0,
        "n_tables": n_tables,
        "matched_tables": len(table_map),
        "n_fields": n_fields,
        "matched_fields": matched_fields,
    }


def graph_execution_accuracy(node_ex: Sequence[Sequence[bool]]) -> float | None:
    """G-EX: the mean over graphs of the share of each graph's nodes whose SQL is execution-
    correct. ``node_ex``: one list of node results per graph (graphs without nodes are left
    out). None when there is no graph."""
    per_graph = [sum(map(bool, g)) / len(g) for g in node_ex if len(g)]
    return sum(per_graph) / len(per_graph) if per_graph else None


def table_digests(conn: sqlite3.Connection) -> dict[str, str]:
    """``{table: SHA-256 of its rows as a bag}`` for every non-``sqlite_*`` table of ``conn``:
    rows normalised with :func:`tasks.scoring.result_match.normalize_value` (1 = 1.0), sorted, then
    hashed together with the column names — equal digests mean equal table contents whatever
    the row order."""
    out = {}
    tables = [
        r[0]
        for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
        )
    ]
    for t in sorted(tables):
        q = t.replace('"', '""')
        cur = conn.execute(f'SELECT * FROM "{q}"')
        cols = [d[0].lower() for d in cur.description]
        rows = sorted(json.dumps(normalize_value(tuple(r)), default=str) for r in cur.fetchall())
        h = hashlib.sha256(json.dumps(cols).encode())
        for r in rows:
            h.update(b"\n" + r.encode())
        out[t.lower()] = h.hexdigest()
    return out


def state_difference(expected: Mapping[str, str], actual: Mapping[str, str]) -> list[str]:
    """Tables whose contents differ between two :func:`table_digests` (including tables only
    one side has), sorted; empty when the database states are the same."""
    names = set(expected) | set(actual)
    return sorted(n for n in names if expected.get(n) != actual.get(n))


def assigner_scores(expected: Iterable[str], predicted: Iterable[str]) -> dict:
    """``{"accuracy": 1.0 when the predicted expert set equals the expected set else 0.0,
    "jaccard": |E ∩ P| / |E ∪ P|}`` (names compared lower-cased; both empty → 1.0)."""
    e = {x.lower() for x in expected}
    p = {x.lower() for x in predicted}
    union = e | p
    return {
        "accuracy": 1.0 if e == p else 0.0,
        "jaccard": len(e & p) / len(union) if union else 1.0,
    }


def tool_call_scores(expected: Iterable[Hashable], made: Iterable[Hashable]) -> dict:
    """Tool-call correctness of an expert from canonical call keys (see
    :func:`tasks.lifecycle.maintenance.call_key`): ``{"correctness": Jaccard |E ∩ M| / |E ∪ M|,
    "precision": |E ∩ M| / |M| (1.0 when nothing was called and nothing expected, else 0.0 for
    no calls), "recall": |E ∩ M| / |E|}``. Repeated identical calls count once."""
    e, m = set(expected), set(made)
    both = e & m
    union = e | m
    return {
        "correctness": len(both) / len(union) if union else 1.0,
        "precision": len(both) / len(m) if m else (1.0 if not e else 0.0),
        "recall": len(both) / len(e) if e else 1.0,
    }


def coefficient_of_variation(values: Sequence[float]) -> float | None:
    """Population standard deviation / mean of ``values`` (e.g. EX per schema variant); None
    for fewer than two values or a zero mean."""
    vals = [float(v) for v in values if v is not None]
    if len(vals) < 2:
        return None
    mean = sum(vals) / len(vals)
    if mean == 0:
        return None
    return math.sqrt(sum((v - mean) ** 2 for v in vals) / len(vals)) / mean
