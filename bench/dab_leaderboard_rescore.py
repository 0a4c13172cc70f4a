"""Check: rescore published DAB leaderboard answer files with querylab (issue 15, acceptance).

    .venv/bin/python bench/dab_leaderboard_rescore.py CHECKOUT --leaderboard LEADERBOARDS_JSON \\
        --submission FILE=AGENT [--submission FILE=AGENT ...]

``CHECKOUT`` is a DataAgentBench tree (``query_<dataset>/query<N>/validate.py`` and whatever
``ground_truth.csv`` they read; no database is needed: the import is ``--scoring-only``).
``LEADERBOARDS_JSON`` is DAB's ``docs/data/leaderboards.json``; each ``--submission`` names an
answer file of ``leaderboard_submissions/`` and the ``agent`` of its ``overallLeaderboard`` row.
Nothing is copied into this repository: the files are read where they lie.

For each submission:

1. the entries for datasets (or queries) the checkout does not have are dropped — counted and
   printed, never silently: a partial checkout gives a figure over the datasets it has, which
   is *not* the published figure over all twelve;
2. ``querylab import-dab CHECKOUT --scoring-only --agent replay:<the kept entries>`` (a
   subprocess: the real CLI) — its last line is the leaderboard figure ``DAB pass@1``;
3. each kept answer is also judged by DAB's own way — ``validate(answer)`` imported from the
   query folder in a plain Python process with that folder as its directory (what DAB's
   ``common_scaffold/validate`` does), averaged per query, per dataset and overall as in
   ``stats_scripts/avg_pass_k.py`` — and compared with querylab's verdict row by row.

Prints one row per submission (published passAt1, querylab's figure over the kept datasets, the
direct figure, rows agreeing), the valid runs per query, and the rows where querylab and the
direct call disagree; the figure LAST:

    rescored <n> submissions over <datasets>: querylab agrees with DAB's validate.py on
    <k>/<rows> answers

(one line). Exit 1 when a run fails or a published agent is not in the leaderboard file.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: Judges every answer of one query folder the way DAB's wrapper does: ``validate`` imported
#: from ``validate.py`` with the folder as the working directory; one verdict line per answer.
DIRECT = """
import importlib.util, json, sys, traceback
spec = importlib.util.spec_from_file_location("validate", "validate.py")
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
for answer in json.load(sys.stdin):
    try:
        ok, _ = mod.validate(answer)
        print(json.dumps({"ok": bool(ok)}))
    except Exception:
        print(json.dumps({"ok": None, "error": traceback.format_exc(limit=2)[-300:]}))
"""


def dab_folders(checkout: Path) -> dict[str, Path]:
    """Dataset name (lower case) → its ``query_<Name>`` folder in ``checkout``."""
    return {p.name[len("query_"):].lower(): p for p in sorted(checkout.iterdir())
            if p.is_dir() and p.name.startswith("query_") and p.name != "query_dataset"}


def keep_entries(entries: list[dict], folders: dict[str, Path]) -> tuple[list[dict], dict]:
    """The entries whose dataset and ``query<N>/validate.py`` the checkout has, and the
    dropped ones counted by dataset (as spelled in the file)."""
    kept, dropped = [], defaultdict(int)
    for e in entries:
        folder = folders.get(str(e["dataset"]).lower())
        if folder is None or not (folder / f"query{e['query']}" / "validate.py").is_file():
            dropped[str(e["dataset"])] += 1
            continue
        kept.append(e)
    return kept, dict(dropped)


def dab_figure(verdicts: dict[tuple[str, str], list[bool]]) -> tuple[float, dict[str, float]]:
    """DAB's leaderboard pass@1 of ``(dataset, query) → [is_valid per run]``: the fraction of
    valid runs per query, the mean over a dataset's queries, the mean over datasets."""
    per_dataset: dict[str, list[float]] = defaultdict(list)
    for (dataset, _), runs in sorted(verdicts.items()):
        if runs:
            per_dataset[dataset].append(sum(runs) / len(runs))
    means = {d: sum(v) / len(v) for d, v in per_dataset.items()}
    return (sum(means.values()) / len(means) if means else float("nan")), means


def judge_directly(kept: list[dict], folders: dict[str, Path]) -> dict[tuple, bool | None]:
    """``(dataset lower, query, run) → validate()'s verdict`` (None: it raised)."""
    by_query: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for e in kept:
        by_query[(str(e["dataset"]).lower(), str(e["query"]))].append(e)
    out = {}
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONDONTWRITEBYTECODE": "1"}
    for (dataset, query), es in by_query.items():
        folder = folders[dataset] / f"query{query}"
        done = subprocess.run([sys.executable, "-c", DIRECT], cwd=folder, env=env, text=True,
                              input=json.dumps([e["answer"] or "" for e in es]),
                              capture_output=True, timeout=600)
        lines = [json.loads(x) for x in done.stdout.splitlines() if x.startswith("{")]
        if done.returncode or len(lines) != len(es):
            raise SystemExit(f"{folder}/validate.py failed outside querylab: "
                             f"{done.stderr.strip()[-500:]}")
        for e, v in zip(es, lines):
            out[(dataset, query, int(e["run"]))] = v["ok"]
    return out


