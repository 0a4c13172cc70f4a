"""Benchmark: every report table over a synthetic run's Parquet artifacts (1M trials by default).

Targets (issue 17): each table ≤ 3 s at 1M trials; ≤ 30 s and ≤ 4 GB peak RSS at
``--trials 10000000`` (50M tool calls). Synthetic data: 10 agents × 20 datasets × 50 queries ×
``trials / 10,000`` trials each, ``--calls-per-trial`` (5) tool calls per trial drawn from
realistic argument templates (SQL with joins / LIKE / catalog queries / SELECT * LIMIT, Mongo
finds with and without filters and $regex, Python with regexes / string surgery / substring
tests, list_db, return_answer), 2 model calls per trial in ``llm_calls``, verdicts in
``scores.parquet``. A child process writes them chunk by chunk (``--chunk`` trials) as the
run's ``trials/*.parquet`` and ``score/scores.parquet``, laid out as querylab writes them
(sorted by trial key, row groups of :data:`tasks.core.batching.COMBINE_ROW_GROUP` rows:
:func:`tasks.trials.stage.combine_trials`, :func:`tasks.scoring.stage.score_run`); this
process then computes each table the way :func:`tasks.report.stage.compute_report_tables`
does: trials and scores loaded by streaming scans, paired by position
(:func:`tasks.report.loaders.load_report_trials`: the columns the tables read, low-cardinality
ones categorical, answers and errors as two booleans), ``llm_calls`` scanned for the cost table,
``tool_calls`` never loaded (each table streams a lazy scan of it), the failure labels
streamed slice by slice into ``report/failure_labels.parquet`` and the failure-mode table
counted from that file (:func:`tasks.report.stage.write_failure_labels`). Times include the
reads and that write; the peak RSS is this process's (generation excluded).

Usage: ``.venv/bin/python bench/report_scale.py [--trials N] [--calls-per-trial 5]
[--data-dir DIR]`` (``--data-dir`` keeps the generated run and reuses it next time). The last line
is the figure: the slowest table's seconds, and the peak RSS.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import sys
import time
from pathlib import Path

import numpy as np
import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tasks.core.batching import COMBINE_ROW_GROUP
from tasks.report.failure_modes import requirements_from_manifests
from tasks.report.features import tool_calls_with_features
from tasks.report.metrics import (
    cost_table,
    pass_at_1_ci,
    pass_at_k_per_query,
    pass_at_k_summary,
    pass_at_k_wide,
)
from tasks.report.tool_use import tool_use_table

N_AGENTS, N_DATASETS, N_QUERIES = 10, 20, 50

#: (tool, template, weight). Slots: "@q" the trial's query number (a required table / collection
#: of that query, or a random other one), "@p" its database number + 1 (the query's Mongo
#: database), "@n" a random number up to 10⁹ (so nearly every call's text is unique).
TEMPLATES: list[tuple[str, str, float]] = [
    ("list_db", json.dumps({"db": "db_@q"}), 0.08),
    ("query_db", json.dumps({"db": "db_@q", "query": "SELECT * FROM t_@q LIMIT 5"}), 0.08),
    (
        "query_db",
        json.dumps(
            {
                "db": "db_@q",
                "query": "SELECT column_name, data_type FROM information_schema.columns "
                "WHERE table_name = 't_@q'",
            }
        ),
        0.04,
    ),
    (
        "query_db",
        json.dumps(
            {
                "db": "db_@q",
                "query": "SELECT a.omdb_key, b.box_office_usd FROM t_@q a JOIN revenue b "
                "ON split_part(a.omdb_key, ':', 2) = b.film_id WHERE b.box_office_usd > @n",
            }
        ),
        0.14,
    ),
    (
        "query_db",
        json.dumps(
            {
                "db": "db_@q",
                "query": "SELECT listing, company FROM t_@q WHERE profile LIKE '%Technology%' "
                "AND founded > @n",
            }
        ),
        0.08,
    ),
    (
        "query_db",
        json.dumps(
            {
                "db": "db_@q",
                "query": "SELECT date, adj_close FROM t_@q WHERE year(date) = @n ORDER BY date",
            }
        ),
        0.08,
    ),
    (
        "query_db",
        json.dumps(
            {
                "db": "db_@p",
                "query": json.dumps(
                    {
                        "collection": "c_@q",
                        "find": {"year": {"$gte": 1990}},
                        "projection": {"film_ref": 1, "_id": 0},
                    }
                ).replace("1990", "@n"),
            }
        ),
        0.10,
    ),
    (
        "query_db",
        json.dumps(
            {"db": "db_@p", "query": json.dumps({"collection": "c_@q", "find": {}, "limit": 5})}
        ),
        0.04,
    ),
    (
        "query_db",
        json.dumps(
            {
                "db": "db_@p",
                "query": json.dumps(
                    {"collection": "c_@q", "find": {"synopsis": {"$regex": "Horror"}, "year": 1999}}
                ).replace("1999", "@n"),
            }
        ),
        0.06,
    ),
    (
        "execute_python",
        json.dumps(
            {
                "code": (
                    "import re\nids = {int(r['film_ref'][2:]) for r in var_call_1}\n"
                    "wins = [int(re.search(r'Won (\\d+) Oscar', r['awards']).group(1))\n"
                    "        for r in var_call_2]\n"
                    "print(sum(w for w in wins if w >= @n))\n"
                )
            }
        ),
        0.08,
    ),
    (
        "execute_python",
        json.dumps(
            {
                "code": (
                    "horror = {int(r['film_ref'][2:]) for r in var_call_1\n"
                    "          if 'Horror' in r['synopsis']}\n"
                    "scores = [r['tomatometer'] for r in var_call_2 "
                    "if int(r['omdb_key'].split(':')[1]) in horror]\n"
                    "print(round(sum(scores) / @n, 2))\n"
                )
            }
        ),
        0.06,
    ),
    (
        "execute_python",
        json.dumps(
            {
                "code": (
                    "import math, statistics\npx = [r['price'] for r in var_call_3]\n"
                    "lr = [math.log(b / a) for a, b in zip(px, px[1:])]\n"
                    "print(round(statistics.stdev(lr) * math.sqrt(@n) * 100, 2))\n"
                )
            }
        ),
        0.06,
    ),
    ("return_answer", json.dumps({"answer": "The answer is @n."}), 0.10),
]


def _fill(template: str, slots: dict[str, pl.Expr]) -> pl.Expr:
    parts = re.split(r"(@[a-z])", template)
    return pl.concat_str(
        [slots[p[1]].cast(pl.String) if p.startswith("@") else pl.lit(p) for p in parts if p]
    )


def synthetic_run(n_trials: int, n_calls: int, seed: int = 7, offset: int = 0,
                  total: int | None = None):
    """(trials, tool_calls, llm_calls, manifests) frames of the shapes querylab writes: trials
    ``offset`` .. ``offset + n_trials`` of a run of ``total`` (default ``n_trials``) trials,
    so a large run is made chunk by chunk with distinct trial keys."""
    rng = np.random.default_rng(seed)
    per_query = max(1, (total or n_trials) // (N_AGENTS * N_DATASETS * N_QUERIES))
    idx = np.arange(offset, offset + n_trials)
    trial = idx % per_query
    q = (idx // per_query) % N_QUERIES
    d = (idx // (per_query * N_QUERIES)) % N_DATASETS
    a = (idx // (per_query * N_QUERIES * N_DATASETS)) % N_AGENTS
    skill = rng.uniform(0.05, 0.95, N_AGENTS * N_DATASETS * N_QUERIES)
    correct = rng.uniform(size=n_trials) < skill[(a * N_DATASETS + d) * N_QUERIES + q]
    reasons = np.array(["return_answer", "no_tool_call", "max_iterations", "api_error"])
    reason = reasons[rng.choice(4, size=n_trials, p=[0.9, 0.04, 0.04, 0.02])]
    reason[correct] = "return_answer"
    trials = (
        pl.DataFrame(
            {
                "run_id": pl.Series(["bench"] * n_trials),
                "agent": pl.Series(a).cast(pl.String),
                "dataset": pl.Series(d).cast(pl.String),
                "query_id": pl.Series(q).cast(pl.String),
                "trial": pl.Series(trial, dtype=pl.Int32),
                "is_correct": correct,
                "terminate_reason": reason,
                "n_llm_calls": pl.Series(rng.integers(1, 30, n_trials), dtype=pl.Int32),
                "n_tool_calls": pl.Series(rng.integers(0, 10, n_trials), dtype=pl.Int32),
                "prompt_tokens": rng.integers(1_000, 200_000, n_trials),
                "completion_tokens": rng.integers(100, 20_000, n_trials),
                "cached_tokens": rng.integers(0, 1_000, n_trials),
                "cost_usd": rng.uniform(0, 0.5, n_trials),
                "latency_s": rng.gamma(2.0, 20.0, n_trials),
            }
        )
        .with_columns(
            ("openai:model-" + pl.col("agent")).alias("agent"),
            # zero-padded, so that generation order is key order: the trials stage's artifacts
            # are sorted by trial key (tasks.trials.stage.combine_trials)
            ("ds" + pl.col("dataset").str.zfill(2)).alias("dataset"),
            ("q" + pl.col("query_id").str.zfill(2)).alias("query_id"),
        )
        .with_columns(
            pl.concat_str(
                ["agent", "dataset", "query_id", pl.col("trial").cast(pl.String).str.zfill(6)],
                separator="|",
            ).alias("trial_key"),
            pl.when(pl.col("terminate_reason") == "api_error")
            .then(pl.lit("APIError: 500"))
            .alias("error"),
            pl.when(pl.col("terminate_reason") != "api_error").then(pl.lit("42")).alias("answer"),
            # the score step's verdicts: api_error trials are errored (out of every denominator)
            pl.when(pl.col("terminate_reason") == "api_error").then(pl.lit("errored"))
            .when(pl.col("is_correct")).then(pl.lit("correct"))
            .otherwise(pl.lit("incorrect")).alias("verdict"),
        )
    )
    call_trial = np.sort(rng.integers(0, n_trials, n_calls))
    weights = np.array([w for *_, w in TEMPLATES])
    tmpl = rng.choice(len(TEMPLATES), size=n_calls, p=weights / weights.sum())
    calls = pl.DataFrame(
        {
            "row": np.arange(n_calls),
            "t": call_trial,
            "tmpl": tmpl,
            "n": rng.integers(1, 1_000_000_000, n_calls),
            "on_target": rng.uniform(size=n_calls) < 0.85,
            "other": rng.integers(0, N_QUERIES, n_calls),
        }
    ).with_columns(
        pl.int_range(pl.len()).over("t").cast(pl.Int32).alias("call_index"),
        pl.when("on_target").then(pl.Series(q[call_trial])).otherwise("other").alias("q"),
    )
    parts = []
    for i, (tool, template, _) in enumerate(TEMPLATES):
        parts.append(
            calls.filter(pl.col("tmpl") == i).with_columns(
                pl.lit(tool).alias("tool"),
                _fill(template, {"q": pl.col("q"), "p": pl.col("q") + 1, "n": pl.col("n")}).alias(
                    "arguments"
                ),
            )
        )
    keys = trials.select("trial_key").with_row_index("t")
    tool_calls = (
        pl.concat(parts)
        .sort("row")
        .with_columns(pl.col("t").cast(pl.UInt32))
        .join(keys, on="t", how="left")
        .select(
            pl.lit("bench").alias("run_id"),
            "trial_key",
            "call_index",
            (pl.col("call_index") * 2 // 3).cast(pl.Int32).alias("turn"),
            ("call_" + pl.col("call_index").cast(pl.String)).alias("call_id"),
            "tool",
            "arguments",
            (pl.col("n") % 10 != 0).alias("success"),
            pl.lit(None, pl.String).alias("error"),
            (pl.col("n") % 10_000).cast(pl.Int64).alias("result_size"),
            (pl.col("n") % 1000 / 100.0).alias("duration_s"),
        )
    )
    llm_calls = trials.select(
        "run_id",
        "trial_key",
        pl.lit("m").alias("model"),
    ).join(pl.DataFrame({"call_index": [0, 1]}, schema={"call_index": pl.Int32}), how="cross")
    llm_calls = llm_calls.with_columns(
        pl.Series("cache_hit", rng.uniform(size=llm_calls.height) < 0.3),
        pl.Series("attempts", rng.integers(1, 3, llm_calls.height), dtype=pl.Int32),
    )
    manifests = [
        {
            "name": f"ds{di:02d}",
            "databases": {f"db_{x}": {} for x in range(N_QUERIES + 1)},
            "queries": [
                {
                    "id": f"q{qi:02d}",
                    "requires": {
                        "sources": [f"db_{qi}.t_{qi}", f"db_{qi + 1}.c_{qi}"],
                        "operations": [
                            "join_reformatted_key",
                            "extract_from_text",
                            "use_adjusted_close",
                        ][: 1 + qi % 3],
                    },
                }
                for qi in range(N_QUERIES)
            ],
        }
        for di in range(N_DATASETS)
    ]
    return trials, tool_calls, llm_calls, manifests


def _timed(label: str, fn, repeat: int) -> tuple[float, object]:
    """Best wall time of ``repeat`` runs of ``fn`` (the machine is shared and noisy; the best
    run is the one least disturbed), printed with every run's wall and CPU seconds."""
    walls, cpus, out = [], [], None
    for _ in range(repeat):
        gc.collect()
        w, c = time.perf_counter(), time.process_time()
        out = fn()
        walls.append(time.perf_counter() - w)
        cpus.append(time.process_time() - c)
    import resource

    runs = ", ".join(f"{w:.2f}" for w in walls)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"{label:<24} best {min(walls):5.2f} s  (runs: {runs}; CPU {min(cpus):.2f} s; "
          f"peak RSS so far {peak:.2f} GB)", flush=True)
    return min(walls), out


