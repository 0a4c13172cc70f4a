"""Agent trials: plan (agent × query × trial) batches, run a batch, combine batch artifacts.

A batch is the unit Prefect maps over (25–100 trials each, not thousands of tiny tasks) and the
unit of idempotence: ``runs/<run_id>/trials/batches/<key>.trials.parquet`` is written last, so
its presence means the batch finished and a re-run skips it.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

import openai
import pyarrow as pa
from prefect import task

from schemas import artifacts
from schemas.settings import Settings
from tasks import storage
from tasks.agent import TrialOutcome, run_oracle, run_react, system_prompt
from tasks.engines import open_databases
from tasks.tools import ToolBox
from tasks.validate import is_correct


class AgentConfigError(ValueError):
    """An agent name cannot be run (unknown kind, or no API key / base URL for it)."""


def parse_agent(agent: str) -> tuple[str, str | None]:
    """``"oracle"`` → ("oracle", None); ``"openai:gpt-4o-mini"`` → ("openai", "gpt-4o-mini").

    Raises AgentConfigError for anything else.
    """
    if agent == "oracle":
        return "oracle", None
    kind, _, model = agent.partition(":")
    if kind == "openai" and model:
        return "openai", model
    raise AgentConfigError(f"unknown agent {agent!r}; use 'oracle' or 'openai:<model>'")


def openai_client(settings: Settings, timeout_s: float = 120.0) -> openai.OpenAI:
    """An ``openai.OpenAI`` client for ``openai:<model>`` agents from the settings.

    A custom base URL (local vLLM/Ollama/llama.cpp) works without a key; the default OpenAI
    endpoint needs one. Raises AgentConfigError otherwise.
    """
    key = settings.openai_api_key
    if not key and not settings.openai_base_url:
        raise AgentConfigError(
            "openai agents need QUERYLAB_OPENAI_API_KEY (or OPENAI_API_KEY), or "
            "QUERYLAB_OPENAI_BASE_URL for a local server"
        )
    return openai.OpenAI(
        base_url=settings.openai_base_url, api_key=key or "not-needed", timeout=timeout_s
    )


def trial_key(agent: str, dataset: str, query_id: str, trial: int) -> str:
    """``"<agent>|<dataset>|<query_id>|<trial>"``: the identity of one trial in a run."""
    return f"{agent}|{dataset}|{query_id}|{trial}"


def plan_batches(
    manifest_uris: list[str], agents: list[str], n_trials: int, batch_size: int = 25
) -> list[dict]:
    """Expand agents × datasets × queries × trials into batches of at most ``batch_size``.

    Returns JSON-able dicts ``{"key", "agent", "manifest_uri", "items": [[query_id, trial]]}``;
    keys are stable for the same inputs (so re-runs find finished batches).
    """
    for agent in agents:
        parse_agent(agent)
    batches = []
    for agent in agents:
        for uri in manifest_uris:
            manifest = storage.read_json(uri)
            items = [[q["id"], t] for q in manifest["queries"] for t in range(n_trials)]
            for start in range(0, len(items), batch_size):
                chunk = items[start : start + batch_size]
                digest = hashlib.sha256(
                    json.dumps([agent, manifest["version"], chunk]).encode()
                ).hexdigest()[:10]
                slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", agent)
                key = f"{slug}-{manifest['name']}-{start // batch_size:04d}-{digest}"
                batches.append(
                    {"key": key, "agent": agent, "manifest_uri": uri, "items": chunk}
                )
    return batches


def _run_one(agent: str, manifest: dict, query: dict, toolbox: ToolBox, settings: Settings):
    kind, model = parse_agent(agent)
    if kind == "oracle":
        return run_oracle(toolbox, query["reference"]), None
    client = openai_client(settings)
    return run_react(client, model, toolbox, query["question"], system_prompt(manifest)), model


def batch_uri(artifacts_root: str, run_id: str, key: str, what: str) -> str:
    """URI of one batch's ``trials`` or ``tool_calls`` Parquet."""
    return storage.join(artifacts_root, "runs", run_id, "trials", "batches", f"{key}.{what}.parquet")