def rescore(checkout: Path, path: Path, work: Path, env: dict) -> dict:
    """One submission: querylab's run and the direct judgement (see the module docstring)."""
    import polars as pl

    from tasks.core.layout import RunLayout

    folders = dab_folders(checkout)
    entries = json.loads(path.read_text(encoding="utf-8"))
    kept, dropped = keep_entries(entries, folders)
    if not kept:
        raise SystemExit(f"{path}: no entry is for a dataset of {checkout}")
    answers = work / f"{path.stem}.kept.json"
    answers.write_text(json.dumps(kept, ensure_ascii=False), encoding="utf-8")
    run_id = re.sub(r"[^a-z0-9-]+", "-", path.stem.lower())[:40]
    art = work / "artifacts"
    done = subprocess.run(
        [str(Path(sys.executable).with_name("querylab")), "import-dab", str(checkout),
         "--scoring-only", "--agent", f"replay:{answers}", "--run-id", run_id,
         "--artifacts", str(art)], cwd=ROOT, env=env, capture_output=True, text=True)
    last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    m = re.fullmatch(r"DAB pass@1: ([0-9.]+)", last)
    if done.returncode or not m:
        raise SystemExit(f"querylab import-dab failed on {path} ({done.returncode}): "
                         f"{(done.stderr or done.stdout).strip()[-1500:]}")
    scores = pl.read_parquet(RunLayout(str(art), run_id).score("scores.parquet"))
    ours = {(r["dataset"].lower(), r["query_id"].removeprefix("query"), r["trial"]):
            r["is_correct"] for r in scores.iter_rows(named=True)}
    direct = judge_directly(kept, folders)
    fig, per_dataset = dab_figure(_group(direct))
    disagree = sorted((k, ours.get(k), v) for k, v in direct.items() if ours.get(k) != v)
    per_query = {(d, q): f"{sum(v)}/{len(v)}" for (d, q), v in sorted(_group(direct).items())}
    return {"querylab": float(m.group(1)), "per_query": per_query, "direct": fig, "per_dataset": per_dataset,
            "rows": len(direct), "agree": len(direct) - len(disagree), "disagree": disagree,
            "dropped": dropped, "kept": len(kept), "entries": len(entries),
            "datasets": sorted({str(e["dataset"]) for e in kept})}


def _group(verdicts: dict[tuple, bool | None]) -> dict[tuple[str, str], list[bool]]:
    out: dict[tuple[str, str], list[bool]] = defaultdict(list)
    for (dataset, query, _), ok in verdicts.items():
        out[(dataset, query)].append(bool(ok))  # DAB: a validator that raises is not valid
    return out


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("checkout", type=Path, help="a DataAgentBench tree with query_* folders")
    p.add_argument("--leaderboard", type=Path, required=True,
                   help="DAB's docs/data/leaderboards.json")
    p.add_argument("--submission", action="append", required=True, metavar="FILE=AGENT",
                   help="an answer file and the agent of its overallLeaderboard row")
    args = p.parse_args(argv)
    board = {r["agent"]: r for r in
             json.loads(args.leaderboard.read_text(encoding="utf-8"))["overallLeaderboard"]}
    pairs = []
    for item in args.submission:
        file, _, agent = item.partition("=")
        if agent not in board:
            raise SystemExit(f"{agent!r} is not an agent of {args.leaderboard}")
        pairs.append((Path(file), agent))
    with tempfile.TemporaryDirectory(prefix="querylab-dab-rescore-") as tmp:
        work = Path(tmp)
        env = {**os.environ, "QUERYLAB_HOME": str(work / "home"),
               "QUERYLAB_ARTIFACTS": str(work / "artifacts"), "PREFECT_HOME": str(work / "pf"),
               "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "300",
               "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DO_NOT_TRACK": "1",
               "PREFECT_LOGGING_LEVEL": "WARNING"}
        results = [(path, agent, rescore(args.checkout, path, work, env))
                   for path, agent in pairs]
    print("| submission | published passAt1 (all datasets) | datasets rescored | entries kept "
          "| querylab DAB pass@1 | validate.py called directly | rows agreeing |")
    print("|---|---|---|---|---|---|---|")
    for path, agent, r in results:
        print(f"| {path.name} ({agent}) | {board[agent]['passAt1']:.4f} | "
              f"{', '.join(r['datasets'])} | {r['kept']}/{r['entries']} | {r['querylab']:.4f} "
              f"| {r['direct']:.4f} | {r['agree']}/{r['rows']} |")
    queries = sorted({k for _, _, r in results for k in r["per_query"]})
    print("\nvalid runs per query (validate.py):\n| query | "
          + " | ".join(path.name for path, _, _ in results) + " |")
    print("|---|" + "---|" * len(results))
    for d, q in queries:
        print(f"| {d} query{q} | "
              + " | ".join(r["per_query"].get((d, q), "-") for _, _, r in results) + " |")
    for path, _, r in results:
        for (dataset, query, run), q, d in r["disagree"]:
            print(f"disagreement: {path.name} {dataset} query{query} run {run}: "
                  f"querylab {q}, validate.py {d}")
    datasets = sorted({d for _, _, r in results for d in r["datasets"]})
    agree = sum(r["agree"] for _, _, r in results)
    rows = sum(r["rows"] for _, _, r in results)
    print(f"rescored {len(results)} submissions over {', '.join(datasets)}: querylab agrees "
          f"with DAB's validate.py on {agree}/{rows} answers")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