def _conform(df: pl.DataFrame, schema) -> "pa.Table":
    """``df`` as an Arrow table of ``schema`` (what querylab writes): columns it lacks are
    nulls, or zeros / empty strings where the schema forbids nulls."""
    import pyarrow as pa

    from schemas.artifacts import check_schema

    table = df.to_arrow()
    for f in schema:
        if f.name in table.column_names:
            continue
        if f.nullable:
            col = pa.nulls(table.num_rows, f.type)
        else:
            default = {pa.string(): "", pa.bool_(): False, pa.float64(): 0.0}.get(f.type, 0)
            col = pa.array([default] * table.num_rows, f.type)
        table = table.append_column(f.name, col)
    return check_schema(table, schema, "synthetic").replace_schema_metadata(schema.metadata)


def write_run(root: str, n_trials: int, calls_per_trial: int, chunk: int,
              stored_features: bool = True) -> None:
    """Write a synthetic run ``bench`` of ``n_trials`` trials (``calls_per_trial`` tool calls
    and 2 model calls each, verdicts in ``score/scores.parquet``) under artifact root ``root``,
    ``chunk`` trials at a time (memory stays at one chunk's), plus the
    datasets' requirements in ``manifests.json`` beside it. ``tool_calls`` gets its stored
    per-call features the way the trials stage writes them
    (:func:`tasks.report.features.tool_calls_with_features`), unless ``stored_features`` is
    False (an artifact from before them: the report then parses the calls itself)."""
    import pyarrow.parquet as pq

    from schemas import artifacts
    from tasks.core import storage
    from tasks.report.loaders import _trials_uri
    from tasks.scoring.stage import scores_uri

    outs = {
        "trials": (_trials_uri(root, "bench", "trials"), artifacts.TRIALS),
        "tool_calls": (_trials_uri(root, "bench", "tool_calls"), artifacts.TOOL_CALLS),
        "llm_calls": (_trials_uri(root, "bench", "llm_calls"), artifacts.LLM_CALLS),
        "scores": (scores_uri(root, "bench"), artifacts.SCORES),
    }
    writers = {}
    for uri, schema in outs.values():
        Path(uri).parent.mkdir(parents=True, exist_ok=True)
        writers[uri] = pq.ParquetWriter(uri, schema.with_metadata(schema.metadata),
                                        compression="zstd")
    manifests = None
    for i, offset in enumerate(range(0, n_trials, chunk)):
        n = min(chunk, n_trials - offset)
        trials, calls, llm, manifests = synthetic_run(n, n * calls_per_trial, seed=7 + i,
                                                      offset=offset, total=n_trials)
        scores = trials.with_columns(
            pl.when(pl.col("verdict") != "errored").then("is_correct").alias("is_correct"),
            pl.lit("bench").alias("scorer_version"),
            pl.lit(0, pl.Int32).alias("audit_flags"),
        )
        for name, df in (("trials", trials), ("tool_calls", calls), ("llm_calls", llm),
                         ("scores", scores)):
            uri, schema = outs[name]
            table = _conform(df, schema)
            if name == "tool_calls" and stored_features:  # what the trials stage writes
                table = tool_calls_with_features(table)
            writers[uri].write_table(table, row_group_size=COMBINE_ROW_GROUP)
        del trials, calls, llm, scores
        gc.collect()
    for w in writers.values():
        w.close()
    storage.write_json(str(Path(root) / "manifests.json"), manifests)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=1_000_000)
    p.add_argument("--calls-per-trial", type=int, default=5)
    p.add_argument("--chunk", type=int, default=500_000, help="trials generated at a time")
    p.add_argument("--repeat", type=int, default=1, help="runs per table (best is reported)")
    p.add_argument("--old-artifacts", action="store_true",
                   help="write tool_calls without the stored per-call features (as before "
                   "they existed): times the report's fallback path")
    p.add_argument("--data-dir", metavar="DIR",
                   help="keep the synthetic run in DIR and reuse it on later runs with the same "
                   "--trials / --calls-per-trial / --old-artifacts (generating 10M trials takes "
                   "minutes); without it a temporary directory is written and removed")
    p.add_argument("--generate", metavar="ROOT", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.generate:  # the child process: write the synthetic run and exit
        write_run(args.generate, args.trials, args.calls_per_trial, args.chunk,
                  stored_features=not args.old_artifacts)
        return

    import resource
    import shutil
    import subprocess
    import tempfile

    from tasks.core import storage
    from tasks.report.loaders import load_report_trials, scan_llm_calls, scan_tool_calls
    from tasks.report.stage import write_failure_labels

    keep = args.data_dir is not None
    root = args.data_dir or tempfile.mkdtemp(prefix="querylab-bench-report-")
    # what the kept run was generated with: reused only when it matches
    params = {"trials": args.trials, "calls_per_trial": args.calls_per_trial,
              "old_artifacts": args.old_artifacts, "layout": "sorted, 65536-row groups"}
    marker = Path(root) / "bench-params.json"
    try:
        start = time.perf_counter()
        if keep and marker.exists() and json.loads(marker.read_text()) == params:
            verb = "reused from " + root
        else:
            if keep:
                shutil.rmtree(root, ignore_errors=True)
                Path(root).mkdir(parents=True)
            # written by a child process, so this process's peak RSS is the report's alone
            subprocess.run([sys.executable, __file__, "--generate", root, "--trials",
                            str(args.trials), "--calls-per-trial", str(args.calls_per_trial),
                            "--chunk", str(args.chunk),
                            *(["--old-artifacts"] if args.old_artifacts else [])], check=True)
            marker.write_text(json.dumps(params))
            verb = f"written in {time.perf_counter() - start:.1f} s"
        size = sum(f.stat().st_size for f in Path(root).rglob("*.parquet")) / 2**30
        print(f"synthetic run: {args.trials:,} trials, {args.trials * args.calls_per_trial:,} "
              f"tool calls, {2 * args.trials:,} llm calls {verb} ({size:.2f} GiB of Parquet)")
        manifests = storage.read_json(str(Path(root) / "manifests.json"))
        requirements = requirements_from_manifests(manifests)
        r = args.repeat
        times = {}
        times["load trials + scores"], trials = _timed(
            "load trials + scores", lambda: load_report_trials(root, "bench"), r)
        calls = scan_tool_calls(root, "bench")  # lazy: each table streams the file

        def passk():
            per_query = pass_at_k_per_query(trials)
            summary = pass_at_k_summary(per_query)
            return (
                per_query,
                pass_at_k_wide(summary),
                pass_at_k_wide(summary, "pass_hat_k"),
                pass_at_1_ci(trials),
            )

        labels_uri = str(Path(root) / "report" / "failure_labels.parquet")

        def failures():  # as the report stage does: labels streamed to their artifact
            return write_failure_labels(trials, calls, requirements, labels_uri)

        times["pass@k + pass^k + CI"], (per_query, *_) = _timed("pass@k + pass^k + CI", passk, r)
        times["cost"], cost = _timed(
            "cost (llm_calls)", lambda: cost_table(trials, scan_llm_calls(root, "bench")), r)
        times["failure modes"], (n_labels, fm) = _timed("failure modes", failures, r)
        times["tool use"], tu = _timed("tool use", lambda: tool_use_table(trials, calls), r)
    finally:
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
    print(
        f"rows: pass@k {per_query.height:,}, cost {cost.height}, failure labels "
        f"{n_labels:,}, tool use {tu.height}"
    )
    print(
        "failure modes (all agents):",
        fm.filter(pl.col("dataset") == "ALL")
        .select("FM1", "FM2", "FM3", "FM4", "FM5")
        .sum()
        .to_dicts()[0],
    )
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"machine: {os.cpu_count()} CPUs, load average {load}")
    rss_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    slowest = max(times, key=times.get)
    print(
        f"report_scale: slowest table {times[slowest]:.2f} s ({slowest}, best of {r}) for "
        f"{trials.height:,} trials / {args.trials * args.calls_per_trial:,} tool calls"
        f"{' (old artifacts: fallback path)' if args.old_artifacts else ''}; peak "
        f"RSS {rss_gb:.2f} GB (targets: <= 3 s per table at 1M trials, <= 30 s and <= 4 GB at "
        "10M)"
    )


if __name__ == "__main__":
    main()
