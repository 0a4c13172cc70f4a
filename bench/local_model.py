"""The local model as an agent: load time, prompt and generation tokens/s, latency per call and
the share of replies that were valid tool calls.

    .venv/bin/python bench/local_model.py [--model smollm2-135m] [--iterations 4] [--trials 1]

What runs: querylab's own llama.cpp server for ``local:<model>`` (:mod:`tasks.agents.local_model`,
the models table's threads/context/slots) and real ReAct trials (:func:`tasks.agents.react.run_react`,
the model's tool protocol, response cache off) on every query of the built ``stocks`` dataset,
at most ``--iterations`` model calls per trial, one trial at a time.

Figures: load time (spawn to the server answering); prompt and generation tokens/s from
llama.cpp's own per-request timings (prompt tokens served from the KV cache are not counted:
they cost nothing); latency per call p50/p95 (client side, what ``llm_calls.latency_s``
records); valid share: replies that parsed as a tool call or a final answer (for the
json_schema protocol: one of the schema's alternatives, complete; a reply cut off at the
token limit is invalid). The machine's load average is printed before and after: compare
runs at similar load. The last line holds every figure.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
_TMP = Path(tempfile.mkdtemp(prefix="querylab-bench-local-"))
os.environ.update({
    "QUERYLAB_HOME": str(_TMP / "home"),
    "QUERYLAB_ARTIFACTS": str(_TMP / "artifacts"),
    "PREFECT_HOME": str(_TMP / "prefect"),
    "DO_NOT_TRACK": "1",
    "PREFECT_LOGGING_LEVEL": "WARNING",
})


def _load() -> str:
    return "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m", help="a local model of the models table")
    p.add_argument("--iterations", type=int, default=4, help="model calls per trial at most")
    p.add_argument("--trials", type=int, default=1, help="trials per query")
    args = p.parse_args()

    from schemas.models import AgentOptions
    from schemas.settings import Settings
    from tasks.agents import local_model
    from tasks.core import storage
    from tasks.agents import tool_protocol
    from tasks.agents.react import run_react, system_prompt, user_prompt
    from tasks.datasets.build import build_dataset_artifacts
    from tasks.db.engines import ensure_loaded, open_databases
    from tasks.core.llm import ChatModel, resolve_model
    from tasks.datasets.spec import spec_path
    from tasks.agents.tools import TOOL_SCHEMAS, ToolBox

    print(f"before: {_load()}")
    settings = Settings.from_env()
    manifest = storage.read_json(
        build_dataset_artifacts.fn(str(spec_path("stocks")), settings.artifacts))
    for db in manifest["databases"]:
        ensure_loaded(manifest, db, settings)
    databases = open_databases(manifest, settings)
    descriptions = {n: d["description"] for n, d in manifest["databases"].items()}

    class Recording(ChatModel):
        """ChatModel that keeps llama.cpp's timings and the raw reply of every call."""

        calls: list[dict] = []

        def _call(self, messages, tools, body, trial, call_index, deadline):
            resp, rec = super()._call(messages, tools, body, trial, call_index, deadline)
            self.calls.append({"timings": (resp.model_extra or {}).get("timings") or {},
                               "raw": resp.choices[0].message, "body": body, "rec": rec})
            return resp, rec

    with local_model.serving():
        started = time.monotonic()
        resolved = resolve_model(f"local:{args.model}")
        load_s = resolved.local["load_s"] if resolved.local else time.monotonic() - started
        options = AgentOptions(max_iterations=args.iterations, cache="off", max_retries=0)
        chat = Recording(resolved, options, cache=None)
        protocol = chat.protocol()
        system = system_prompt(manifest)
        latencies: list[float] = []
        for query in manifest["queries"]:
            for trial in range(args.trials):
                work = _TMP / "work" / f"{query['id']}-{trial}"
                toolbox = ToolBox(databases, work, descriptions=descriptions)
                prompt = user_prompt(manifest, query["question"])
                out = run_react(chat, toolbox, prompt, system, trial, options)
                latencies += [c.latency_s for c in out.llm_calls]
                print(f"  {query['id']}: {out.terminate_reason}, {out.n_llm_calls} calls, "
                      f"{len(out.tool_calls)} tool calls, {out.latency_s:.1f} s")
        chat.close()

    calls = Recording.calls
    prompt_n = sum(c["timings"].get("prompt_n", 0) for c in calls)
    prompt_ms = sum(c["timings"].get("prompt_ms", 0.0) for c in calls)
    gen_n = sum(c["timings"].get("predicted_n", 0) for c in calls)
    gen_ms = sum(c["timings"].get("predicted_ms", 0.0) for c in calls)
    kinds = {"tool": 0, "final": 0, "invalid": 0}
    for c in calls:
        msg = c["raw"]
        if protocol == "native":
            kinds["tool" if msg.tool_calls else "final"] += 1
            continue
        final = tool_protocol.final_name(
            [t["function"]["name"] for t in TOOL_SCHEMAS])
        parsed = tool_protocol.parse_reply(msg.content, final)
        kinds["invalid" if parsed is None else parsed[0]] += 1
    n = len(calls)
    valid = (kinds["tool"] + kinds["final"]) / n if n else float("nan")
    print(f"after: {_load()}")
    print(f"calls {n}: {kinds['tool']} tool calls, {kinds['final']} final answers, "
          f"{kinds['invalid']} invalid; prompt tokens {prompt_n} (uncached) in "
          f"{prompt_ms / 1000:.1f} s, generated {gen_n} in {gen_ms / 1000:.1f} s")
    print(
        f"local:{args.model} ({protocol}, {resolved.local['threads']} thread(s)): "
        f"load {load_s:.2f} s; prompt {prompt_n / (prompt_ms / 1000) if prompt_ms else 0:.1f} "
        f"tok/s; generation {gen_n / (gen_ms / 1000) if gen_ms else 0:.1f} tok/s; "
        f"latency per call p50 {_pct(latencies, 50):.2f} s, p95 {_pct(latencies, 95):.2f} s; "
        f"valid tool-call replies {valid:.0%} ({kinds['tool'] + kinds['final']}/{n})"
    )


if __name__ == "__main__":
    main()
