"""Analysis of SQL corpora and of a generation run: structural features of every query, the
TPC-DS vs Spider vs BIRD complexity comparison, and the paper's tables for a TPC-DS generation
run (successful queries, mean feature counts normalised by the gold means, Jaccard similarity to
the gold query) with their radar charts and Markdown reports.

Features are :mod:`tasks.text2sql.sql_features`; plots :mod:`tasks.text2sql.plots`. Artifacts go
under ``runs/<run_id>/complexity/`` and ``runs/<run_id>/text2sql/``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import polars as pl
import pyarrow as pa
from prefect import task

from schemas import text2sql as schema
from schemas.text2sql import CorpusSpec
from tasks.core import storage
from tasks.text2sql.corpora import (
    Corpus,
    load_corpus,
    load_tpcds_corpus,
    tpcds_gold_queries,
    tpcds_schema,
)
from tasks.text2sql.plots import _LABELS, histogram_png, radar_png
from tasks.text2sql.sql_features import (
    HISTOGRAM_FEATURES,
    JACCARD_FEATURES,
    NUMERIC_FEATURES,
    PAPER_NUMERIC_FEATURES,
    SQLFeatureError,
    extract_features,
    jaccard,
    prepare_schema,
)
from tasks.text2sql.stage import stage_prefix


# --------------------------------------------------------------------------------------------
# Features of a set of queries
# --------------------------------------------------------------------------------------------


def feature_rows(
    corpus_name: str,
    items: Iterable[tuple[str, str | None, str | None]],
    dialect: str,
    schemas: dict[str, Any] | None = None,
) -> list[dict]:
    """Rows of :data:`schemas.text2sql.SQL_FEATURES` for ``(query_id, db_id, sql)`` items.

    ``schemas``: ``{db_id: {table: columns}}`` for column attribution. A query whose features
    cannot be read gets ``error`` set and null features (nothing is dropped)."""
    prepared = {k: prepare_schema(v) for k, v in (schemas or {}).items()}
    rows = []
    for query_id, db_id, sql in items:
        row: dict[str, Any] = {
            "corpus": corpus_name,
            "query_id": str(query_id),
            "db_id": db_id,
            "dialect": dialect,
            "sql": sql,
            "error": None,
        }
        if sql is None:
            row["error"] = "no SQL"
        else:
            try:
                row.update(extract_features(sql, dialect, prepared.get(db_id)).as_row())
            except SQLFeatureError as e:
                row["error"] = str(e)
        rows.append(row)
    return rows


def _load_corpus_spec(spec: CorpusSpec) -> Corpus:
    if spec.name == "tpcds" and spec.path is None:
        return load_tpcds_corpus()
    corpus = load_corpus(
        spec.path, name=spec.name, dialect=spec.dialect, tables_json=spec.tables_json
    )
    return corpus


@task(name="corpus-features", persist_result=False)
def corpus_features(run_id: str, artifacts_root: str, spec: dict) -> str:
    """Features of every query of one corpus (``spec``: :class:`CorpusSpec` fields) →
    ``complexity/features/<name>.parquet``; returns its URI. Raises CorpusError for a bad
    corpus file, pydantic ValidationError for a bad spec."""
    cs = CorpusSpec.model_validate(spec)
    corpus = _load_corpus_spec(cs)
    rows = feature_rows(
        corpus.name, ((q.query_id, q.db_id, q.sql) for q in corpus), corpus.dialect, corpus.schemas
    )
    uri = storage.join(
        stage_prefix(artifacts_root, run_id, "complexity"), "features", f"{cs.name}.parquet"
    )
    return storage.write_parquet(
        uri, pa.Table.from_pylist(rows, schema=schema.SQL_FEATURES), schema.SQL_FEATURES
    )


# --------------------------------------------------------------------------------------------
# Complexity comparison
# --------------------------------------------------------------------------------------------


def _markdown(df: pl.DataFrame) -> str:
    from tasks.report.stage import markdown_table

    return markdown_table(df)


def complexity_table(features: pl.DataFrame, reference: str = "tpcds") -> pl.DataFrame:
    """Per corpus × numeric feature statistics (:data:`schemas.text2sql.COMPLEXITY`) of a frame
    of :data:`SQL_FEATURES` rows; queries with an ``error`` are left out. ``normalised`` divides
    by the ``reference`` corpus's mean (null when it is absent or its mean is 0)."""
    ok = features.filter(pl.col("error").is_null())
    long = ok.unpivot(
        index="corpus", on=list(NUMERIC_FEATURES), variable_name="feature", value_name="value"
    ).with_columns(pl.col("value").cast(pl.Float64))
    stats = long.group_by("corpus", "feature", maintain_order=True).agg(
        pl.len().cast(pl.Int32).alias("n"),
        pl.col("value").mean().alias("mean"),
        pl.col("value").median().alias("median"),
        pl.col("value").quantile(0.9, "linear").alias("p90"),
        pl.col("value").max().alias("max"),
    )
    ref = stats.filter(pl.col("corpus") == reference).select(
        "feature", pl.col("mean").alias("tpcds_mean")
    )
    out = stats.join(ref, on="feature", how="left").with_columns(
        pl.when(pl.col("tpcds_mean") > 0)
        .then(pl.col("mean") / pl.col("tpcds_mean"))
        .otherwise(None)
        .alias("normalised")
    )
    return out.select(schema.COMPLEXITY.names)


