"""Item generation for every phase, from real schemas and queries (no LLM).

Sources: the Spider dev databases (built into SQLite by :func:`tasks.text2sql.spider.build_spider_databases`)
with the Spider dev questions (``dev.json``: question, gold SQL, db_id; the question id is its
0-based position, as in the gold file), and Chinook (read by path, never copied). Text2SQL,
progressive and debugging items share one seeded sample of questions whose gold query can be
scored (it executes and reads no empty table — :func:`tasks.text2sql.spider.score_execution_accuracy`
status ``match``), so EX and G-EX are measured on the same questions.

Per phase (:func:`generate_phase_items` returns the items and a manifest of what was dropped):

- ``design`` / ``implementation`` — :mod:`tasks.lifecycle.design` over every database;
- ``text2sql`` — one item per sampled question and schema variant; a question enters the
  variant comparison only when its gold query translates to every variant with the same result
  (else only its ``original`` item is kept, counted as ``variant translation failed``);
- ``progressive`` — the question's reasoning graph (:mod:`tasks.lifecycle.graphs`); a graph
  whose nodes do not all execute is dropped and counted; each kept graph gives level 0 and, when
  it has a non-final node, every configured level 1–5 (seeded perturbations recorded in the
  item's context);
- ``dml`` — :mod:`tasks.lifecycle.dml` per database;
- ``debug`` — one mutation per sampled question (:mod:`tasks.lifecycle.mutations`), kept only
  when it fails with an error;
- ``assigner`` / ``expert`` — :mod:`tasks.lifecycle.maintenance` scenarios.

``max_items`` caps the base items of a phase by a seeded hash order (stable when the sources
grow: an item's rank does not depend on the others).
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections import Counter
from pathlib import Path

from sqlglot.errors import ParseError, TokenError

from schemas.lifecycle import PHASES, LifecycleConfig
from tasks.lifecycle.design import design_items, implementation_items
from tasks.lifecycle.dml import dml_items
from tasks.lifecycle.graphs import (
    GraphError,
    PerturbationError,
    build_reasoning_graph,
    check_graph,
    perturb_graph,
)
from tasks.lifecycle.maintenance import load_catalogue, maintenance_items
from tasks.lifecycle.mutations import make_debug_item
from tasks.lifecycle.runner import db_path
from tasks.lifecycle.schema import read_sqlite_schema, sqlite_ddl
from tasks.lifecycle.variants import (
    TranslationError,
    build_variant_database,
    translate_sql,
    variant_maps,
)
from tasks.scoring.result_match import has_top_level_order_by, results_match
from tasks.text2sql.spider import build_spider_databases, run_sqlite, score_execution_accuracy

__all__ = [
    "LifecycleSourceError",
    "generate_phase_items",
    "load_questions",
    "prepare_databases",
    "sample_ids",
    "scoreable_questions",
]


class LifecycleSourceError(ValueError):
    """A source (Spider directory, questions file, Chinook database) is missing or malformed."""


def sample_ids(ids: list[str], n: int | None, seed: int, salt: str) -> list[str]:
    """Up to ``n`` of ``ids`` (all when None): those with the smallest
    ``sha256("<seed>:<salt>:<id>")``, returned in their original order."""
    if n is None or n >= len(ids):
        return list(ids)
    rank = sorted(ids, key=lambda i: hashlib.sha256(f"{seed}:{salt}:{i}".encode()).hexdigest())
    keep = set(rank[:n])
    return [i for i in ids if i in keep]


def load_questions(path: str | Path) -> list[dict]:
    """Spider's ``dev.json`` → ``[{"query_id": "0", "question", "sql", "db_id"}, ...]``.
    Raises :class:`LifecycleSourceError` for a missing file or another format."""
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
        return [
            {"query_id": str(i), "question": q["question"], "sql": q["query"], "db_id": q["db_id"]}
            for i, q in enumerate(data)
        ]
    except FileNotFoundError:
        raise LifecycleSourceError(f"{p}: Spider questions file (dev.json) not found") from None
    except (ValueError, KeyError, TypeError) as e:
        raise LifecycleSourceError(
            f"{p}: not a Spider dev.json ({type(e).__name__}: {e})"
        ) from None


def prepare_databases(
    spider_dir: str | Path,
    questions_path: str | Path,
    home: str | Path,
    config: LifecycleConfig,
    chinook_path: str | Path | None = None,
) -> dict:
    """Build the Spider databases the run needs (``config.spider_db_ids``, default every
    database under ``spider_dir``) into ``<home>/spider`` (where the text-to-SQL flows build
    them too) and their schema variants into
    ``<home>/lifecycle/variants/<db_id>/<variant>.sqlite`` (up-to-date files are reused).

    Returns the databases manifest ``{"spider": {db_id: path}, "chinook": path or None,
    "variants": {db_id: {variant: path}}, "questions": path}``. Raises
    :class:`LifecycleSourceError` for a missing Chinook file or questions file,
    :class:`tasks.text2sql.spider.SpiderError` for a bad Spider directory."""
    out = Path(home)
    qpath = Path(questions_path)
    if not qpath.is_file():
        raise LifecycleSourceError(f"{qpath}: Spider questions file (dev.json) not found")
    spider = build_spider_databases(spider_dir, out / "spider", config.spider_db_ids)
    chinook = None
    if config.include_chinook:
        if chinook_path is None or not Path(chinook_path).is_file():
            raise LifecycleSourceError(
                f"{chinook_path}: Chinook database not found (give its path, or set "
                "include_chinook=false)"
            )
        chinook = str(Path(chinook_path).resolve())
    variants: dict[str, dict[str, str]] = {}
    for db_id, path in spider.items():
        variants[db_id] = {}
        for v in config.variants:
            if v == "original":
                continue
            target = out / "lifecycle" / "variants" / db_id / f"{v}.sqlite"
            build_variant_database(path, target, v)
            variants[db_id][v] = str(target)
    return {
        "spider": {k: str(v) for k, v in spider.items()},
        "chinook": chinook,
        "variants": variants,
        "questions": str(qpath.resolve()),
    }


def scoreable_questions(databases: dict, timeout_ms: int = 30_000) -> list[dict]:
    """The Spider questions of the built databases whose gold query can be scored (status
    ``match`` when scored against itself)."""
    qs = [q for q in load_questions(databases["questions"]) if q["db_id"] in databases["spider"]]
    if not qs:
        return []
    scores = score_execution_accuracy(
        [q["sql"] for q in qs],
        [(q["sql"], q["db_id"]) for q in qs],
        databases["spider"],
        timeout_ms,
    )
    ok = set(scores.filter(scores["status"] == "match")["query_id"].to_list())
    # score_execution_accuracy numbers (sql, db_id) pairs 0..n-1 in the order given
    return [q for i, q in enumerate(qs) if str(i) in ok]


def _sampled_questions(databases: dict, config: LifecycleConfig) -> list[dict]:
    qs = scoreable_questions(databases, config.timeout_ms)
    keep = set(sample_ids([q["query_id"] for q in qs], config.max_items, config.seed, "questions"))
    return [q for q in qs if q["query_id"] in keep]


def _schemas(databases: dict) -> tuple[dict, dict]:
    schemas = {db: read_sqlite_schema(p) for db, p in sorted(databases["spider"].items())}
    sources = {db: "spider" for db in schemas}
    if databases.get("chinook"):
        schemas["chinook"] = read_sqlite_schema(databases["chinook"])
        sources["chinook"] = "chinook"
    return schemas, sources


def _cap(items: list[dict], config: LifecycleConfig, salt: str) -> list[dict]:
    bases = list(dict.fromkeys(i["base_id"] for i in items))
    keep = set(sample_ids(bases, config.max_items, config.seed, salt))
    return [i for i in items if i["base_id"] in keep]


def _question_prompt(ddl: str, question: str) -> str:
    return (
        f"Database schema (SQLite):\n\n{ddl}\n\nQuestion: {question}\n\n"
        "Write one SQLite query that answers the question. Answer with the SQL in a ```sql "
        "code block."
    )


def _ordered(sql: str, dialect: str) -> bool:
    try:
        return has_top_level_order_by(sql, dialect)
    except (ParseError, TokenError):
        return False


def _item(
    phase: str,
    item_id: str,
    base_id: str,
    db_id: str,
    seed: int,
    prompt: str,
    reference: dict,
    context: dict,
    variant: str = "original",
    level: int = 0,
    source: str = "spider",
) -> dict:
    return {
        "item_id": item_id,
        "phase": phase,
        "base_id": base_id,
        "source": source,
        "db_id": db_id,
        "variant": variant,
        "level": level,
        "seed": seed,
        "prompt": prompt,
        "reference": reference,
        "context": context,
    }


def _text2sql(databases: dict, config: LifecycleConfig, dropped: Counter) -> list[dict]:
    items = []
    schemas = {}
    ddls: dict[tuple[str, str], str] = {}
    for q in _sampled_questions(databases, config):
        db = q["db_id"]
        if db not in schemas:
            schemas[db] = read_sqlite_schema(databases["spider"][db])
        per_variant = {}
        gold_rows = run_sqlite(databases["spider"][db], q["sql"], config.timeout_ms)
        ordered = _ordered(q["sql"], "mysql")
        for v in config.variants:
            path = db_path(databases, db, v)
            if v == "original":
                per_variant[v] = q["sql"]
                continue
            try:
                sql = translate_sql(q["sql"], variant_maps(schemas[db], v), schemas[db])
                rows = run_sqlite(path, sql, config.timeout_ms)
            except (TranslationError, ParseError, TokenError, sqlite3.Error, sqlite3.Warning):
                break
            if not results_match(gold_rows, rows, ordered=ordered):
                break
            per_variant[v] = sql
        if len(per_variant) < len(config.variants):
            dropped["variant translation failed (original kept)"] += 1
            per_variant = {"original": q["sql"]}
        for v, sql in per_variant.items():
            if (db, v) not in ddls:
                ddls[db, v] = sqlite_ddl(db_path(databases, db, v))
            items.append(
                _item(
                    "text2sql",
                    f"text2sql/{q['query_id']}/{v}",
                    q["query_id"],
                    db,
                    config.seed,
                    _question_prompt(ddls[db, v], q["question"]),
                    {"sql": sql, "ordered": ordered},
                    {"question": q["question"]},
                    variant=v,
                )
            )
    return items


def _progressive(databases: dict, config: LifecycleConfig, dropped: Counter) -> list[dict]:
    items = []
    names: dict[str, list[str]] = {}
    ddls: dict[str, str] = {}
    for q in _sampled_questions(databases, config):
        db = q["db_id"]
        path = databases["spider"][db]
        try:
            nodes = build_reasoning_graph(q["sql"])
        except GraphError as e:
            dropped[f"graph not built: {str(e)[:60]}"] += 1
            continue
        reason = check_graph(nodes, path, config.timeout_ms)
        if reason is not None:
            dropped["a node does not execute"] += 1
            continue
        if db not in names:
            s = read_sqlite_schema(path)
            names[db] = [t.name for t in s.tables] + sorted(
                {c.name for t in s.tables for c in t.columns}
            )
            ddls[db] = sqlite_ddl(path)
        gold = {n["id"]: n["sql"] for n in nodes}
        ordered = {n["id"]: _ordered(n["sql"], "sqlite") for n in nodes}
        if len(nodes) < 2 and any(level > 0 for level in config.graph_levels):
            dropped["single-node graph (no perturbation levels)"] += 1
        for level in config.graph_levels:
            if level > 0 and len(nodes) < 2:
                continue
            try:
                shown, ops = perturb_graph(nodes, level, config.seed, q["query_id"], names[db])
            except PerturbationError:
                dropped[f"no place for a level-{level} perturbation"] += 1
                continue
            items.append(
                _item(
                    "progressive",
                    f"progressive/{q['query_id']}/L{level}",
                    q["query_id"],
                    db,
                    config.seed,
                    _question_prompt(ddls[db], q["question"]).rsplit("\n\nWrite one", 1)[0],
                    {"nodes": gold, "ordered": ordered, "final": nodes[-1]["id"]},
                    {
                        "question": q["question"],
                        "nodes": shown,
                        "perturbations": ops,
                        "n_nodes": len(nodes),
                    },
                    level=level,
                )
            )
    return items


def _debug(databases: dict, config: LifecycleConfig, dropped: Counter) -> list[dict]:
    items = []
    names: dict[str, tuple[set, set]] = {}
    ddls: dict[str, str] = {}
    for q in _sampled_questions(databases, config):
        db = q["db_id"]
        path = databases["spider"][db]
        if db not in names:
            s = read_sqlite_schema(path)
            names[db] = (
                {t.name.lower() for t in s.tables},
                {c.name.lower() for t in s.tables for c in t.columns},
            )
            ddls[db] = sqlite_ddl(path)
        mut = make_debug_item(
            q["sql"],
            path,
            int(q["query_id"]),
            config.seed,
            q["query_id"],
            *names[db],
            timeout_ms=config.timeout_ms,
        )
        if mut is None:
            dropped["no mutation fails with an error"] += 1
            continue
        prompt = (
            f"Database schema (SQLite):\n\n{ddls[db]}\n\n"
            f"This query was written to answer the question: {q['question']}\n\n"
            f"```sql\n{mut['flawed_sql']}\n```\n\nSQLite rejects it with this error:\n"
            f"{mut['error']}\n\nWrite the corrected query. Answer with the SQL in a ```sql code block."
        )
        items.append(
            _item(
                "debug",
                f"debug/{q['query_id']}",
                q["query_id"],
                db,
                config.seed,
                prompt,
                {"sql": q["sql"], "ordered": _ordered(q["sql"], "mysql"), **mut},
                {"question": q["question"], "kind": mut["kind"]},
            )
        )
    return items


def generate_phase_items(
    phase: str, databases: dict, config: LifecycleConfig
) -> tuple[list[dict], dict]:
    """The items of one phase (dicts with ``reference``/``context`` as dicts) and its
    manifest ``{"phase", "n_items", "n_base_items", "dropped": {reason: count}}``. Raises
    ValueError for an unknown phase."""
    if phase not in PHASES:
        raise ValueError(f"unknown phase {phase!r}; phases: {list(PHASES)}")
    dropped: Counter = Counter()
    if phase in ("design", "implementation"):
        schemas, sources = _schemas(databases)
        fn = design_items if phase == "design" else implementation_items
        items = _cap(
            fn(
                schemas,
                config.design_table_counts,
                config.design_groups_per_db,
                config.seed,
                sources,
            ),
            config,
            phase,
        )
    elif phase == "dml":
        dbs = dict(databases["spider"])
        if databases.get("chinook"):
            dbs["chinook"] = databases["chinook"]
        items = []
        for db in sorted(dbs):
            items += dml_items(
                db,
                dbs[db],
                config.dml_per_db,
                config.seed,
                "chinook" if db == "chinook" else "spider",
                timeout_ms=config.timeout_ms,
            )
        items = _cap(items, config, phase)
    elif phase == "text2sql":
        items = _text2sql(databases, config, dropped)
    elif phase == "progressive":
        items = _progressive(databases, config, dropped)
    elif phase == "debug":
        items = _debug(databases, config, dropped)
    else:
        assigner, expert = maintenance_items(
            load_catalogue(), config.maintenance_scenarios, config.seed
        )
        items = assigner if phase == "assigner" else expert
    manifest = {
        "phase": phase,
        "n_items": len(items),
        "n_base_items": len({i["base_id"] for i in items}),
        "dropped": dict(sorted(dropped.items())),
    }
    return items, manifest
