"""``querylab text2sql ...``: SQL features and complexity, TPC-DS generation, Spider EX.

Subcommands (paths default to the shared data directory ``<project>/../shared/data`` when it
exists; pass them explicitly elsewhere):

- ``features SQL [--dialect D]`` — print one query's features as JSON;
- ``complexity`` — features of TPC-DS + Spider + BIRD gold queries, the complexity table and the
  six histograms (``--corpus NAME=PATH`` adds/replaces corpora, ``--no-tpcds`` drops TPC-DS);
- ``generate --model SPEC ...`` — TPC-DS generation with EXPLAIN validation and retries
  (``oracle``, ``openai:<model>``, ``replay:<dir or .jsonl>``) and the paper's tables;
- ``score-spider --predictions FILE`` — execution accuracy on the Spider dev databases.
"""

from __future__ import annotations

import argparse
import json
import sys

from querylab import run_id_or_new, shared_data_path


def _pairs(values: list[str] | None, what: str) -> dict[str, str]:
    out = {}
    for v in values or []:
        name, sep, rest = v.partition("=")
        if not sep or not name or not rest:
            raise SystemExit(f"querylab text2sql: {what} must be NAME=VALUE, got {v!r}")
        out[name] = rest
    return out


def cmd_features(args: argparse.Namespace) -> int:
    from tasks.text2sql.sql_features import SQLFeatureError, extract_features

    try:
        feats = extract_features(args.sql, args.dialect)
    except SQLFeatureError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(feats.as_row(), indent=2))
    return 0


def cmd_complexity(args: argparse.Namespace) -> int:
    from flows.text2sql import sql_complexity

    corpora: dict[str, dict] = {}
    if not args.no_tpcds:
        corpora["tpcds"] = {"name": "tpcds"}
    defaults = {
        "spider": shared_data_path("sql_corpora/spider_dev_gold.sql"),
        "bird": shared_data_path("sql_corpora/bird_dev_gold.sql"),
    }
    given = _pairs(args.corpus, "--corpus")
    for name, path in {**{k: v for k, v in defaults.items() if v}, **given}.items():
        corpora[name] = {"name": name, "path": path}
    tables = _pairs(args.tables_json, "--tables-json")
    if (
        "spider" in corpora
        and "spider" not in tables
        and "spider" not in given
        and shared_data_path("spider/tables.json")
    ):
        tables["spider"] = shared_data_path("spider/tables.json")
    for name, dialect in _pairs(args.dialect, "--dialect").items():
        if name not in corpora:
            raise SystemExit(f"querylab text2sql: --dialect for unknown corpus {name!r}")
        corpora[name]["dialect"] = dialect
    for name, path in tables.items():
        if name in corpora:
            corpora[name]["tables_json"] = path
    if not corpora:
        print("no corpora: give --corpus NAME=PATH", file=sys.stderr)
        return 2
    run_id = run_id_or_new(args.run_id)
    print(f"querylab text2sql complexity {run_id}: corpora {list(corpora)}")
    out = sql_complexity(run_id, list(corpora.values()), artifacts_root=args.artifacts)
    print("\nMean per query")
    print(out["table"])
    if any(out["parse_errors"].values()):
        print(f"\nqueries sqlglot could not read: {out['parse_errors']}")
    print(f"\ntable:      {out['complexity']}\nreport:     {out['markdown']}")
    for uri in out["histograms"].values():
        print(f"histogram:  {uri}")
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    from flows.text2sql import text2sql_generation

    if not args.descriptions:
        print("--descriptions is required (TPC-DS business questions JSON)", file=sys.stderr)
        return 2
    config = {
        "max_retries": args.max_retries,
        "temperature": args.temperature,
        "cache": args.cache,
    }
    run_id = run_id_or_new(args.run_id)
    models = args.model or ["oracle"]
    print(f"querylab text2sql generate {run_id}: models {models}")
    out = text2sql_generation(
        run_id,
        models,
        args.descriptions,
        query_ids=args.query or None,
        config=config,
        batch_size=args.batch_size,
        artifacts_root=args.artifacts,
    )
    for title, key in (
        ("Successful queries", "success"),
        ("Normalised mean feature counts", "normalised_means"),
        ("Jaccard similarity to gold", "jaccard"),
    ):
        print(f"\n{title}\n{out['tables'][key]}")
    print(f"\ngenerations: {out['generations']}\nreport:      {out['markdown']}")
    return 0


