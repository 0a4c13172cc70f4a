"""The transcript viewer: one self-contained HTML file per run (``report/viewer.html``).

``querylab view --run-id X`` writes it (the report stage does too, and the report's examples
link to it as ``viewer.html#trial=<trial key>``). Every trial of the run is listed and can be
filtered by agent, dataset, query, verdict, failure mode, errored and audit-flagged; a trial
shows its question, ground truth, answer, verdict with the validator's reason, failure-mode
label with its evidence (rule, sources never touched, operations without evidence), the trace
audit's findings and the whole transcript (system prompt, question, each assistant message
with its reasoning and tool calls, each tool result exactly as the model saw it, collapsed).

The file has no external resource: data is embedded as JSON in a
``<script type="application/json">`` element and rendered by an inline script that only ever
sets ``textContent`` — transcripts are model output, hostile input, and are never parsed as
HTML. Filters and the selected trial live in the URL fragment (``#verdict=errored&agent=...``,
``#trial=<key>``), so a link can point at one trial or one view. ``<div id="viewer-check">``
carries ``data-status``, ``data-trials`` (in the run) and ``data-shown`` (after filtering) for
headless checks. :func:`serve_html` serves the file on 127.0.0.1 (``querylab view --serve``).
"""

from __future__ import annotations

import html
import json
import threading
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import polars as pl

from schemas import report as rs
from tasks.core import storage
from tasks.core.layout import RunLayout

#: Longest message text embedded per message (characters); longer ones say how much was cut.
MAX_MESSAGE_CHARS = 20_000


def viewer_uri(artifacts_root: str, run_id: str) -> str:
    """URI of a run's ``report/viewer.html``."""
    return RunLayout(artifacts_root, run_id).report("viewer.html")


def _truth(value):
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, list):
        return "; ".join(str(v) for v in value)
    return None if value is None else str(value)


def _cut(text: str | None) -> str | None:
    if text is None or len(text) <= MAX_MESSAGE_CHARS:
        return text
    return text[:MAX_MESSAGE_CHARS] + f"\n… [viewer cut: {len(text):,} characters in all]"


def viewer_data(run_id: str, artifacts_root: str, manifest_uris: list[str] | None = None) -> dict:
    """The JSON the viewer embeds: ``{"run_id", "generated", "trials": [...], "messages":
    {trial_key: [...]}}`` from the run's artifacts (scored trials, transcripts, failure labels
    — the report's, or computed by the same rules —, audit findings, the datasets' questions
    and ground truths). ScoringError when the run is not scored."""
    from tasks.report.loaders import (
        load_audit,
        load_llm_calls,
        load_messages,
        load_scored_trials,
    )
    from tasks.report.stage import resolve_manifests
    from tasks.scoring.stage import run_full_manifests

    trials = load_scored_trials(artifacts_root, run_id)
    calls = load_llm_calls(artifacts_root, run_id)
    requests = {} if calls is None else dict(  # HTTP requests each trial sent, all attempts
        calls.group_by("trial_key").agg(pl.col("attempts").sum()).iter_rows())
    run_queries = {
        d: set(q) for d, q in trials.group_by("dataset").agg(pl.col("query_id").unique()).iter_rows()
    }
    uris, _ = resolve_manifests(artifacts_root, run_id, run_queries, manifest_uris)
    queries = {}
    for m in run_full_manifests(artifacts_root, run_id, uris):  # the scoring it was scored with
        for q in m.get("queries", []):
            queries.setdefault((m["name"], q["id"]), q)
    labels = {r["trial_key"]: r for r in _labels(run_id, artifacts_root, trials, uris)
              .iter_rows(named=True)}
    flags: dict[str, list[dict]] = {}
    for f in load_audit(artifacts_root, run_id).iter_rows(named=True):
        flags.setdefault(f["trial_key"], []).append(
            {"check": f["check"], "index": f["message_index"], "evidence": f["evidence"]}
        )
    rows = []
    for t in trials.sort("agent", "dataset", "query_id", "trial").iter_rows(named=True):
        q = queries.get((t["dataset"], t["query_id"]), {})
        lab = labels.get(t["trial_key"]) or {}
        rows.append({
            "key": t["trial_key"], "agent": t["agent"], "dataset": t["dataset"],
            "query": t["query_id"], "trial": t["trial"], "verdict": t["verdict"],
            "reason": t["reason"], "terminate": t["terminate_reason"], "error": t["error"],
            "answer": _cut(t["answer"]), "question": q.get("question"),
            "ground_truth": _truth(q.get("ground_truth")),
            "validator": json.dumps(q.get("validator"), sort_keys=True) if q.get("validator") else None,
            "mode": lab.get("failure_mode"), "rule": lab.get("rule"),
            "missing_sources": list(lab.get("missing_sources") or []),
            "missing_operations": list(lab.get("missing_operations") or []),
            "flags": flags.get(t["trial_key"], []),
            "cost_usd": t["cost_usd"], "latency_s": t["latency_s"],
            "n_llm_calls": t["n_llm_calls"], "n_tool_calls": t["n_tool_calls"],
            "n_requests": requests.get(t["trial_key"]),
        })
    messages: dict[str, list[dict]] = {}
    frame = load_messages(artifacts_root, run_id)
    if frame is not None:
        for m in frame.sort("trial_key", "index").iter_rows(named=True):
            messages.setdefault(m["trial_key"], []).append({
                "i": m["index"], "turn": m["turn"], "role": m["role"],
                "content": _cut(m["content"]), "reasoning": _cut(m["reasoning"]),
                "tool_calls": json.loads(m["tool_calls"]) if m["tool_calls"] else [],
                "tool_call_id": m["tool_call_id"], "tool_name": m["tool_name"],
                "chars": m["content_chars"], "full": m["full_size"],
            })
    return {
        "run_id": run_id,
        "generated": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "has_transcripts": frame is not None,
        "trials": rows,
        "messages": messages,
    }


