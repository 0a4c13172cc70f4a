"""``querylab equivalence``: judge SQL query pairs (execution match, counterexample finder, LLM
judges) and print the study's tables; ``find`` searches one pair for a counterexample."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _budget_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("counterexample finder budget")
    g.add_argument("--max-instances", type=int, default=1000,
                   help="database instances to try per pair (default 1000)")
    g.add_argument("--time-limit", type=float, default=10.0,
                   help="seconds of search per pair (default 10)")
    g.add_argument("--max-rows", type=int, default=4,
                   help="rows per table of the random instances (default 4)")
    g.add_argument("--row-budget", type=int, default=64,
                   help="rows in one table at most for the instances the predicates ask for "
                        "(HAVING COUNT(*) > 10 wants 11; default 64)")
    g.add_argument("--seed", type=int, default=0, help="seed of the instance generator")
    m = p.add_argument_group("result comparison")
    m.add_argument("--set", dest="bag", action="store_false",
                   help="compare results as sets (default: bags, duplicates count)")
    m.add_argument("--order", choices=["auto", "always", "never"], default="auto",
                   help="row order: auto = only when both queries have ORDER BY")
    m.add_argument("--no-permute-columns", dest="permute_columns", action="store_false",
                   help="columns must be in the same order")


def _options(args: argparse.Namespace) -> dict:
    opts = {
        "match": {"bag": args.bag, "order": args.order, "permute_columns": args.permute_columns},
        "budget": {"max_instances": args.max_instances, "time_limit_s": args.time_limit,
                   "max_rows": args.max_rows, "row_budget": args.row_budget, "seed": args.seed},
    }
    if getattr(args, "cache", None):
        opts["judge"] = {"cache": args.cache}
    if getattr(args, "db_root", None):
        opts["db_root"] = args.db_root
    from pydantic import ValidationError

    from schemas.equivalence import EquivalenceOptions

    try:
        return EquivalenceOptions.model_validate(opts).model_dump(mode="json")
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(x) for x in first["loc"])
        raise SystemExit(f"bad option {loc}: {first['msg']}")


def cmd_run(args: argparse.Namespace) -> int:
    from flows.equivalence import DEFAULT_METHODS, equivalence
    from querylab import run_id_or_new
    from schemas.settings import Settings
    from tasks.equivalence.methods import parse_method
    from tasks.equivalence.pairs import PairsError, load_pairs

    methods = args.method or DEFAULT_METHODS
    try:
        for m in methods:
            parse_method(m)
        pairs = load_pairs(args.pairs)
    except (ValueError, PairsError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    options = _options(args)
    root = args.artifacts or Settings.from_env().artifacts
    run_id = run_id_or_new(args.run_id)
    print(f"querylab equivalence {run_id}: {len(pairs)} pairs × {len(methods)} methods "
          f"({', '.join(methods)}), artifacts in {root}", flush=True)
    out = equivalence(run_id=run_id, pairs_path=str(args.pairs), methods=methods,
                      options=options, batch_size=args.batch_size, artifacts_root=root)
    print()
    print(out["tables"]["text"])
    print(f"equivalence: {out['equivalence']}\nreport:      {out['tables']['markdown']}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from schemas.settings import Settings
    from tasks.equivalence.tables import equivalence_tables
    from tasks.core.storage import StorageError

    root = args.artifacts or Settings.from_env().artifacts
    try:
        out = equivalence_tables.fn(args.run_id, root)
    except StorageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(out["text"])
    print(f"report: {out['markdown']}")
    return 0


def _schema_arg(text: str) -> str | dict:
    """``--schema``: a DDL file, the JSON mapping form, or DDL text. Raises ValueError with a
    one-line message for JSON that does not parse."""
    candidate = text.strip()
    if candidate and "\n" not in candidate and len(candidate) < 1024 and not candidate.startswith("{"):
        try:
            path = Path(candidate).expanduser()
            if path.is_file():
                return path.read_text()
        except OSError:
            pass  # not a usable path (too long, ...): DDL text
    if candidate.startswith("{"):
        try:
            return json.loads(candidate)
        except json.JSONDecodeError as exc:
            raise ValueError(f"--schema: not valid JSON for the mapping form ({exc.msg} at line "
                             f"{exc.lineno} column {exc.colno})") from None
    return text


def cmd_find(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from schemas.equivalence import EquivalenceOptions, QueryPair
    from tasks.equivalence.counterexample import find_counterexample
    from tasks.equivalence.pairs import PairsError, load_pairs, pair_schema
    from tasks.equivalence.instances import SchemaError

    options = EquivalenceOptions.model_validate(_options(args))
    try:
        if args.pairs:
            pairs = {p.id: p for p in load_pairs(args.pairs)}
            if args.id not in pairs:
                print(f"error: no pair {args.id!r} in {args.pairs}", file=sys.stderr)
                return 2
            pair = pairs[args.id]
        else:
            if not (args.schema and args.sql1 and args.sql2):
                print("error: give --pairs FILE --id ID, or --schema, --sql1 and --sql2",
                      file=sys.stderr)
                return 2
            schema = _schema_arg(args.schema)
            pair = QueryPair.model_validate({"id": "cli", "sql1": args.sql1, "sql2": args.sql2,
                                             "schema": schema, "dialect": args.dialect,
                                             "schema_dialect": args.schema_dialect})
        rel = pair_schema(pair, options.db_root)
    except ValidationError as exc:
        first = exc.errors()[0]
        print(f"error: {'.'.join(str(x) for x in first['loc'])}: {first['msg']}", file=sys.stderr)
        return 2
    except (PairsError, SchemaError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    res = find_counterexample(pair.sql1, pair.sql2, rel, dialect=pair.dialect,
                              budget=options.budget, match=options.match)
    print(f"verdict: {res.verdict}")
    print(res.summary())
    for reading in res.readings:
        print(f"reading: {reading}")
    for problem in res.type_errors:
        print(f"type error: {problem}")
    if res.verdict == "nondeterministic" or (res.choices and res.verdict != "not_equivalent"):
        for choice in res.choices:
            print(f"arbitrary choice: {choice}")
    for note in res.notes:
        print(f"note: {note}")
    if res.counterexample:
        print(f"verified: {res.verified}" + (f" ({res.verify_error})" if res.verify_error else ""))
        print(f"separated by an instance of {res.rows_before_shrink} row(s) ({res.found_by}), "
              f"shrunk to {res.rows}")
        print("\n-- counterexample (minimal) --")
        print(res.counterexample)
    if res.error_script:
        print("\n-- a minimal database on which one query fails (not a counterexample) --")
        print(res.error_script)
    limit = ", time limit reached" if res.hit_time_limit else ""
    print(f"instances tried: {res.instances_tried}, seconds: {res.seconds:.2f}{limit}, "
          f"engine: {res.engine}")
    return 1 if res.verdict == "error" else 0


def register(subparsers) -> None:
    """Add ``equivalence`` (``run``, ``report``, ``find``) to the ``querylab`` CLI."""
    eq = subparsers.add_parser("equivalence", help="SQL equivalence: execution match, "
                               "counterexample finder, LLM judges")
    sub = eq.add_subparsers(dest="equivalence_command", required=True)

    r = sub.add_parser(
        "run", help="judge every pair of a JSONL file with every method",
        description="Judge every pair of a JSONL file with every method. Pairs: one JSON object "
        "a line, {id, sql1, sql2, schema, dialect, schema_dialect, db, label, hardness}: schema is "
        "DDL text (any dialect) or the mapping form {table: {columns: {name: type}, primary_key, "
        "unique, not_null, foreign_keys}}; label is equivalent / not_equivalent (also "
        "inequivalent, true/false) or {semantic: .., relaxed: ..}. exec_match needs db: it runs "
        "both queries on that database (a SQLite/DuckDB file, a postgresql:// URL, or a name "
        "under --db-root) and is 'skipped' for pairs without one; the finder needs only the "
        "schema (or a db to read it from).")
    r.add_argument("pairs", help="pairs JSONL: {id, sql1, sql2, schema, dialect, db, label, hardness}")
    r.add_argument("--method", action="append",
                   help="exec_match (needs the pair's db) | finder | "
                        "judge:<technique>:<notion>:<model>; repeat (default: exec_match and finder)")
    r.add_argument("--db-root", help="directory where database names in 'db' are looked up "
                   "(db: the database execution match runs both queries on)")
    r.add_argument("--run-id", help="reuse a run id to resume it (default: a new one)")
    r.add_argument("--artifacts", help="artifact root (default: $QUERYLAB_ARTIFACTS)")
    r.add_argument("--batch-size", type=int, default=20, help="pairs per mapped task")
    r.add_argument("--cache", choices=["on", "off", "refresh"],
                   help="judges' shared LLM response cache under <artifacts>/cache/llm "
                        "(default: on); judge prices come from the models table "
                        "(`querylab models`)")
    _budget_args(r)
    r.set_defaults(func=cmd_run)

    rp = sub.add_parser("report", help="recompute a run's equivalence tables from its artifacts "
                        "(--run-id: the id `run` printed)")
    rp.add_argument("--run-id", required=True, help="the run's id (printed by `run`)")
    rp.add_argument("--artifacts", help="artifact root (default: $QUERYLAB_ARTIFACTS)")
    rp.set_defaults(func=cmd_report)

    f = sub.add_parser("find", help="search one pair for a minimal counterexample")
    f.add_argument("--pairs", help="a pairs JSONL file (with --id)")
    f.add_argument("--id", help="the pair's id in --pairs")
    f.add_argument("--schema", help="DDL text, a DDL file, or the JSON mapping form")
    f.add_argument("--sql1")
    f.add_argument("--sql2")
    f.add_argument("--dialect", default="duckdb",
                   help="the queries' SQL dialect (sqlglot's names, or ansi / calcite); it "
                        "picks the engine: postgres → a real PostgreSQL server, sqlite → "
                        "SQLite, duckdb → DuckDB, mysql and others → DuckDB approximating them "
                        "(stated in the output)")
    f.add_argument("--schema-dialect",
                   help="the DDL's dialect when it differs (default: detected from the DDL, "
                        "e.g. backticks → mysql, then --dialect)")
    f.add_argument("--db-root", help="directory where database names in 'db' are looked up")
    _budget_args(f)
    f.set_defaults(func=cmd_find)