def cmd_score_spider(args: argparse.Namespace) -> int:
    from flows.text2sql import spider_ex

    for flag, value in (("--gold", args.gold), ("--spider-dir", args.spider_dir)):
        if not value:
            print(f"{flag} is required (no shared data directory found)", file=sys.stderr)
            return 2
    run_id = run_id_or_new(args.run_id)
    out = spider_ex(
        run_id,
        args.predictions,
        args.gold,
        args.spider_dir,
        args.db_dir,
        artifacts_root=args.artifacts,
    )
    ex = "n/a" if out["ex"] is None else f"{out['ex']:.4f}"
    print(f"execution accuracy (EX): {ex} ({out['n_correct']}/{out['n_scored']} scored queries)")
    print(f"by status: {out['by_status']}")
    if out["excluded"]:
        print(f"left out of EX ({out['n_excluded']}):")
        for e in out["excluded"]:
            print(f"  {e['db_id']}/{e['query_id']}: {e['status']} ({e['error']})")
    print(f"scores: {out['scores']}")
    return 0


def register(subparsers) -> None:
    """Add ``text2sql`` and its subcommands to the ``querylab`` argparse ``subparsers``."""
    t = subparsers.add_parser(
        "text2sql", help="text-to-SQL: features, complexity, generation, Spider EX"
    )
    sub = t.add_subparsers(dest="text2sql_command", required=True)

    f = sub.add_parser("features", help="print the features of one SQL query as JSON")
    f.add_argument("sql")
    f.add_argument("--dialect", default="postgres", help="sqlglot dialect (default postgres)")
    f.set_defaults(func=cmd_features)

    c = sub.add_parser("complexity", help="TPC-DS vs Spider vs BIRD complexity table + histograms")
    c.add_argument(
        "--corpus",
        action="append",
        metavar="NAME=PATH",
        help="a SQL<TAB>db_id file (default: spider and bird from the shared data)",
    )
    c.add_argument(
        "--dialect",
        action="append",
        metavar="NAME=DIALECT",
        help="sqlglot dialect of a corpus (default: spider=mysql, others sqlite)",
    )
    c.add_argument(
        "--tables-json",
        action="append",
        metavar="NAME=PATH",
        help="Spider-format tables.json of a corpus (column attribution)",
    )
    c.add_argument("--no-tpcds", action="store_true", help="leave the TPC-DS gold queries out")
    c.add_argument("--run-id")
    c.add_argument("--artifacts", help="artifact root (default: $QUERYLAB_ARTIFACTS)")
    c.set_defaults(func=cmd_complexity)

    g = sub.add_parser("generate", help="TPC-DS text-to-SQL with EXPLAIN validation and retries")
    g.add_argument(
        "--model",
        action="append",
        help="oracle (default) | openai:<model> | replay:<dir or .jsonl>; repeat",
    )
    g.add_argument(
        "--descriptions",
        default=shared_data_path("tpcds/business_questions.json"),
        help="TPC-DS business questions JSON",
    )
    g.add_argument("--query", action="append", help="TPC-DS query number (default: all 99); repeat")
    g.add_argument("--max-retries", type=int, default=3)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument(
        "--cache",
        choices=["on", "off", "refresh"],
        default="on",
        help="shared LLM response cache under <artifacts>/cache/llm: on (default), off, refresh "
        "(prices of openai:<model> come from the models table: `querylab models`)",
    )
    g.add_argument("--batch-size", type=int, default=10, help="queries per mapped task")
    g.add_argument("--run-id", help="reuse a run id to resume it (finished batches are skipped)")
    g.add_argument("--artifacts", help="artifact root (default: $QUERYLAB_ARTIFACTS)")
    g.set_defaults(func=cmd_generate)

    s = sub.add_parser("score-spider", help="execution accuracy of Spider predictions")
    s.add_argument(
        "--predictions",
        required=True,
        help="one SQL per line in gold order (optionally SQL<TAB>db_id), or .jsonl",
    )
    s.add_argument(
        "--gold",
        default=shared_data_path("sql_corpora/spider_dev_gold.sql"),
        help="SQL<TAB>db_id gold file",
    )
    s.add_argument(
        "--spider-dir",
        default=shared_data_path("spider/databases"),
        help="directory of <db_id>/schema.sql + data/*.csv",
    )
    s.add_argument(
        "--db-dir", help="where to build the SQLite files (default $QUERYLAB_HOME/spider)"
    )
    s.add_argument("--run-id")
    s.add_argument("--artifacts", help="artifact root (default: $QUERYLAB_ARTIFACTS)")
    s.set_defaults(func=cmd_score_spider)