def _labels(run_id: str, artifacts_root: str, trials: pl.DataFrame,
            manifest_uris: list[str]) -> pl.DataFrame:
    """The run's failure labels: the report's ``failure_labels.parquet`` when it is current
    (one label per incorrect trial), else computed here by the same rules
    (:func:`tasks.report.failure_modes.classify_failures`)."""
    from tasks.report.failure_modes import classify_failures, requirements_from_manifests
    from tasks.report.loaders import load_tool_calls, report_uri
    from tasks.scoring.stage import run_full_manifests

    uri = report_uri(artifacts_root, run_id, "failure_labels.parquet")
    incorrect = set(trials.filter(pl.col("verdict") == "incorrect")["trial_key"])
    if storage.exists(uri):
        labels = pl.from_arrow(storage.read_parquet(uri, rs.FAILURE_LABELS))
        if set(labels["trial_key"]) == incorrect:
            return labels
    calls = load_tool_calls(artifacts_root, run_id)
    if calls is None:
        from schemas import artifacts

        calls = pl.from_arrow(artifacts.TOOL_CALLS.empty_table())
    requirements = requirements_from_manifests(
        run_full_manifests(artifacts_root, run_id, manifest_uris))
    return classify_failures(trials, calls, requirements)


def _embed(data: dict) -> str:
    """JSON safe inside ``<script type="application/json">`` (no ``</``, no ``<!--``)."""
    text = json.dumps(data, ensure_ascii=False, default=str, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


_CSS = """
*{box-sizing:border-box}body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;
margin:0;color:#222;font-size:14px}header{padding:.6rem 1rem;border-bottom:1px solid #ddd;
background:#f6f8fa}h1{font-size:1.1rem;margin:0 0 .4rem}#filters{display:flex;flex-wrap:wrap;
gap:.5rem}#filters label{font-size:.8rem;color:#555;display:flex;flex-direction:column}
select{font-size:.85rem;max-width:14rem}main{display:flex;height:calc(100vh - 6.5rem)}
#list{width:34%;min-width:18rem;overflow-y:auto;border-right:1px solid #ddd}
#list table{border-collapse:collapse;width:100%;font-size:.8rem}
#list td{border-bottom:1px solid #eee;padding:.25rem .4rem;cursor:pointer;overflow-wrap:break-word}
#list tr.sel td{background:#e8f0fe}#detail{flex:1;overflow-y:auto;padding:.8rem 1.2rem}
.v-correct{color:#1a7f37;font-weight:600}.v-incorrect{color:#cf222e;font-weight:600}
.v-errored{color:#9a6700;font-weight:600}.v-correct,.v-incorrect,.v-errored{white-space:nowrap}.flag{color:#cf222e}
dl{display:grid;grid-template-columns:9rem 1fr;gap:.2rem .8rem;margin:.4rem 0 1rem}
dt{color:#555}dd{margin:0;white-space:pre-wrap;overflow-wrap:anywhere}
.msg{border:1px solid #ddd;border-radius:4px;margin:.5rem 0;padding:.4rem .6rem}
.msg .role{font-size:.75rem;text-transform:uppercase;color:#555;margin-bottom:.2rem}
.msg.system{background:#fafafa}.msg.user{background:#f0f7ff}.msg.assistant{background:#fff}
.msg.tool{background:#fbfbf4}pre{white-space:pre-wrap;overflow-wrap:anywhere;margin:.2rem 0;
font-size:.8rem;font-family:ui-monospace,Menlo,Consolas,monospace}
summary{cursor:pointer;font-size:.8rem;color:#444}.call{border-left:3px solid #4c72b0;
padding-left:.5rem;margin:.3rem 0}.empty{color:#777;font-style:italic}
#viewer-check{display:none}
"""

_SCRIPT = r"""
(function () {
  var data = JSON.parse(document.getElementById("viewer-data").textContent);
  var check = document.getElementById("viewer-check");
  var FILTERS = ["agent", "dataset", "query", "verdict", "mode", "errored", "flagged"];
  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  function params() {
    var out = {};
    location.hash.replace(/^#/, "").split("&").forEach(function (kv) {
      if (!kv) return;
      var i = kv.indexOf("=");
      var k = decodeURIComponent(i < 0 ? kv : kv.slice(0, i));
      out[k] = decodeURIComponent(i < 0 ? "" : kv.slice(i + 1));
    });
    return out;
  }
  function setHash(p) {
    var parts = [];
    Object.keys(p).forEach(function (k) {
      if (p[k]) parts.push(encodeURIComponent(k) + "=" + encodeURIComponent(p[k]));
    });
    var h = parts.join("&");
    if (("#" + h) !== location.hash) history.replaceState(null, "", h ? "#" + h : location.pathname);
    render();
  }
  function uniq(field) {
    var seen = {};
    data.trials.forEach(function (t) { if (t[field] !== null) seen[t[field]] = 1; });
    return Object.keys(seen).sort();
  }
  var choices = {
    agent: uniq("agent"), dataset: uniq("dataset"), query: uniq("query"),
    verdict: ["correct", "incorrect", "errored"], mode: uniq("mode").concat(["none"]),
    errored: ["only", "exclude"], flagged: ["only", "exclude"]
  };
  var filters = document.getElementById("filters");
  FILTERS.forEach(function (f) {
    var lab = el("label", null, f === "mode" ? "failure mode" : f);
    var sel = el("select");
    sel.id = "filter-" + f;
    sel.appendChild(el("option", null, "(all)")).value = "";
    choices[f].forEach(function (c) { var o = el("option", null, c); o.value = c; sel.appendChild(o); });
    sel.addEventListener("change", function () {
      var p = params(); p[f] = sel.value; delete p.trial; setHash(p);
    });
    lab.appendChild(sel);
    filters.appendChild(lab);
  });
  function keep(t, p) {
    if (p.agent && t.agent !== p.agent) return false;
    if (p.dataset && t.dataset !== p.dataset) return false;
    if (p.query && t.query !== p.query) return false;
    if (p.verdict && t.verdict !== p.verdict) return false;
    if (p.mode && (p.mode === "none" ? t.mode !== null : t.mode !== p.mode)) return false;
    if (p.errored === "only" && t.verdict !== "errored") return false;
    if (p.errored === "exclude" && t.verdict === "errored") return false;
    if (p.flagged === "only" && !t.flags.length) return false;
    if (p.flagged === "exclude" && t.flags.length) return false;
    return true;
  }
  function field(dl, name, value, cls) {
    dl.appendChild(el("dt", null, name));
    var dd = el("dd", cls, value === null || value === undefined || value === "" ? "–" : value);
    dd.setAttribute("data-field", name);
    dl.appendChild(dd);
  }
  function message(m) {
    var box = el("div", "msg " + m.role);
    box.setAttribute("data-index", m.i);
    box.setAttribute("data-role", m.role);
    var head = m.role + " · turn " + m.turn;
    if (m.role === "tool") {
      var d = el("details");
      var shown = m.chars === null ? 0 : m.chars;
      var cut = m.full !== null && m.full !== undefined && m.full > shown;
      d.appendChild(el("summary", null, "tool result of " + (m.tool_name || "?") + " (" +
        (m.tool_call_id || "") + "): " + shown + " characters" +
        (cut ? " shown of a " + m.full + "-character result (cut)" : ", the whole result")));
      var pre = el("pre", "tool-result", m.content || "");
      d.appendChild(pre);
      box.appendChild(el("div", "role", head));
      box.appendChild(d);
      return box;
    }
    box.appendChild(el("div", "role", head));
    if (m.reasoning) {
      var r = el("details");
      r.appendChild(el("summary", null, "reasoning (" + m.reasoning.length + " characters)"));
      r.appendChild(el("pre", "reasoning", m.reasoning));
      box.appendChild(r);
    }
    if (m.content) {
      if (m.role === "system") {
        var s = el("details");
        s.appendChild(el("summary", null, "system prompt (" + m.content.length + " characters)"));
        s.appendChild(el("pre", "content", m.content));
        box.appendChild(s);
      } else {
        box.appendChild(el("pre", "content", m.content));
      }
    }
    (m.tool_calls || []).forEach(function (c) {
      var call = el("div", "call");
      call.appendChild(el("div", "role", "calls " + c.name + " (" + c.id + ")"));
      var args = c.arguments;
      try { args = JSON.stringify(JSON.parse(args), null, 2); } catch (e) {}
      call.appendChild(el("pre", "arguments", args));
      box.appendChild(call);
    });
    return box;
  }
  function detail(t) {
    var pane = document.getElementById("detail");
    pane.textContent = "";
    if (!t) { pane.appendChild(el("p", "empty", "Select a trial.")); return; }
    pane.setAttribute("data-trial", t.key);
    pane.appendChild(el("h2", null, t.key));
    var dl = el("dl");
    field(dl, "question", t.question);
    field(dl, "ground truth", t.ground_truth);
    field(dl, "answer", t.answer);
    field(dl, "verdict", t.verdict, "v-" + t.verdict);
    field(dl, "validator reason", t.reason);
    field(dl, "validator", t.validator);
    field(dl, "terminate reason", t.terminate);
    if (t.error) field(dl, "error", t.error);
    var fm = t.mode ? t.mode + " (rule " + t.rule + ")" : (t.verdict === "incorrect" ? "not labelled (run the report)" : "none");
    field(dl, "failure mode", fm);
    if (t.mode) {
      field(dl, "evidence", "sources never touched: " + (t.missing_sources.join(", ") || "none") +
        "; operations without evidence: " + (t.missing_operations.join(", ") || "none"));
    }
    field(dl, "audit", t.flags.length ? t.flags.map(function (f) {
      return f.check + (f.index !== null ? " (message " + f.index + ")" : "") + ": " + f.evidence;
    }).join("\n") : "no findings", t.flags.length ? "flag" : null);
    field(dl, "effort", t.n_llm_calls + " model call" + (t.n_llm_calls === 1 ? "" : "s") +
      (t.n_requests !== null && t.n_requests !== undefined && t.n_requests !== t.n_llm_calls ?
        " (" + t.n_requests + " HTTP requests, retries and earlier attempts included)" : "") +
      ", " + t.n_tool_calls + " tool calls, " +
      Number(t.latency_s).toFixed(2) + " s, $" + Number(t.cost_usd).toFixed(6));
    pane.appendChild(dl);
    pane.appendChild(el("h3", null, "Transcript"));
    var msgs = data.messages[t.key] || [];
    if (!msgs.length) pane.appendChild(el("p", "empty", data.has_transcripts ?
      "No messages were recorded for this trial." : "This run has no transcripts (messages.parquet)."));
    var box = el("div");
    box.id = "transcript";
    msgs.forEach(function (m) { box.appendChild(message(m)); });
    pane.appendChild(box);
  }
  function render() {
    var p = params();
    FILTERS.forEach(function (f) { document.getElementById("filter-" + f).value = p[f] || ""; });
    var shown = data.trials.filter(function (t) { return keep(t, p); });
    var tbody = document.getElementById("rows");
    tbody.textContent = "";
    var selected = null;
    shown.forEach(function (t) {
      var tr = el("tr");
      tr.setAttribute("data-key", t.key);
      tr.appendChild(el("td", null, t.agent + " · " + t.dataset + "/" + t.query + " #" + t.trial));
      tr.appendChild(el("td", "v-" + t.verdict, t.verdict));
      tr.appendChild(el("td", null, t.mode || ""));
      tr.appendChild(el("td", "flag", t.flags.length ? "⚑ " + t.flags.length : ""));
      tr.addEventListener("click", function () { var q = params(); q.trial = t.key; setHash(q); });
      if (p.trial === t.key) { tr.className = "sel"; selected = t; }
      tbody.appendChild(tr);
    });
    if (p.trial && !selected) {
      selected = data.trials.filter(function (t) { return t.key === p.trial; })[0] || null;
    }
    detail(selected);
    document.getElementById("count").textContent = shown.length + " of " + data.trials.length + " trials";
    check.setAttribute("data-trials", String(data.trials.length));
    check.setAttribute("data-shown", String(shown.length));
    check.setAttribute("data-selected", selected ? selected.key : "");
    check.setAttribute("data-status", "ok");
  }
  window.addEventListener("hashchange", render);
  render();
})();
"""


def render_viewer(data: dict) -> str:
    """The viewer page for :func:`viewer_data` output (one self-contained HTML document)."""
    title = f"querylab transcripts: run {data['run_id']}"
    return "\n".join([
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>",
        f"<header><h1>{html.escape(title)}</h1>",
        '<div id="filters"></div><div id="count"></div></header>',
        '<main><div id="list"><table><tbody id="rows"></tbody></table></div>',
        '<div id="detail"><p class="empty">Select a trial.</p></div></main>',
        '<div id="viewer-check" data-status="pending"></div>',
        f'<script type="application/json" id="viewer-data">{_embed(data)}</script>',
        f"<script>{_SCRIPT}</script>",
        f"<!-- generated {html.escape(data['generated'])} -->",
        "</body></html>",
    ]) + "\n"


def write_viewer(run_id: str, artifacts_root: str, manifest_uris: list[str] | None = None) -> str:
    """Write the run's ``report/viewer.html``; returns its URI (ScoringError when the run is
    not scored)."""
    page = render_viewer(viewer_data(run_id, artifacts_root, manifest_uris))
    return storage.write_bytes(viewer_uri(artifacts_root, run_id), page.encode())


def serve_html(page: bytes, port: int = 0, host: str = "127.0.0.1") -> ThreadingHTTPServer:
    """Serve ``page`` at ``http://127.0.0.1:<port>/`` (and ``/viewer.html``) in a daemon thread;
    every other path is 404. Returns the server (``server.server_address[1]`` is the port;
    ``shutdown()`` stops it). Only the loopback interface is bound."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server API
            if self.path.split("#")[0].split("?")[0] not in ("/", "/viewer.html"):
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *args):  # quiet
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
