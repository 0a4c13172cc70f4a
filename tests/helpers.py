"""Plain helpers shared by several test modules (no fixtures, no tests).

Fixtures live in ``tests/conftest.py``; scripted model servers in ``tests/fakes/``. A test module
imports helpers from here, never from another test module.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Callable

import polars as pl
import pytest
import yaml

from schemas import artifacts
from tasks.core import storage
from tests.fakes.openai_server import tool_calls

# The team's shared data sets (TPC-DS, corpora, ...), beside the repository.
SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def register_model(base_url: str, directory: Path, setenv: Callable[[str, str], None], *,
                   name: str, prices: str, key_env: str | None = None, key: str | None = None,
                   api_key_required: bool | None = None, model: str | None = None,
                   context_window: int = 100_000, filename: str = "models.yaml",
                   **fields) -> str:
    """Write a one-model models table (``directory/filename``) registering ``name`` at
    ``base_url`` and point ``QUERYLAB_MODELS`` at it; returns the agent spec ``"openai:<name>"``.

    ``prices``: the YAML flow mapping, USD per million tokens; ``model``: the upstream model id;
    ``key_env``: the entry's ``api_key_env``, and ``key`` the API key put in it; ``model``,
    ``key_env`` and ``api_key_required`` are left out of the entry when None (the table's
    defaults), as is the key. ``fields``: further entry fields (``tool_protocol``,
    ``max_concurrency``, ...). Variables are set through ``setenv`` (pytest's
    ``monkeypatch.setenv``, undone after the test)."""
    entry = [f"name: {name}"]
    if model is not None:
        entry.append(f"model: {model}")
    entry.append(f"base_url: '{base_url}'")
    if key_env is not None:
        entry.append(f"api_key_env: {key_env}")
    if api_key_required is not None:
        entry.append(f"api_key_required: {json.dumps(api_key_required)}")
    entry += [f"prices: {prices}", f"context_window: {context_window}"]
    entry += [f"{field}: {json.dumps(value)}" for field, value in fields.items()]
    path = Path(directory) / filename
    path.write_text("models:\n  - {" + ", ".join(entry) + "}\n")
    setenv("QUERYLAB_MODELS", str(path))
    if key is not None:
        setenv(key_env, key)
    return f"openai:{name}"


def ops_cli(argv: list[str]) -> int:
    """Run the operations commands (``querylab.cmd_ops``: status, runs, ...) with ``argv``
    in-process; returns the exit code."""
    from querylab import cmd_ops

    p = argparse.ArgumentParser(prog="querylab")
    sub = p.add_subparsers(dest="command", required=True)
    cmd_ops.register(sub)
    args = p.parse_args(argv)
    return args.func(args)


def three_step_turn(body: dict):
    """A deterministic 3-step trajectory chosen by how far the conversation is (a responder
    for :class:`tests.fakes.openai_server.ScriptedOpenAIServer`): list_db, one query_db,
    return_answer("Facebook") with usage."""
    n = sum(1 for m in body["messages"] if m["role"] == "assistant")
    if n == 0:
        return tool_calls(("list_db", {}))
    if n == 1:
        return tool_calls(("query_db", {"db": "listings", "query": "SELECT count(*) AS n FROM listings"}))
    return tool_calls(("return_answer", {"answer": "Facebook"}),
                      usage={"prompt_tokens": 100, "completion_tokens": 10, "cached_tokens": 20})


def checkpointed_trials(root: str, run_id: str) -> dict[str, dict]:
    """trial_key → trial row of every trial finished on disk (batch files and checkpoints)."""
    prefix = Path(root, "runs", run_id, "trials", "batches")
    rows = {}
    for f in prefix.glob("*.trials.parquet"):
        for r in pl.read_parquet(f).to_dicts():
            rows[r["trial_key"]] = r
    for f in prefix.glob("*.parts/*.json"):
        r = storage.read_json(str(f))["trial"]
        rows[r["trial_key"]] = r
    return rows


CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
]


def chromium() -> str:
    """The headless Chromium executable; fails the test (with the install command) if absent."""
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.fail("headless Chromium is needed: apt-get update && apt-get install -y chromium")
    return exe


# ---- trials through the real stages ----------------------------------------------------------


def run_batch(root: str, run_id: str, manifest_uri: str, agent: str, items: list,
              key: str = "b", options: dict | None = None, score: bool = True) -> dict:
    """One batch through the real trial task, combined, scored and reported (every stage
    after the trials must cope with what the model sent). Returns the trial rows (dicts by
    trial index) and the score summary."""
    from tasks.report.stage import report_run
    from tasks.scoring.stage import score_run
    from tasks.trials.stage import combine_trials, run_trial_batch

    batch = {"key": key, "agent": agent, "manifest_uri": manifest_uri, "items": items,
             "options": options or {}}
    run_trial_batch.fn(run_id, root, batch, max_concurrency=1)  # scripted in call order
    storage.write_json(storage.join(root, "runs", run_id, "trials", "manifests.json"),
                       [manifest_uri])
    combine_trials.fn(run_id, root, [key])
    out: dict = {}
    _dbg = os.environ.get("QA13_DEBUG")
    if score:
        out["summary"] = score_run(run_id, root)
        report_run(run_id, root)
        scores = pl.read_parquet(out["summary"]["scores"])
        out["scores"] = {r["trial"]: r for r in scores.iter_rows(named=True)}
    trials = pl.read_parquet(storage.join(root, "runs", run_id, "trials", "trials.parquet"))
    out["trials"] = {r["trial"]: r for r in trials.iter_rows(named=True)}
    out["messages"] = pl.read_parquet(storage.join(root, "runs", run_id, "trials",
                                                   "messages.parquet"))
    out["llm_calls"] = pl.read_parquet(storage.join(root, "runs", run_id, "trials",
                                                    "llm_calls.parquet"))
    if _dbg:
        for t, r in out["trials"].items():
            print("TRIAL", run_id, t, r["terminate_reason"], (r["error"] or "")[:300])
        tool_rows = out["messages"].filter(pl.col("role") == "tool")
        print("TOOL", [c[:200] for c in tool_rows["content"]])
    return out


# ---- a hand-built run (report tests) ---------------------------------------------------------


HAND_MANIFEST = {
    "name": "movies",
    "version": "1-test",
    "databases": {"catalog": {"engine": "mongodb"}, "boxoffice": {"engine": "postgres"}},
    "queries": [
        {
            "id": "oscars",
            "question": "How many films won at least one Oscar?",
            "ground_truth": 42,
            "requires": {
                "sources": ["catalog.films", "boxoffice.revenue"],
                "operations": ["join_reformatted_key", "extract_from_text"],
            },
        },
        {
            "id": "fresh",
            "question": "How many films are Fresh?",
            "ground_truth": 7,
            "requires": {"sources": ["boxoffice.reviews"], "operations": ["domain_knowledge"]},
        },
    ],
}

GOOD_TRAJECTORY = [
    (
        "query_db",
        {
            "db": "catalog",
            "query": '{"collection": "films", "find": {"awards": {"$regex": "Oscar"}}}',
        },
    ),
    ("query_db", {"db": "boxoffice", "query": "SELECT omdb_key FROM revenue"}),
    (
        "execute_python",
        {"code": "print(len({int(r['omdb_key'].split(':')[1]) for r in var_call_2}))"},
    ),
    ("return_answer", {"answer": "42"}),
]


def _hand_trial(
    run_id,
    agent,
    query,
    n,
    correct,
    reason="return_answer",
    answer="42",
    error=None,
    cost=0.0,
    tokens=(0, 0, 0),
    calls=0,
):
    """A trials row (no verdict: ``correct`` goes to the scores the helper writes)."""
    return {
        "run_id": run_id,
        "trial_key": f"{agent}|movies|{query}|{n}",
        "agent": agent,
        "model": agent.removeprefix("openai:") if agent != "oracle" else None,
        "dataset": "movies",
        "query_id": query,
        "trial": n,
        "answer": answer,
        "_correct": correct,
        "terminate_reason": reason,
        "error": error,
        "n_llm_calls": 3 if agent != "oracle" else 0,
        "n_tool_calls": calls,
        "prompt_tokens": tokens[0],
        "completion_tokens": tokens[1],
        "cached_tokens": tokens[2],
        "cost_usd": cost,
        "latency_s": 1.5 + n,
        "dataset_version": "1-test",
    }


def write_scores(root: str, run_id: str, trials: list[dict]) -> str:
    """``score/scores.parquet`` for hand-made trials: ``_correct`` as the verdict, errored
    for ``api_error`` / ``error`` trials (what the score step decides)."""
    from tasks.scoring.stage import ERRORED_REASONS, scores_frame, scores_uri

    rows = []
    for t in trials:
        errored = t["terminate_reason"] in ERRORED_REASONS
        rows.append({
            **{k: t[k] for k in ("run_id", "trial_key", "agent", "dataset", "query_id", "trial",
                                 "terminate_reason", "answer")},
            "verdict": "errored" if errored else ("correct" if t["_correct"] else "incorrect"),
            "is_correct": None if errored else t["_correct"], "reason": "hand-made",
            "validator": "number", "validator_digest": "0" * 12, "scorer_version": "test",
            "audit_flags": 0,
        })
    return storage.write_parquet(scores_uri(root, run_id), scores_frame(rows).to_arrow(),
                                 artifacts.SCORES)


def write_run(
    root: str, run_id: str = "hand", llm_calls: bool = False, manifest: bool = True
) -> dict:
    """A run of 2 agents × 2 queries × 3 trials: the oracle right every time, ``openai:m``
    with one failure of each kind. Returns the trajectories by trial key."""
    trials, calls = [], {}
    for query in ("oscars", "fresh"):
        for n in range(3):
            key = f"oracle|movies|{query}|{n}"
            calls[key] = GOOD_TRAJECTORY
            trials.append(_hand_trial(run_id, "oracle", query, n, True, calls=len(GOOD_TRAJECTORY)))
    m = "openai:m"
    plan = {
        ("oscars", 0): (True, "return_answer", GOOD_TRAJECTORY),
        ("oscars", 1): (False, "return_answer", GOOD_TRAJECTORY),  # FM4
        ("oscars", 2): (False, "return_answer", GOOD_TRAJECTORY[1:]),  # FM3 (no films)
        ("fresh", 0): (False, "api_error", []),  # FM5
        ("fresh", 1): (False, "no_tool_call", []),  # FM1
        ("fresh", 2): (
            True,
            "return_answer",
            [
                (
                    "query_db",
                    {
                        "db": "boxoffice",
                        "query": "SELECT count(*) FROM reviews WHERE tomatometer >= 60",
                    },
                ),
                ("return_answer", {"answer": "7"}),
            ],
        ),
    }
    for (query, n), (ok, reason, traj) in plan.items():
        key = f"{m}|movies|{query}|{n}"
        calls[key] = traj
        trials.append(
            _hand_trial(
                run_id,
                m,
                query,
                n,
                ok,
                reason,
                answer=None if reason == "api_error" else "5",
                error="APIError: 500" if reason == "api_error" else None,
                cost=0.01 * (n + 1),
                tokens=(1000, 100, 400),
                calls=len(traj),
            )
        )
    call_rows = [
        {
            "run_id": run_id,
            "trial_key": key,
            "call_index": i,
            "turn": i,
            "call_id": f"call_{i}",
            "tool": tool,
            "arguments": json.dumps(args),
            "success": True,
            "error": None,
            "result_size": 10,
            "duration_s": 0.01,
        }
        for key, traj in calls.items()
        for i, (tool, args) in enumerate(traj)
    ]
    prefix = f"{root}/runs/{run_id}/trials"
    storage.write_parquet(
        f"{prefix}/trials.parquet", pl.DataFrame(trials).drop("_correct").to_arrow(),
        artifacts.TRIALS,
    )
    write_scores(root, run_id, trials)
    storage.write_parquet(
        f"{prefix}/tool_calls.parquet", pl.DataFrame(call_rows).to_arrow(), artifacts.TOOL_CALLS
    )
    if llm_calls:
        rows = [
            {
                "run_id": run_id,
                "trial_key": t["trial_key"],
                "call_index": i,
                "model": "m",
                "base_url": "http://127.0.0.1:1/v1",
                "prompt_tokens": 300,
                "cached_tokens": 100,
                "completion_tokens": 30,
                "cost_usd": 0.001,
                "latency_s": 0.2,
                "finish_reason": "tool_calls",
                "n_tool_calls": 1,
                "attempts": 2 if i == 0 else 1,
                "cache_hit": i == 2,
                "priced": i != 1 or t["trial"] != 0,
                "error": None,
            }
            for t in trials
            if t["agent"] == m
            for i in range(3)
        ]
        storage.write_parquet(
            f"{prefix}/llm_calls.parquet", pl.DataFrame(rows).to_arrow(), artifacts.LLM_CALLS
        )
    if manifest:
        storage.write_json(f"{root}/datasets/movies/1-test/manifest.json", HAND_MANIFEST)
    return calls


def make_report(root: str, run_id: str = "hand") -> tuple[dict, dict]:
    """The report tables and rendered report of ``run_id`` (the report stage's own tasks)."""
    from tasks.report.stage import compute_report_tables, render_report

    tables = compute_report_tables.fn(run_id, root)
    return tables, render_report.fn(run_id, root, tables)


# ---- the viewer in headless Chromium ---------------------------------------------------------


def browser_dom(page: Path, tmp_path: Path, fragment: str) -> str:
    """The page's DOM after load in headless Chromium, opened at ``#<fragment>``."""
    res = _dump_dom(page, tmp_path, fragment)
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout


def _dump_dom(page: Path, tmp_path: Path, fragment: str):
    profile = tmp_path / f"chromium-profile-{len(list(tmp_path.iterdir()))}"
    return subprocess.run(
        [chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--dump-dom",
         page.resolve().as_uri() + "#" + fragment],
        check=False, capture_output=True, text=True, timeout=120,
    )


# ---- specs -----------------------------------------------------------------------------------


def scaffold_spec() -> dict:
    """A valid spec (the scaffold's penguins example) as a dict."""
    from querylab.cmd_datasets import SPEC_TEMPLATE

    return yaml.safe_load(SPEC_TEMPLATE.format(name="penguins"))


def fixed_ground_truth(spec_text: str, query_id: str, sql: str) -> str:
    """A spec's text with query ``query_id``'s ground-truth SQL replaced by ``sql`` (a "fix")."""
    start = spec_text.index(f"  - id: {query_id}\n")
    head = spec_text.index("    ground_truth:\n", start)
    end = spec_text.index("    validator:", head)
    return (spec_text[:head] + f"    ground_truth:\n      sql: \"{sql}\"\n"
            + spec_text[end:])


# ---- text-to-SQL -----------------------------------------------------------------------------


# A model reply whose SQL is valid on the TPC-DS schema (text-to-SQL generation tests).
TPCDS_VALID_REPLY = (
    "```sql\nSELECT ss_item_sk, sum(ss_net_profit) FROM store_sales GROUP BY ss_item_sk;\n```"
)


def text2sql_generator(srv, cache=None, **config):
    """An :class:`OpenAIGenerator` for model ``scripted`` at the scripted server ``srv`` (no API
    retries unless ``config`` says so; ``config``: :class:`GenerationConfig` fields)."""
    from schemas.settings import Settings
    from schemas.text2sql import GenerationConfig
    from tasks.text2sql.generators import OpenAIGenerator

    settings = Settings(openai_base_url=srv.base_url, openai_api_key="sk-test")
    config = {"api_retries": 0, **config}
    return OpenAIGenerator("scripted", settings, GenerationConfig(**config), cache)
