"""``querylab lifecycle ...``: the database-lifecycle suite (DBLifeBench).

Subcommands (source paths default to the shared data directory ``<project>/../shared/data``
when it exists; pass them explicitly elsewhere):

- ``run --model SPEC ...`` — generate the items and run every model on every phase; prints the
  main table, the robustness and schema-variant tables and EX vs G-EX; exits 1 when the
  ``oracle`` scores below 1.0 anywhere (an item the reference cannot solve is a generator bug);
- ``items`` — generate (or show) a run's items only and print what each phase holds and dropped;
- ``--rewrite-model openai:<model>`` (``run`` and ``items``) — the optional stage paraphrasing the
  templated design/implementation requirements with a chat model (:mod:`tasks.lifecycle.rewrite`);
- ``report --run-id ID`` — recompute the tables and ``report.md`` from a run's artifacts.
"""

from __future__ import annotations

import argparse
import sys

from querylab import run_id_or_new, shared_data_path


def _config(args: argparse.Namespace) -> dict:
    cfg: dict = {"seed": args.seed, "max_items": args.max_items or None}
    if getattr(args, "db", None):
        cfg["spider_db_ids"] = args.db
    if getattr(args, "no_chinook", False):
        cfg["include_chinook"] = False
    for flag, key in (
        ("table_count", "design_table_counts"),
        ("level", "graph_levels"),
        ("variant", "variants"),
    ):
        value = getattr(args, flag, None)
        if value:
            cfg[key] = value
    for flag, key in (
        ("debug_rounds", "debug_rounds"),
        ("scenarios", "maintenance_scenarios"),
        ("batch_size", "batch_size"),
        ("temperature", "temperature"),
    ):
        value = getattr(args, flag, None)
        if value is not None:
            cfg[key] = value
    if getattr(args, "cache", None):
        cfg["cache"] = args.cache
    return cfg


def _check_sources(args: argparse.Namespace) -> str | None:
    for flag, value in (("--spider-dir", args.spider_dir), ("--questions", args.questions)):
        if not value:
            return f"{flag} is required (no shared data directory found)"
    if not args.no_chinook and not args.chinook:
        return "--chinook is required (or --no-chinook)"
    return None


def _validated(cfg: dict) -> dict | None:
    from pydantic import ValidationError

    from schemas.lifecycle import LifecycleConfig

    try:
        return LifecycleConfig.model_validate(cfg).model_dump(mode="json")
    except ValidationError as e:
        first = e.errors()[0]
        print(
            f"error: {'.'.join(map(str, first['loc'])) or 'config'}: {first['msg']}",
            file=sys.stderr,
        )
        return None


def _print_tables(out: dict) -> None:
    t = out["tables"]
    print("\nMain results (mean over items)")
    print(t["main"])
    for title, key in (
        ("Robustness by perturbation level", "robustness"),
        ("EX across schema variants", "variant_cv"),
        ("Text2SQL EX vs Progressive-Text2SQL", "ex_vs_gex"),
    ):
        print(f"\n{title}\n{t[key]}")
    print(f"\nreport: {out['markdown']}")