@task(name="run-trial-batch", persist_result=False, retries=0)
def run_trial_batch(run_id: str, artifacts_root: str, batch: dict) -> str:
    """Run every trial of one batch and write its trials and tool-call rows.

    Returns the batch's trials URI. Skips all work when that artifact already exists. Other
    settings (database servers, API key) come from the environment, never from parameters.
    """
    out_uri = batch_uri(artifacts_root, run_id, batch["key"], "trials")
    if storage.exists(out_uri):
        return out_uri
    settings = Settings.from_env()
    manifest = storage.read_json(batch["manifest_uri"])
    queries = {q["id"]: q for q in manifest["queries"]}
    databases = open_databases(manifest, settings)
    descriptions = {n: d["description"] for n, d in manifest["databases"].items()}
    trial_rows, call_rows = [], []
    for query_id, trial in batch["items"]:
        query = queries[query_id]
        key = trial_key(batch["agent"], manifest["name"], query_id, trial)
        workdir = Path(settings.home) / "work" / run_id / batch["key"] / f"{query_id}-{trial}"
        toolbox = ToolBox(databases, workdir, descriptions=descriptions)
        try:
            outcome, model = _run_one(batch["agent"], manifest, query, toolbox, settings)
        except AgentConfigError as exc:
            outcome, model = TrialOutcome(None, "error", str(exc)), None
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        trial_rows.append(
            {
                "run_id": run_id,
                "trial_key": key,
                "agent": batch["agent"],
                "model": model,
                "dataset": manifest["name"],
                "query_id": query_id,
                "trial": trial,
                "answer": outcome.answer,
                "is_correct": is_correct(outcome.answer, query["ground_truth"], query["validator"]),
                "terminate_reason": outcome.terminate_reason,
                "error": outcome.error,
                "n_llm_calls": outcome.n_llm_calls,
                "n_tool_calls": len(outcome.tool_calls),
                "prompt_tokens": outcome.prompt_tokens,
                "completion_tokens": outcome.completion_tokens,
                "cached_tokens": 0,
                "cost_usd": 0.0,
                "latency_s": outcome.latency_s,
            }
        )
        for i, rec in enumerate(outcome.tool_calls):
            o = rec.outcome
            call_rows.append(
                {
                    "run_id": run_id,
                    "trial_key": key,
                    "call_index": i,
                    "turn": rec.turn,
                    "call_id": o.call_id,
                    "tool": o.tool,
                    "arguments": o.arguments,
                    "success": o.success,
                    "error": o.error,
                    "result_size": o.result_size,
                    "duration_s": o.duration_s,
                }
            )
    storage.write_parquet(
        batch_uri(artifacts_root, run_id, batch["key"], "tool_calls"),
        pa.Table.from_pylist(call_rows, schema=artifacts.TOOL_CALLS),
        artifacts.TOOL_CALLS,
    )
    return storage.write_parquet(
        out_uri, pa.Table.from_pylist(trial_rows, schema=artifacts.TRIALS), artifacts.TRIALS
    )


@task(name="combine-trials", persist_result=False)
def combine_trials(run_id: str, artifacts_root: str, batch_keys: list[str]) -> dict[str, str]:
    """Concatenate the given batches into ``trials.parquet`` and ``tool_calls.parquet``.

    Rows are sorted by trial key (and call index); returns ``{"trials": uri, "tool_calls": uri}``.
    Raises StorageError naming a batch whose artifact is missing.
    """
    out = {}
    for what, schema, order in (
        ("trials", artifacts.TRIALS, [("trial_key", "ascending")]),
        ("tool_calls", artifacts.TOOL_CALLS, [("trial_key", "ascending"), ("call_index", "ascending")]),
    ):
        parts = [
            storage.read_parquet(batch_uri(artifacts_root, run_id, k, what), schema)
            for k in batch_keys
        ]
        table = pa.concat_tables(parts) if parts else schema.empty_table()
        table = table.sort_by(order)
        out[what] = storage.write_parquet(
            storage.join(artifacts_root, "runs", run_id, "trials", f"{what}.parquet"), table, schema
        )
    return out