@task(name="complexity-report", persist_result=False)
def complexity_report(run_id: str, artifacts_root: str, feature_uris: list[str]) -> dict:
    """The complexity comparison of the corpora whose feature files are given.

    Writes under ``complexity/``: ``complexity.parquet`` (:data:`COMPLEXITY`),
    ``hist_<feature>.png`` for the six :data:`HISTOGRAM_FEATURES`, and ``complexity.md``.
    Returns ``{"complexity": uri, "markdown": uri, "histograms": {feature: uri},
    "table": markdown of the mean table, "parse_errors": {corpus: count}}``."""
    frames = [pl.from_arrow(storage.read_parquet(u, schema.SQL_FEATURES)) for u in feature_uris]
    features = pl.concat(frames)
    table = complexity_table(features)
    prefix = stage_prefix(artifacts_root, run_id, "complexity")
    uri = storage.write_parquet(
        storage.join(prefix, "complexity.parquet"), table.to_arrow(), schema.COMPLEXITY
    )
    corpora = [f["corpus"][0] for f in frames if f.height]
    ok = features.filter(pl.col("error").is_null())
    hists = {}
    for feat in HISTOGRAM_FEATURES:
        values = {c: ok.filter(pl.col("corpus") == c)[feat].to_list() for c in corpora}
        hists[feat] = storage.write_bytes(
            storage.join(prefix, f"hist_{feat}.png"), histogram_png(values, feat)
        )
    means = table.pivot(on="feature", index="corpus", values="mean").select(
        "corpus", *PAPER_NUMERIC_FEATURES, "relation_count", "constant_count"
    )
    normalised = table.pivot(on="feature", index="corpus", values="normalised").select(
        "corpus", *PAPER_NUMERIC_FEATURES, "relation_count", "constant_count"
    )
    errors = dict(features.group_by("corpus").agg(pl.col("error").is_not_null().sum()).iter_rows())
    sizes = dict(features.group_by("corpus").len().iter_rows())
    md = "\n\n".join(
        [
            f"# SQL complexity: {', '.join(corpora)} (run `{run_id}`)",
            "Feature definitions: `tasks/text2sql/sql_features.py`. Queries per corpus: "
            + ", ".join(f"{c} {sizes[c]} ({errors.get(c, 0)} not parsed)" for c in corpora)
            + ".",
            "## Mean per query",
            _markdown(means),
            "## Means normalised by the TPC-DS gold means",
            _markdown(normalised),
            "## Histograms",
            "\n".join(f"- {_LABELS[f]}: `hist_{f}.png`" for f in HISTOGRAM_FEATURES),
        ]
    )
    md_uri = storage.write_bytes(storage.join(prefix, "complexity.md"), (md + "\n").encode())
    return {
        "complexity": uri,
        "markdown": md_uri,
        "histograms": hists,
        "table": _markdown(means),
        "parse_errors": errors,
    }


# --------------------------------------------------------------------------------------------
# Analysis of a generation run: the paper's tables
# --------------------------------------------------------------------------------------------


