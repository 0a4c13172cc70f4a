"""Plain helpers shared by several test modules (no fixtures, no tests).

Fixtures live in ``tests/conftest.py``; scripted model servers in ``tests/fakes/``. A test module
imports helpers from here, never from another test module.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path
from typing import Callable

import polars as pl
import pytest

from tasks.core import storage
from tests.fakes.openai_server import tool_calls


def register_model(base_url: str, directory: Path, setenv: Callable[[str, str], None], *,
                   name: str, key_env: str, key: str, prices: str,
                   model: str | None = None, context_window: int = 100_000,
                   filename: str = "models.yaml") -> str:
    """Write a one-model models table (``directory/filename``) registering ``name`` at
    ``base_url`` (``prices``: the YAML flow mapping, USD per million tokens; ``model``: the
    upstream model id, omitted when None) and point ``QUERYLAB_MODELS`` at it, with the API key
    ``key`` in ``key_env``; both set through ``setenv`` (pytest's ``monkeypatch.setenv``).
    Returns the agent spec ``"openai:<name>"``."""
    upstream = f"model: {model}, " if model is not None else ""
    path = Path(directory) / filename
    path.write_text(
        "models:\n"
        f"  - {{name: {name}, {upstream}base_url: '{base_url}', api_key_env: {key_env}, "
        f"prices: {prices}, context_window: {context_window}}}\n"
    )
    setenv("QUERYLAB_MODELS", str(path))
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