def cmd_run(args: argparse.Namespace) -> int:
    from flows.lifecycle import lifecycle
    from tasks.lifecycle.agents import AgentConfigError, check_agent_spec
    from tasks.lifecycle.rewrite import check_rewrite_spec

    problem = _check_sources(args)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    cfg = _validated(_config(args))
    if cfg is None:
        return 2
    models = args.model or ["oracle"]
    try:
        for m in models:
            check_agent_spec(m)
        if args.rewrite_model:
            check_rewrite_spec(args.rewrite_model)
        from tasks.lifecycle.pipeline import check_phases

        phases = check_phases(args.phase)
    except (AgentConfigError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    run_id = run_id_or_new(args.run_id)
    print(f"querylab lifecycle run {run_id}: models {models}, phases {phases}")
    out = lifecycle(
        run_id,
        models,
        args.spider_dir,
        args.questions,
        None if args.no_chinook else args.chinook,
        phases=phases,
        config=cfg,
        artifacts_root=args.artifacts,
        rewrite_model=args.rewrite_model,
    )
    for m in out["items"]:
        dropped = ", ".join(f"{k} {v}" for k, v in m["dropped"].items())
        print(
            f"items {m['phase']}: {m['n_items']}"
            + (f" (dropped: {dropped})" if dropped else "")
            + _rewrite_note(m)
        )
    _print_tables(out)
    oracle = [r for r in out["main_wide"] if r["model"] == "oracle"]
    failed = [
        k for r in oracle for k, v in r.items() if k != "model" and v is not None and v < 1.0 - 1e-9
    ]
    if failed:
        print(f"ORACLE FAILED on {failed}: the generated items there are buggy.")
        return 1
    return 0


def _rewrite_note(manifest: dict) -> str:
    r = manifest.get("rewrite")
    if not r:
        return ""
    cost = "unknown" if r["cost_usd"] is None else f"{r['cost_usd']:.4f}"
    return (
        f"; requirements rewritten by {r['model']}: {r['n_rewritten']}/{r['n_items']} "
        f"({r['n_fallback']} kept as template), "
        f"{r['prompt_tokens'] + r['completion_tokens']} tokens, USD {cost}"
    )


def cmd_items(args: argparse.Namespace) -> int:
    from schemas.settings import Settings
    from tasks.lifecycle.agents import AgentConfigError
    from tasks.lifecycle.pipeline import (
        check_phases,
        generate_lifecycle_items,
        prepare_lifecycle_databases,
        resolve_path,
    )

    problem = _check_sources(args)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    cfg = _validated(_config(args))
    if cfg is None:
        return 2
    try:
        phases = check_phases(args.phase)
        if args.rewrite_model:
            from tasks.lifecycle.rewrite import check_rewrite_spec

            check_rewrite_spec(args.rewrite_model)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    run_id = run_id_or_new(args.run_id)
    root = args.artifacts or Settings.from_env().artifacts
    dbs = prepare_lifecycle_databases.fn(
        run_id,
        root,
        resolve_path(args.spider_dir),
        resolve_path(args.questions),
        None if args.no_chinook else resolve_path(args.chinook),
        cfg,
    )
    print(f"querylab lifecycle items {run_id}")
    for phase in phases:
        try:
            m = generate_lifecycle_items.fn(run_id, root, phase, dbs, cfg, args.rewrite_model)
        except (AgentConfigError, ValueError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        dropped = ", ".join(f"{k} {v}" for k, v in m["dropped"].items())
        print(
            f"{phase:15s} {m['n_items']:5d} items ({m['n_base_items']} base)"
            + (f"; dropped: {dropped}" if dropped else "")
            + _rewrite_note(m)
            + f"  {m['uri']}"
        )
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from schemas.settings import Settings
    from tasks.core import storage
    from tasks.lifecycle.pipeline import lifecycle_report

    root = args.artifacts or Settings.from_env().artifacts
    try:
        out = lifecycle_report.fn(args.run_id, root)
    except storage.StorageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    _print_tables(out)
    return 0


def _sources(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--spider-dir",
        default=shared_data_path("spider/databases"),
        help="Spider databases: <db_id>/schema.sql + data/*.csv",
    )
    p.add_argument("--questions", default=shared_data_path("spider/dev.json"), help="Spider dev.json")
    p.add_argument(
        "--chinook",
        default=shared_data_path("chinook/Chinook_Sqlite.sqlite"),
        help="Chinook_Sqlite.sqlite (read in place)",
    )
    p.add_argument("--no-chinook", action="store_true", help="leave Chinook out")
    p.add_argument("--db", action="append", help="a Spider database id (default: all); repeat")
    p.add_argument(
        "--phase",
        action="append",
        help="design | implementation | text2sql | progressive | dml | debug | "
        "assigner | expert (default: all); repeat",
    )
    p.add_argument(
        "--max-items",
        type=int,
        default=50,
        help="base items per phase (a question with its variants/levels); 0 = all",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--table-count",
        type=int,
        action="append",
        help="tables per design item, 1-5 (default 1..5); repeat",
    )
    p.add_argument(
        "--level",
        type=int,
        action="append",
        help="perturbation level 0-5 of reasoning graphs (default 0..5); repeat",
    )
    p.add_argument(
        "--variant",
        action="append",
        help="schema variant: original, snake_case, camel_case, prefixed (default all)",
    )
    p.add_argument("--scenarios", type=int, help="maintenance scenarios (default 14)")
    p.add_argument("--run-id", help="reuse a run id to resume it (finished batches are skipped)")
    p.add_argument("--artifacts", help="artifact root (default: $QUERYLAB_ARTIFACTS)")
    p.add_argument(
        "--rewrite-model",
        help="openai:<model>: paraphrase the templated design/implementation requirements with "
        "this chat model (the template is kept in the items; a failed call keeps it)",
    )


def register(subparsers) -> None:
    """Add ``lifecycle`` and its subcommands to the ``querylab`` argparse ``subparsers``."""
    lc = subparsers.add_parser(
        "lifecycle", help="database-lifecycle suite: design, DDL, Text2SQL, debugging, maintenance"
    )
    sub = lc.add_subparsers(dest="lifecycle_command", required=True)

    r = sub.add_parser("run", help="generate items and run models on every phase")
    r.add_argument(
        "--model",
        action="append",
        help="oracle (default) | openai:<model> | replay:<file.jsonl>; repeat",
    )
    _sources(r)
    r.add_argument("--debug-rounds", type=int, help="attempts in multi-round debugging (default 3)")
    r.add_argument("--batch-size", type=int, help="items per mapped task (default 20)")
    r.add_argument("--temperature", type=float)
    r.add_argument(
        "--cache",
        choices=["on", "off", "refresh"],
        help="shared LLM response cache under <artifacts>/cache/llm (default: on); prices of "
        "openai:<model> come from the models table (`querylab models`)",
    )
    r.set_defaults(func=cmd_run)

    i = sub.add_parser("items", help="generate a run's items and show what each phase holds")
    _sources(i)
    i.set_defaults(func=cmd_items)

    p = sub.add_parser("report", help="recompute the tables from a run's artifacts")
    p.add_argument("--run-id", required=True)
    p.add_argument("--artifacts", help="artifact root (default: $QUERYLAB_ARTIFACTS)")
    p.set_defaults(func=cmd_report)
