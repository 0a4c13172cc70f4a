"""Prefect tasks of the lifecycle flow: databases → items per phase → (model × phase × items)
batches → per-phase results → tables and report. Tasks pass artifact URIs and small manifests;
each is a plain function underneath (``task.fn(...)``).

Artifacts are written under ``<root>/runs/<run_id>/lifecycle/`` (layout in
:mod:`schemas.lifecycle`). Re-running a run id reuses what exists: items already generated for
a phase are not regenerated (so a run's items never change under it), a batch whose results
exist is skipped.

The optional rewrite stage (:mod:`tasks.lifecycle.rewrite`, ``rewrite_model``) paraphrases the
templated requirements of design/implementation items with a chat model when they are
generated; without it the items are the templated ones.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

import polars as pl
import pyarrow as pa
from prefect import task

from schemas import lifecycle as schema
from schemas.lifecycle import PHASES, LifecycleConfig
from schemas.settings import Settings
from tasks.agents.registry import spec_label
from tasks.core import storage
from tasks.lifecycle.agents import AgentConfigError, check_agent_spec, make_agent
from tasks.lifecycle.items import generate_phase_items, prepare_databases
from tasks.lifecycle.rewrite import REWRITE_PHASES, rewrite_items, rewrite_label
from tasks.lifecycle.runner import RunContext, run_item
from tasks.lifecycle.tables import (
    debug_by_kind_table,
    design_by_k_table,
    ex_vs_gex_table,
    main_table,
    main_table_wide,
    robustness_table,
    variant_cv_table,
)
from tasks.core.batching import BatchedStage, check_specs, combine, plan
from tasks.core.layout import RunLayout

__all__ = [
    "LIFECYCLE_BATCHES",
    "check_phases",
    "combine_lifecycle_results",
    "generate_lifecycle_items",
    "items_to_table",
    "lifecycle_prefix",
    "lifecycle_report",
    "plan_lifecycle_batches",
    "prepare_lifecycle_databases",
    "read_items",
    "read_items_table",
    "run_lifecycle_batch",
]


def lifecycle_prefix(artifacts_root: str, run_id: str) -> str:
    """``<root>/runs/<run_id>/lifecycle``."""
    return RunLayout(artifacts_root, run_id).path("lifecycle")


def check_phases(phases: list[str] | None) -> list[str]:
    """``phases`` in report order (all when None/empty); ValueError naming unknown phases."""
    if not phases:
        return list(PHASES)
    unknown = [p for p in phases if p not in PHASES]
    if unknown:
        raise ValueError(f"unknown phases {unknown}; phases: {list(PHASES)}")
    return [p for p in PHASES if p in phases]


def items_to_table(items: list[dict]) -> pa.Table:
    """Items (``reference``/``context`` as dicts) → an :data:`schemas.lifecycle.ITEMS` table."""
    rows = [
        {
            **it,
            "reference": json.dumps(it["reference"], sort_keys=True, default=str),
            "context": json.dumps(it["context"], sort_keys=True, default=str),
        }
        for it in items
    ]
    return pa.Table.from_pylist(rows, schema=schema.ITEMS)


def read_items_table(uri: str) -> pa.Table:
    """An items artifact as an :data:`schemas.lifecycle.ITEMS` table; items written before the
    rewrite columns existed get them as nulls. Raises ArtifactSchemaError for another schema."""
    from schemas.artifacts import check_schema

    table = storage.read_parquet(uri)
    for name in schema.ITEM_REWRITE_COLUMNS:
        if name not in table.column_names:
            typ = schema.ITEMS.field(name).type
            table = table.append_column(name, pa.nulls(table.num_rows, typ))
    return check_schema(table, schema.ITEMS, uri)


def read_items(uri: str, item_ids: list[str] | None = None) -> list[dict]:
    """The items of an items artifact (``reference``/``context`` decoded), optionally only
    ``item_ids`` (in that order). Raises KeyError naming ids that are not there."""
    rows = pl.from_arrow(read_items_table(uri)).to_dicts()
    for r in rows:
        r["reference"] = json.loads(r["reference"])
        r["context"] = json.loads(r["context"])
    if item_ids is None:
        return rows
    by_id = {r["item_id"]: r for r in rows}
    missing = [i for i in item_ids if i not in by_id]
    if missing:
        raise KeyError(f"{uri}: no items {missing[:5]}")
    return [by_id[i] for i in item_ids]


@task(name="lifecycle-databases", persist_result=False)
def prepare_lifecycle_databases(
    run_id: str,
    artifacts_root: str,
    spider_dir: str,
    questions_path: str,
    chinook_path: str | None,
    config: dict,
) -> str:
    """Build the Spider databases (``<QUERYLAB_HOME>/spider``, shared with the text-to-SQL
    flows) and the schema variants (``<QUERYLAB_HOME>/lifecycle/variants``); write the
    manifest ``lifecycle/databases.json`` and return its URI."""
    cfg = LifecycleConfig.model_validate(config)
    home = Settings.from_env().home
    dbs = prepare_databases(spider_dir, questions_path, home, cfg, chinook_path)
    return storage.write_json(
        storage.join(lifecycle_prefix(artifacts_root, run_id), "databases.json"), dbs
    )


@task(name="lifecycle-items", persist_result=False)
def generate_lifecycle_items(
    run_id: str,
    artifacts_root: str,
    phase: str,
    databases_uri: str,
    config: dict,
    rewrite_model: str | None = None,
) -> dict:
    """Generate one phase's items into ``lifecycle/items/<phase>.parquet`` (kept when it
    exists) and its manifest ``items/<phase>.json``; returns the manifest plus ``"uri"``.

    ``rewrite_model`` (``openai:<model>``; None: templates only): paraphrase the requirements
    of design/implementation items (:func:`tasks.lifecycle.rewrite.rewrite_items`); the
    manifest then holds ``"rewrite"`` (model, items rewritten / kept as template, tokens, USD
    cost, errors). Raises ValueError when the run's existing items of this phase were made with
    another rewrite model (use a new run id), AgentConfigError for a bad rewrite model."""
    prefix = storage.join(lifecycle_prefix(artifacts_root, run_id), "items")
    uri = storage.join(prefix, f"{phase}.parquet")
    manifest_uri = storage.join(prefix, f"{phase}.json")
    label = rewrite_label(rewrite_model) if phase in REWRITE_PHASES else None
    if storage.exists(uri) and storage.exists(manifest_uri):
        manifest = storage.read_json(manifest_uri)
        had = (manifest.get("rewrite") or {}).get("model")
        if had != label:
            raise ValueError(
                f"run {run_id!r}: its {phase} items were generated with rewrite model "
                f"{had or 'none'}, not {label or 'none'}; use a new run id"
            )
        return {**manifest, "uri": uri}
    cfg = LifecycleConfig.model_validate(config)
    items, manifest = generate_phase_items(phase, storage.read_json(databases_uri), cfg)
    if label is not None:
        items, manifest["rewrite"] = rewrite_items(
            items, rewrite_model, Settings.from_env(), cfg, artifacts_root
        )
        r = manifest["rewrite"]
        _log(
            f"lifecycle {phase} items: {r['n_rewritten']}/{r['n_items']} requirements rewritten "
            f"by {label} ({r['n_fallback']} kept as template)"
        )
    storage.write_parquet(uri, items_to_table(items), schema.ITEMS)
    storage.write_json(manifest_uri, manifest)
    return {**manifest, "uri": uri}


def plan_lifecycle_batches(
    models: list[str],
    item_manifests: list[dict],
    batch_size: int,
    config: LifecycleConfig | dict | None = None,
) -> list[dict]:
    """(model × phase × items) work in batches of at most ``batch_size`` items:
    ``[{"key", "model", "phase", "items_uri", "item_ids"}]``. A key digests the model (and a
    replay file's content), the phase, the batch's items (every column, not only the ids) and
    the full ``config`` (:class:`LifecycleConfig`; the default when None): a re-run with the
    same inputs finds its finished batches, one with any of them changed (``debug_rounds``,
    sampling, ...) runs again (:func:`tasks.core.runs.batch_key`). Raises ValueError for no models,
    a duplicate model label or ``batch_size < 1``; AgentConfigError for a bad model spec or an
    unreadable replay file."""
    if not models:
        raise ValueError("no models given")
    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    cfg, fingerprints = check_specs(models, check_agent_spec, spec_label, "models",
                                    AgentConfigError, "cannot read the replay file",
                                    LifecycleConfig, config)
    batches = []
    for man in item_manifests:
        rows = read_items_table(man["uri"]).to_pylist()
        for model in models:
            label = f"{spec_label(model)}-{man['phase']}"
            for key, chunk in plan(label, rows, batch_size,
                                   lambda c: [model, fingerprints[model], man["phase"], c, cfg]):
                batches.append(
                    {
                        "key": key,
                        "model": model,
                        "phase": man["phase"],
                        "items_uri": man["uri"],
                        "item_ids": [r["item_id"] for r in chunk],
                    }
                )
    return batches


def _log(msg: str) -> None:
    """Log to the Prefect run logger inside a run, else to the module logger."""
    from prefect.exceptions import MissingContextError
    from prefect.logging import get_run_logger

    try:
        get_run_logger().info(msg)
    except MissingContextError:
        logging.getLogger(__name__).info(msg)


#: The lifecycle batches: ``lifecycle/batches/<key>.calls.parquet`` then
#: ``<key>.results.parquet`` (written last: the batch is finished), per-item checkpoints
#: ``<key>.parts/``.
LIFECYCLE_BATCHES = BatchedStage("lifecycle", (("calls", schema.CALLS),
                                               ("results", schema.RESULTS)))


@task(name="lifecycle-batch", persist_result=False)
def run_lifecycle_batch(
    run_id: str, artifacts_root: str, batch: dict, databases_uri: str, config: dict
) -> str:
    """Run one batch (one model × some items of one phase): write
    ``batches/<key>.calls.parquet`` then ``batches/<key>.results.parquet`` and return the
    results URI; a batch whose results exist is skipped, and the items an interrupted attempt
    finished (checkpointed one by one) are not run again. Raises AgentConfigError for a bad
    model, KeyError for unknown item ids."""
    key = batch["key"]

    def start(stack: ExitStack) -> tuple[list[dict], Callable[[dict], dict[str, list[dict]]]]:
        cfg = LifecycleConfig.model_validate(config)
        agent = make_agent(batch["model"], Settings.from_env(), cfg, artifacts_root)
        ctx = RunContext(storage.read_json(databases_uri), cfg)
        close = getattr(agent, "close", None)
        if close:
            stack.callback(close)

        def one(item: dict) -> dict[str, list[dict]]:
            row, call_rows = run_item(agent, item, ctx, run_id)
            return {"results": [row], "calls": call_rows}

        return read_items(batch["items_uri"], batch["item_ids"]), one

    def report(rows: dict[str, list[dict]]) -> None:
        results = rows["results"]
        _log(
            f"lifecycle batch {key}: {len(results)} {batch['phase']} items, "
            f"{len(rows['calls'])} model calls, "
            f"{sum(r['error'] is not None for r in results)} with an error"
        )

    return LIFECYCLE_BATCHES.run_batch(artifacts_root, run_id, key, start, report)


@task(name="lifecycle-combine", persist_result=False)
def combine_lifecycle_results(run_id: str, artifacts_root: str, batches: list[dict]) -> dict:
    """Concatenate the batches per phase into ``results/<phase>.parquet`` and
    ``calls/<phase>.parquet`` (sorted by model, item, step; written row group by row group,
    :func:`tasks.core.batching.combine`); returns ``{phase: {"results": uri, "calls": uri}}``."""
    prefix = lifecycle_prefix(artifacts_root, run_id)
    out = {}
    for phase in PHASES:
        keys = [b["key"] for b in batches if b["phase"] == phase]
        if not keys:
            continue
        out[phase] = {
            part: combine([LIFECYCLE_BATCHES.uri(artifacts_root, run_id, k, part) for k in keys],
                          sch, order, storage.join(prefix, part, f"{phase}.parquet"))
            for part, sch, order in (("results", schema.RESULTS, ["model", "item_id"]),
                                     ("calls", schema.CALLS, ["model", "item_id", "step"]))
        }
    return out


def _markdown(df: pl.DataFrame) -> str:
    from tasks.report.stage import markdown_table

    return markdown_table(df)


@task(name="lifecycle-report", persist_result=False)
def lifecycle_report(run_id: str, artifacts_root: str) -> dict:
    """The paper's tables from ``results/*.parquet`` alone (so it can be recomputed from
    artifacts): writes ``tables/{main,robustness,variant_cv,ex_vs_gex,design_by_k,
    debug_by_kind}.parquet`` and ``report.md``; returns their URIs plus ``"tables"`` (Markdown
    of each) and ``"main"`` (the wide main table as dicts). Raises StorageError when the run
    has no results."""
    prefix = lifecycle_prefix(artifacts_root, run_id)
    uris = storage.list_uris(storage.join(prefix, "results"), ".parquet")
    if not uris:
        raise storage.StorageError(f"{prefix}/results: no lifecycle results for run {run_id!r}")
    results = pl.concat([pl.from_arrow(storage.read_parquet(u, schema.RESULTS)) for u in uris])
    tables = {
        "main": (main_table(results), schema.MAIN_TABLE),
        "robustness": (robustness_table(results), schema.ROBUSTNESS),
        "variant_cv": (variant_cv_table(results), schema.VARIANT_CV),
        "ex_vs_gex": (ex_vs_gex_table(results), schema.EX_VS_GEX),
        "design_by_k": (design_by_k_table(results), schema.DESIGN_BY_K),
        "debug_by_kind": (debug_by_kind_table(results), schema.DEBUG_BY_KIND),
    }
    out: dict = {}
    for name, (df, sch) in tables.items():
        out[name] = storage.write_parquet(
            storage.join(prefix, "tables", f"{name}.parquet"), df.to_arrow(), sch
        )
    wide = main_table_wide(tables["main"][0])
    md_tables = {"main": _markdown(wide)}
    md_tables.update({k: _markdown(v[0]) for k, v in tables.items() if k != "main"})
    manifests = []
    for u in storage.list_uris(storage.join(prefix, "items"), ".json"):
        manifests.append(storage.read_json(u))
    order = {p: i for i, p in enumerate(PHASES)}
    manifests.sort(key=lambda m: order.get(m.get("phase"), 99))
    item_lines = "\n".join(
        f"- {m['phase']}: {m['n_items']} items ({m['n_base_items']} base)"
        + (
            "; dropped: " + ", ".join(f"{k} {v}" for k, v in m["dropped"].items())
            if m.get("dropped")
            else ""
        )
        for m in manifests
    )
    costs = (
        tables["main"][0]
        .unique(["model", "phase"])
        .group_by("model")
        .agg(
            pl.when(pl.col("cost_usd").is_null().any())
            .then(None)
            .otherwise(pl.col("cost_usd").sum())
            .alias("cost_usd")
        )
        .sort("model")
    )
    sections = [
        f"# Database-lifecycle suite (run `{run_id}`)",
        (
            "Phases P1 Design (ACC-Entity/Data/Key), P2 Implementation (T-Level, F-Level, DDL "
            "executes), P3 Operation (Text2SQL EX; Progressive-Text2SQL G-EX and final-node EX; "
            "UPDATE/DELETE state match), P4 Debugging (EX single- and multi-round), P5 Maintenance "
            "(Assigner accuracy, Expert tool-call correctness). Metric definitions: "
            "`tasks/lifecycle/metrics.py`."
        ),
        "## Items\n" + (item_lines or "(no manifest)"),
        "## Main results (mean over items)",
        md_tables["main"],
        "## Cost (USD)",
        _markdown(costs),
        "## Robustness by perturbation level (graphs with every level)",
        md_tables["robustness"],
        "## EX across schema variants (coefficient of variation)",
        md_tables["variant_cv"],
        "## Text2SQL EX vs Progressive-Text2SQL (same questions)",
        md_tables["ex_vs_gex"],
        "## Design accuracy by number of tables",
        md_tables["design_by_k"],
        "## Debugging by mutation kind",
        md_tables["debug_by_kind"],
    ]
    out["markdown"] = storage.write_bytes(
        storage.join(prefix, "report.md"), ("\n\n".join(sections) + "\n").encode()
    )
    out["tables"] = md_tables
    out["main_wide"] = wide.to_dicts()
    return out


def resolve_path(value: str | None) -> str | None:
    """An absolute path string (None stays None)."""
    return None if value is None else str(Path(value).resolve())