def success_table(gens: pl.DataFrame) -> pl.DataFrame:
    """Per model: queries attempted, successful (final attempt valid), valid at the first attempt
    / after a retry, mean attempts per query, tokens and cost (:data:`TEXT2SQL_SUCCESS`)."""
    final = gens.filter(pl.col("final"))
    per_query = gens.group_by("model", "query_id").agg(pl.len().alias("attempts"))
    a = final.group_by("model").agg(
        pl.len().cast(pl.Int32).alias("n_queries"),
        pl.col("valid").sum().cast(pl.Int32).alias("n_success"),
        (pl.col("valid") & (pl.col("attempt") == 0)).sum().cast(pl.Int32).alias("n_first_attempt"),
        (pl.col("valid") & (pl.col("attempt") > 0)).sum().cast(pl.Int32).alias("n_after_retry"),
    )
    b = per_query.group_by("model").agg(pl.col("attempts").mean().alias("mean_attempts"))
    c = gens.group_by("model").agg(
        pl.col("prompt_tokens").sum().alias("prompt_tokens"),
        pl.col("completion_tokens").sum().alias("completion_tokens"),
        pl.when(pl.col("cost_usd").is_null().any())
        .then(None)
        .otherwise(pl.col("cost_usd").sum())
        .alias("cost_usd"),
    )
    return (
        a.join(b, on="model")
        .join(c, on="model")
        .sort("model")
        .select(schema.TEXT2SQL_SUCCESS.names)
    )


def normalised_means_table(features: pl.DataFrame) -> pl.DataFrame:
    """Mean of each :data:`PAPER_NUMERIC_FEATURES` per model (rows of ``features`` with
    ``corpus`` = model, ``gold`` for the gold queries; rows with an error left out), normalised
    by the gold mean (:data:`TEXT2SQL_MEANS`)."""
    ok = features.filter(pl.col("error").is_null())
    long = ok.unpivot(
        index="corpus", on=list(PAPER_NUMERIC_FEATURES), variable_name="feature", value_name="value"
    )
    stats = long.group_by("corpus", "feature").agg(
        pl.len().cast(pl.Int32).alias("n"), pl.col("value").cast(pl.Float64).mean().alias("mean")
    )
    gold = stats.filter(pl.col("corpus") == "gold").select(
        "feature", pl.col("mean").alias("gold_mean")
    )
    out = (
        stats.join(gold, on="feature", how="left")
        .with_columns(
            pl.when(pl.col("gold_mean") > 0)
            .then(pl.col("mean") / pl.col("gold_mean"))
            .otherwise(None)
            .alias("normalised")
        )
        .rename({"corpus": "model"})
    )
    order = {f: i for i, f in enumerate(PAPER_NUMERIC_FEATURES)}
    return (
        out.with_columns(
            pl.col("feature").replace_strict(order, return_dtype=pl.Int32).alias("_o"),
            (pl.col("model") != "gold").alias("_g"),
        )
        .sort("_g", "model", "_o")
        .select(schema.TEXT2SQL_MEANS.names)
    )


def jaccard_table(features: pl.DataFrame) -> pl.DataFrame:
    """Mean Jaccard similarity per model × :data:`JACCARD_FEATURES` between each model query and
    the gold query with the same ``query_id``, plus ``average`` = mean of the feature means
    (:data:`TEXT2SQL_JACCARD`). Only queries whose features both sides have are compared."""
    ok = features.filter(pl.col("error").is_null())
    gold = {r["query_id"]: r for r in ok.filter(pl.col("corpus") == "gold").iter_rows(named=True)}
    rows = []
    for model in sorted(set(ok["corpus"]) - {"gold"}):
        sims: dict[str, list[float]] = {f: [] for f in JACCARD_FEATURES}
        for r in ok.filter(pl.col("corpus") == model).iter_rows(named=True):
            g = gold.get(r["query_id"])
            if g is None:
                continue
            for f in JACCARD_FEATURES:
                sims[f].append(jaccard(r[f] or [], g[f] or []))
        means = {f: (sum(v) / len(v) if v else None) for f, v in sims.items()}
        n = len(sims[JACCARD_FEATURES[0]])
        rows += [
            {"model": model, "feature": f, "n": n, "jaccard": means[f]} for f in JACCARD_FEATURES
        ]
        vals = [v for v in means.values() if v is not None]
        rows.append(
            {
                "model": model,
                "feature": "average",
                "n": n,
                "jaccard": sum(vals) / len(vals) if vals else None,
            }
        )
    return pl.DataFrame(
        rows,
        schema={"model": pl.String, "feature": pl.String, "n": pl.Int32, "jaccard": pl.Float64},
    )


