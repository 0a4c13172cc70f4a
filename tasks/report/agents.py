"""The report's *Agents* section: what each agent of a run was, from
``runs/<run_id>/trials/agents.json`` (:func:`tasks.trials.stage.describe_agents`) — kind, model,
endpoint host, the tool protocol used (``native`` / ``json_schema``, and whether ``auto`` chose
it), the weights and server of a ``local:`` model, the sampling parameters and the options that
differ from querylab's defaults, and the state of the ``execute_python`` sandbox (sealed, or
``--unsafe-sandbox`` with what was missing)."""

from __future__ import annotations

from urllib.parse import urlsplit

import polars as pl

from schemas.models import AgentOptions
from tasks.core import storage
from tasks.report.html import Section, Table
from tasks.core.layout import RunLayout

_DEFAULTS = AgentOptions().model_dump()


def _fmt(d: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(d.items())) or "(none)"


def sandbox_state(sb: dict | None) -> str:
    """One line: ``sealed (...)`` or ``UNSAFE: ...`` for a description's ``sandbox`` block."""
    if not sb:
        return "not used (no model-written cells)"
    if sb.get("isolated"):
        return ("sealed: own read-only file-system view, unprivileged uid, seccomp, namespaces "
                "and cgroup limits (memory, processes, CPU)")
    from tasks.sandbox.session import missing_text

    return f"UNSAFE (--unsafe-sandbox): {missing_text(sb.get('missing') or [])}"


def agent_rows(d: dict) -> list[tuple[str, str]]:
    """(field, value) rows describing one agents.json entry."""
    kind = d.get("kind", "?")
    rows = [("kind", kind)]
    if kind == "oracle":
        rows.append(("what", "each query's reference solution through the agents' tools"))
        return rows
    if kind == "replay":
        rows += [("answer file", str(d.get("file"))), ("sha256", str(d.get("sha256", ""))[:16]),
                 ("entries", str(d.get("entries")))]
        return rows
    rows.append(("model", str(d.get("model_id") or d.get("name"))))
    url = d.get("base_url") or ""
    host = urlsplit(url).hostname or url or "api.openai.com"
    rows.append(("endpoint host", host + (" (served by querylab)" if kind == "local" else "")))
    proto = str(d.get("tool_protocol", "native"))
    if d.get("tool_protocol_configured") == "auto":
        proto += " (chosen by the auto probe)"
    rows.append(("tool protocol", proto))
    local = d.get("local") or {}
    if local:
        rows.append(("weights", str(local.get("weights"))))
        rows.append(("server", f"llama.cpp (xllamacpp), {local.get('threads')} thread(s), "
                               f"{local.get('parallel')} slot(s), context {local.get('n_ctx')}, "
                               f"loaded in {local.get('load_s')} s"))
    rows.append(("sampling", _fmt(d.get("sampling") or {})))
    opts = {k: v for k, v in (d.get("options") or {}).items() if _DEFAULTS.get(k) != v}
    own = d.get("model_defaults") or {}
    text = _fmt(opts)
    if own:
        text += f" (the models table's defaults for this model: {_fmt(own)})"
    rows.append(("options unlike the defaults", text))
    rows.append(("execute_python sandbox", sandbox_state(d.get("sandbox"))))
    return rows


def agents_section(artifacts_root: str, run_id: str) -> Section | None:
    """The *Agents* section (one table per agent), or None when the run has no agents.json."""
    uri = RunLayout(artifacts_root, run_id).trials("agents.json")
    if not storage.exists(uri):
        return None
    tables = []
    for d in storage.read_json(uri):
        rows = agent_rows(d)
        frame = pl.DataFrame({"field": [r[0] for r in rows], "value": [r[1] for r in rows]})
        tables.append(Table(f"Agent `{d.get('agent')}`", frame, wrap=True))
    return Section("Agents", "What each agent of the run was (from `trials/agents.json`).",
                   tables)
