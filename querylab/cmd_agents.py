"""``querylab models``: list the models table (``data/models.yaml`` + ``QUERYLAB_MODELS``) and
whether each model's API key is set; ``--check AGENT ...`` checks agents the way a run does.

Also the agent-option flags of ``querylab run`` (:func:`add_agent_options`,
:func:`agent_options_from_args`), kept here so the run command and the models table agree.
"""

from __future__ import annotations

import argparse
import json
import sys
from tasks.core.settings import env_get

#: ``querylab run`` flags → :class:`schemas.models.AgentOptions` fields.
_FLAGS = [
    ("--max-iterations", "max_iterations", int, "model calls per trial (default 100)"),
    ("--trial-timeout", "max_wall_time_s", float,
     "wall seconds per trial, waits for a model-call slot not counted "
     "(default 900; DAB datasets 43200)"),
    ("--max-tool-calls-per-turn", "max_tool_calls_per_turn", int,
     "tool calls in one model response (default 16)"),
    ("--token-budget", "max_total_tokens", int,
     "prompt + completion tokens per trial (default: none)"),
    ("--max-retries", "max_retries", int,
     "retries of a model call on 429/5xx/timeouts/connection errors (default 5)"),
    ("--request-timeout", "request_timeout_s", float,
     "seconds per HTTP attempt (default 120; DAB datasets 600)"),
    ("--temperature", "temperature", float, "sampling temperature (default: the model's)"),
    ("--seed", "seed", int, "sampling seed sent to the API (default: none)"),
    ("--python-timeout", "python_timeout_s", float,
     "wall seconds per execute_python call (default 60; DAB datasets 600, as DAB)"),
    ("--python-memory-mb", "python_memory_mb", int,
     "memory of one execute_python call, all its processes, in MiB (default 2048)"),
    ("--python-disk-mb", "python_disk_mb", int,
     "size of a trial's execute_python work directory in MiB (default 1024)"),
    ("--preview-chars", "preview_chars", int,
     "characters of a tool result shown to the model (default 8000; DAB datasets 10000, "
     "DAB's PREVIEW_LENGTH)"),
]


def add_agent_options(parser: argparse.ArgumentParser) -> None:
    """Add the agent-option flags (limits, retries, sampling, cache) to ``parser``."""
    g = parser.add_argument_group("agent options (openai:<model> agents)")
    for flag, dest, kind, text in _FLAGS:
        g.add_argument(flag, dest=f"opt_{dest}", type=kind, default=None, help=text)
    g.add_argument("--cache", dest="opt_cache", choices=["on", "off", "refresh"], default=None,
                   help="response cache: on (default), refresh (ignore hits, store), off")
    g.add_argument("--unsafe-sandbox", dest="opt_unsafe_sandbox", action="store_true",
                   default=None,
                   help="run LLM agents although this machine cannot isolate execute_python "
                   "(recorded in the run and its report)")


def agent_options_from_args(args: argparse.Namespace) -> dict:
    """The agent options given on the command line (unset flags omitted)."""
    out = {}
    for _, dest, _, _ in _FLAGS:
        value = getattr(args, f"opt_{dest}", None)
        if value is not None:
            out[dest] = value
    if getattr(args, "opt_cache", None):
        out["cache"] = args.opt_cache
    if getattr(args, "opt_unsafe_sandbox", None):
        out["unsafe_sandbox"] = True
    return out


def cmd_models(args: argparse.Namespace) -> int:
    """Print the models table, or check agents as a run does — resolution plus the preflight
    request of each LLM agent (exit 2 with one line per agent that cannot run)."""
    from tasks.core.llm import AgentConfigError, load_models_config, local_entry

    try:
        if args.check:
            from tasks.trials.stage import check_agents, preflight_agents

            described = check_agents(args.check)
            checks = iter(preflight_agents(args.check))  # one per LLM agent, in order
            bad = 0
            for desc in described:
                if desc["kind"] in ("openai", "local"):
                    r = next(checks)
                    desc["preflight"] = {"ok": r.ok, "problem": r.problem, "warning": r.warning,
                                         "status": r.status, "tools_accepted": r.tools_accepted,
                                         "latency_s": round(r.latency_s, 3)}
                    bad += not r.ok
                print(json.dumps(desc, indent=2))
            for desc in described:
                pf = desc.get("preflight")
                if pf and not pf["ok"]:
                    print(f"error: {desc['agent']} at {desc['base_url']}: {pf['problem']}",
                          file=sys.stderr)
            return 2 if bad else 0
        cfg = load_models_config()
    except AgentConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps([m.model_dump() for m in cfg.models], indent=2))
        return 0
    header = f"{'agent':42s} {'provider':10s} {'in $/M':>7s} {'cached':>7s} {'out $/M':>7s} " \
             f"{'context':>9s} {'tools':11s}  key"
    print(header)
    for m in cfg.models:
        if m.local is not None:
            try:
                local_entry(m.name, cfg)
                key = "served by querylab"
            except AgentConfigError as exc:  # what is missing: xllamacpp, package or file
                key = "served by querylab: " + str(exc).removeprefix(f"local:{m.name}: ")
        elif m.api_key_env:
            have = any(env_get(v) for v in m.api_key_env)
            key = ("set" if have else "missing") + f" ({' / '.join(m.api_key_env)})"
            if not have and not m.api_key_required:
                key = "optional"
        else:
            key = "not needed"
        p = m.prices
        label = ("local:" if m.local is not None else "openai:") + m.name
        own = ", ".join(f"{k} {v:g}" for k, v in m.agent_defaults.items() if v is not None)
        print(f"{label:42s} {m.provider:10s} {p.input:7.3f} {p.cached_input:7.3f} "
              f"{p.output:7.3f} {m.context_window:9d} {m.tool_protocol:11s}  {key}"
              + (f"; defaults: {own}" if own else ""))
    return 0


def register(subparsers) -> None:
    """Add ``querylab models`` to the CLI's subparsers."""
    p = subparsers.add_parser(
        "models", help="list configured models (prices, context, key) or check agents"
    )
    p.add_argument("--check", nargs="+", metavar="AGENT",
                   help="check agents as a run would (key present, replay file valid, one real "
                   "request to each model: endpoint reachable, key accepted, model known, tools)")
    p.add_argument("--json", action="store_true", help="print the table as JSON")
    p.set_defaults(func=cmd_models)