@task(name="text2sql-analyse", persist_result=False)
def analyse_generations(run_id: str, artifacts_root: str, generations_uri: str) -> dict:
    """The paper's tables for a generation run, from ``generations.parquet`` alone.

    Features of the 99 gold queries (``corpus = "gold"``) and of each model's final valid SQL
    (``corpus = <model>``) → ``text2sql/features.parquet``; then ``success.parquet``,
    ``normalised_means.parquet``, ``jaccard.parquet``, ``radar_jaccard.png``,
    ``radar_normalised_means.png`` and ``report.md``. Returns their URIs plus ``"tables"``:
    the three tables as Markdown."""
    gens = pl.from_arrow(storage.read_parquet(generations_uri, schema.GENERATIONS))
    gold = tpcds_gold_queries()
    tpcds = {"tpcds": {t: [c for c, _ in cols] for t, cols in tpcds_schema().items()}}
    rows = feature_rows("gold", ((q, "tpcds", s) for q, s in gold.items()), "postgres", tpcds)
    final_valid = gens.filter(pl.col("final") & pl.col("valid"))
    for model in sorted(set(final_valid["model"])):
        sub = final_valid.filter(pl.col("model") == model)
        rows += feature_rows(
            model,
            ((r["query_id"], "tpcds", r["sql"]) for r in sub.iter_rows(named=True)),
            "postgres",
            tpcds,
        )
    features = pl.from_arrow(pa.Table.from_pylist(rows, schema=schema.SQL_FEATURES))
    prefix = stage_prefix(artifacts_root, run_id, "text2sql")
    out = {
        "features": storage.write_parquet(
            storage.join(prefix, "features.parquet"), features.to_arrow(), schema.SQL_FEATURES
        )
    }
    success = success_table(gens)
    means = normalised_means_table(features)
    jac = jaccard_table(features)
    out["success"] = storage.write_parquet(
        storage.join(prefix, "success.parquet"), success.to_arrow(), schema.TEXT2SQL_SUCCESS
    )
    out["normalised_means"] = storage.write_parquet(
        storage.join(prefix, "normalised_means.parquet"), means.to_arrow(), schema.TEXT2SQL_MEANS
    )
    out["jaccard"] = storage.write_parquet(
        storage.join(prefix, "jaccard.parquet"), jac.to_arrow(), schema.TEXT2SQL_JACCARD
    )
    jac_scores = {
        m: dict(zip(g["feature"], g["jaccard"]))
        for (m,), g in jac.group_by("model", maintain_order=True)
    }
    norm_scores = {
        m: dict(zip(g["feature"], g["normalised"]))
        for (m,), g in means.group_by("model", maintain_order=True)
    }
    out["radar_jaccard"] = storage.write_bytes(
        storage.join(prefix, "radar_jaccard.png"),
        radar_png(
            jac_scores,
            list(JACCARD_FEATURES),
            "Jaccard similarity to the TPC-DS gold queries",
            rmax=1.0,
        ),
    )
    out["radar_normalised_means"] = storage.write_bytes(
        storage.join(prefix, "radar_normalised_means.png"),
        radar_png(
            norm_scores, list(PAPER_NUMERIC_FEATURES), "Mean feature counts / TPC-DS gold means"
        ),
    )
    means_wide = means.pivot(on="feature", index="model", values="normalised")
    jac_wide = jac.pivot(on="feature", index="model", values="jaccard") if jac.height else jac
    unreadable = features.filter(pl.col("error").is_not_null() & (pl.col("corpus") != "gold"))
    tables = {
        "success": _markdown(success),
        "normalised_means": _markdown(means_wide),
        "jaccard": _markdown(jac_wide),
    }
    n_queries = gens["query_id"].n_unique()
    md = "\n\n".join(
        [
            f"# Text-to-SQL on TPC-DS (run `{run_id}`)",
            (
                f"{gens['model'].n_unique()} model(s), {n_queries} queries, {gens.height} "
                "attempts. A query succeeds when its final SQL passes `EXPLAIN` on PostgreSQL "
                "(an invalid query is regenerated with PostgreSQL's error in a new user turn)."
            ),
            f"## Successful queries (out of {n_queries})",
            tables["success"],
            "## Mean feature counts normalised by the TPC-DS gold means (valid queries)",
            tables["normalised_means"],
            "## Jaccard similarity to the gold query (valid queries)",
            tables["jaccard"],
            "Radar charts: `radar_jaccard.png`, `radar_normalised_means.png`. Features: "
            "`tasks/text2sql/sql_features.py`."
            + (
                f"\n\n{unreadable.height} valid queries could not be read by sqlglot and are left out "
                "of the feature tables."
                if unreadable.height
                else ""
            ),
        ]
    )
    out["markdown"] = storage.write_bytes(storage.join(prefix, "report.md"), (md + "\n").encode())
    out["tables"] = tables
    return out


__all__ = [
    "analyse_generations",
    "complexity_report",
    "complexity_table",
    "corpus_features",
    "feature_rows",
    "jaccard_table",
    "normalised_means_table",
    "success_table",
]
