"""P5 Maintenance: a small simulated monitoring system with injected anomalies, exposed as
tools, and the Assigner / Expert items built on it.

Scenarios (:func:`generate_scenario`) come from ``data/lifecycle/maintenance.yaml``: scenario
``i`` injects root cause number ``i mod 7`` (root causes sorted by name). Every metric is a
series of ``series_minutes`` one-minute points drawn from a normal distribution (its baseline
and standard deviation); inside the anomaly window (a seeded start between minutes 40 and 80, a
seeded length of 15–30 minutes) each metric the root cause affects is shifted by its effect ×
the metric's standard deviation. The alert reports the window and the symptoms (the rules that
fired), never the metric names. Draws use ``random.Random("<seed>:maintenance:<i>")``.

Tools (OpenAI function-calling schemas in :data:`TOOLS`), answered by :class:`MetricsAPI`:

- ``list_metrics()`` — names, units and descriptions;
- ``check_metric_abnormal(metric, start, end)`` — z-score of the window mean against the
  points before ``start``: ``abnormal`` when |z| ≥ ``abnormal_z`` (3);
- ``get_metric_values(metric, start, end)`` — the points in the window;
- ``get_slow_queries(start, end)`` — the slowest statements in the window;
- ``get_configuration_changes(start, end)`` — parameter changes in the window.

Times are ISO 8601 (``2025-03-01T08:52``), compared to the minute. An Expert's **expected
calls** are its checklist (``checks`` in the YAML) over the alert window. Tool-call correctness
compares canonical call keys (:func:`call_key`: tool, metric, start and end minute) of the
scored tools — ``check_metric_abnormal``, ``get_slow_queries``,
``get_configuration_changes``; ``list_metrics`` and ``get_metric_values`` are exploration and
not scored.
"""

from __future__ import annotations

import datetime as dt
import json
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "MAINTENANCE_FILE",
    "SCORED_TOOLS",
    "TOOLS",
    "MaintenanceError",
    "MetricsAPI",
    "assigner_prompt",
    "call_key",
    "expected_calls",
    "expert_system_prompt",
    "generate_scenario",
    "load_catalogue",
    "maintenance_items",
    "parse_experts",
]

MAINTENANCE_FILE = Path(__file__).resolve().parents[2] / "data" / "lifecycle" / "maintenance.yaml"
SCORED_TOOLS = ("check_metric_abnormal", "get_slow_queries", "get_configuration_changes")

_WINDOW = {
    "start": {"type": "string", "description": "window start, ISO 8601 (e.g. 2025-03-01T08:52)"},
    "end": {"type": "string", "description": "window end, ISO 8601 (inclusive)"},
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "list_metrics",
            "description": "List the monitored metrics with their units and descriptions.",
            "parameters": {"type": "object", "properties": {}},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "check_metric_abnormal",
            "description": "Check whether a metric was abnormal in a time window, compared with "
            "its values before the window (z-score of the window mean).",
            "parameters": {
                "type": "object",
                "properties": {"metric": {"type": "string"}, **_WINDOW},
                "required": ["metric", "start", "end"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_metric_values",
            "description": "The one-minute values of a metric in a time window.",
            "parameters": {
                "type": "object",
                "properties": {"metric": {"type": "string"}, **_WINDOW},
                "required": ["metric", "start", "end"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_slow_queries",
            "description": "The slowest SQL statements executed in a time window.",
            "parameters": {
                "type": "object",
                "properties": dict(_WINDOW),
                "required": ["start", "end"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_configuration_changes",
            "description": "Server configuration parameters changed in a time window.",
            "parameters": {
                "type": "object",
                "properties": dict(_WINDOW),
                "required": ["start", "end"],
            },
        },
    },
]
_TOOL_NAMES = {t["function"]["name"] for t in TOOLS}

# statements reported by get_slow_queries (Chinook-style workload)
_STATEMENTS = (
    "SELECT c.Country, sum(i.Total) FROM Invoice i JOIN Customer c ON c.CustomerId = i.CustomerId GROUP BY c.Country",
    "SELECT t.Name, count(*) FROM InvoiceLine l JOIN Track t ON t.TrackId = l.TrackId GROUP BY t.Name ORDER BY 2 DESC",
    "SELECT * FROM Track WHERE Composer LIKE '%Bach%'",
    "UPDATE Invoice SET Total = Total * 1.1 WHERE BillingCountry = 'USA'",
    "SELECT a.Title, ar.Name FROM Album a JOIN Artist ar ON ar.ArtistId = a.ArtistId",
    "SELECT CustomerId, avg(Total) FROM Invoice GROUP BY CustomerId HAVING avg(Total) > 5",
)


class MaintenanceError(ValueError):
    """The maintenance catalogue is missing or malformed (the message names the file/field)."""


def load_catalogue(path: str | Path | None = None) -> dict:
    """The scenario catalogue (``data/lifecycle/maintenance.yaml`` by default), validated with
    :class:`schemas.lifecycle.MaintenanceCatalogue` (every check and effect names a known
    metric, every root cause known experts). Raises :class:`MaintenanceError`."""
    from pydantic import ValidationError

    from schemas.lifecycle import MaintenanceCatalogue

    p = Path(path or MAINTENANCE_FILE)
    try:
        raw = yaml.safe_load(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise MaintenanceError(f"{p}: maintenance catalogue not found") from None
    except yaml.YAMLError as e:
        raise MaintenanceError(f"{p}: not valid YAML: {e}") from None
    try:
        return MaintenanceCatalogue.model_validate(raw).model_dump()
    except ValidationError as e:
        first = e.errors()[0]
        loc = ".".join(str(x) for x in first["loc"]) or "-"
        raise MaintenanceError(f"{p}: {loc}: {first['msg']}") from None


def _iso(t: dt.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M")


def parse_time(value: Any) -> dt.datetime | None:
    """An ISO 8601 time (``Z``, seconds and a space separator accepted) truncated to the
    minute, without time zone; None when unreadable."""
    if not isinstance(value, str):
        return None
    s = value.strip().replace(" ", "T", 1)
    s = s.removesuffix("Z")
    try:
        t = dt.datetime.fromisoformat(s)
    except ValueError:
        return None
    return t.replace(tzinfo=None, second=0, microsecond=0)


def generate_scenario(catalogue: dict, index: int, seed: int) -> dict:
    """Scenario ``index`` (module docstring). Returns ``{"scenario_id", "root_cause",
    "experts" (sorted), "instance", "start", "end" (ISO minutes), "alert", "times",
    "series": {metric: [value per minute]}, "events", "slow_queries"}``."""
    causes = sorted(catalogue["root_causes"])
    cause = causes[index % len(causes)]
    spec = catalogue["root_causes"][cause]
    rng = random.Random(f"{seed}:maintenance:{index}")
    n = int(catalogue["series_minutes"])
    t0 = dt.datetime.fromisoformat(catalogue["start_time"])
    start = rng.randint(40, min(80, n - 31))
    length = rng.randint(15, 30)
    end = start + length - 1
    series = {}
    for name, m in sorted(catalogue["metrics"].items()):
        shift = float(spec["effects"].get(name, 0.0)) * m["sd"]
        series[name] = [
            round(rng.gauss(m["baseline"], m["sd"]) + (shift if start <= i <= end else 0.0), 4)
            for i in range(n)
        ]
    instance = f"db-prod-{rng.randint(1, 40):02d}"
    t_start, t_end = t0 + dt.timedelta(minutes=start), t0 + dt.timedelta(minutes=end)
    rules = "; ".join(spec["alert"])
    alert = (
        f"[ALERT] database instance {instance}: {rules}. Anomaly window: {_iso(t_start)} to "
        f"{_iso(t_end)} (UTC). Response times of the application rose during the window."
    )
    heavy = "slow_queries" in spec["effects"]
    slow = []
    for j, stmt in enumerate(rng.sample(_STATEMENTS, 3)):
        slow.append(
            {
                "sql": stmt,
                "calls": rng.randint(50, 400),
                "mean_ms": round(
                    rng.uniform(2500, 9000) if heavy and j == 0 else rng.uniform(900, 1500), 1
                ),
            }
        )
    events = [
        {"time": _iso(t_start), **{k: str(v) for k, v in e.items()}}
        for e in spec.get("events") or []
    ]
    return {
        "scenario_id": f"s{index:03d}",
        "root_cause": cause,
        "experts": sorted(spec["experts"]),
        "instance": instance,
        "start": _iso(t_start),
        "end": _iso(t_end),
        "alert": alert,
        "times": [_iso(t0 + dt.timedelta(minutes=i)) for i in range(n)],
        "series": series,
        "events": events,
        "slow_queries": sorted(slow, key=lambda r: -r["mean_ms"]),
    }


@dataclass
class MetricsAPI:
    """The simulated monitoring API of one scenario. :meth:`call` answers a tool call."""

    scenario: dict
    catalogue: dict

    def _window(self, start: Any, end: Any) -> tuple[int, int]:
        ts, te = parse_time(start), parse_time(end)
        if ts is None or te is None:
            raise ValueError(f"start and end must be ISO 8601 times, got {start!r}, {end!r}")
        if te < ts:
            raise ValueError("end is before start")
        t0 = parse_time(self.scenario["times"][0])
        i0 = int((ts - t0).total_seconds() // 60)
        i1 = int((te - t0).total_seconds() // 60)
        n = len(self.scenario["times"])
        if i1 < 0 or i0 >= n:
            raise ValueError(
                f"the window is outside the monitored period {self.scenario['times'][0]} to "
                f"{self.scenario['times'][-1]}"
            )
        return max(i0, 0), min(i1, n - 1)

    def _metric(self, name: Any) -> list[float]:
        if not isinstance(name, str) or name not in self.scenario["series"]:
            raise ValueError(f"unknown metric {name!r}; call list_metrics for the names")
        return self.scenario["series"][name]

    def call(self, name: str, arguments: dict | str | None) -> tuple[str, bool]:
        """``(result JSON text, success)`` of tool ``name`` with ``arguments`` (a dict or its
        JSON text). A bad tool name or argument is an unsuccessful call whose result is
        ``{"error": ...}`` (shown to the agent)."""
        try:
            args = json.loads(arguments) if isinstance(arguments, str) else dict(arguments or {})
            if not isinstance(args, dict):
                raise TypeError("arguments must be a JSON object")
            return json.dumps(self._dispatch(name, args)), True
        except (ValueError, TypeError) as e:
            return json.dumps({"error": str(e)}), False

    def _dispatch(self, name: str, args: dict) -> Any:
        if name == "list_metrics":
            return [
                {"metric": k, "unit": m["unit"], "description": m["description"]}
                for k, m in sorted(self.catalogue["metrics"].items())
            ]
        if name == "check_metric_abnormal":
            values = self._metric(args.get("metric"))
            i0, i1 = self._window(args.get("start"), args.get("end"))
            base = values[:i0]
            win = values[i0 : i1 + 1]
            if len(base) < 2:
                raise ValueError("not enough history before the window to compare with")
            mean_b = sum(base) / len(base)
            sd_b = (sum((v - mean_b) ** 2 for v in base) / (len(base) - 1)) ** 0.5 or 1e-9
            mean_w = sum(win) / len(win)
            z = (mean_w - mean_b) / sd_b
            return {
                "metric": args["metric"],
                "start": self.scenario["times"][i0],
                "end": self.scenario["times"][i1],
                "abnormal": abs(z) >= float(self.catalogue["abnormal_z"]),
                "z_score": round(z, 2),
                "baseline_mean": round(mean_b, 3),
                "window_mean": round(mean_w, 3),
            }
        if name == "get_metric_values":
            values = self._metric(args.get("metric"))
            i0, i1 = self._window(args.get("start"), args.get("end"))
            return {
                "metric": args["metric"],
                "points": [[self.scenario["times"][i], values[i]] for i in range(i0, i1 + 1)],
            }
        if name == "get_slow_queries":
            self._window(args.get("start"), args.get("end"))
            return self.scenario["slow_queries"]
        if name == "get_configuration_changes":
            i0, i1 = self._window(args.get("start"), args.get("end"))
            lo, hi = self.scenario["times"][i0], self.scenario["times"][i1]
            return [e for e in self.scenario["events"] if lo <= e["time"] <= hi]
        raise ValueError(f"unknown tool {name!r}; tools: {sorted(_TOOL_NAMES)}")


def call_key(name: str, arguments: dict | str | None) -> tuple | None:
    """The canonical key of a scored call: ``(tool, metric lower-cased or "", start, end)``
    with times as ISO minutes (unreadable times kept as given, so they match nothing); None
    for an exploration tool or unreadable arguments."""
    if name not in SCORED_TOOLS:
        return None
    try:
        args = json.loads(arguments) if isinstance(arguments, str) else dict(arguments or {})
    except (ValueError, TypeError):
        return None
    if not isinstance(args, dict):
        return None

    def t(v: Any) -> str:
        p = parse_time(v)
        return _iso(p) if p is not None else f"?{v}"

    metric = (
        str(args.get("metric") or "").strip().lower() if name == "check_metric_abnormal" else ""
    )
    return (name, metric, t(args.get("start")), t(args.get("end")))


def expected_calls(scenario: dict, expert: str, catalogue: dict) -> list[dict]:
    """The calls ``expert`` is expected to make for ``scenario``: its checklist over the alert
    window, as ``[{"name", "arguments": {...}}]``."""
    out = []
    for check in catalogue["experts"][expert]["checks"]:
        kind, _, target = check.partition(":")
        window = {"start": scenario["start"], "end": scenario["end"]}
        if kind == "metric":
            out.append({"name": "check_metric_abnormal", "arguments": {"metric": target, **window}})
        else:
            out.append({"name": target, "arguments": window})
    return out


def assigner_prompt(scenario: dict, catalogue: dict) -> str:
    """The user turn of an Assigner item: the alert and the eight experts."""
    experts = "\n".join(f"- {k}: {v['description']}" for k, v in catalogue["experts"].items())
    return (
        f"{scenario['alert']}\n\nThe diagnosis team has these experts:\n{experts}\n\n"
        "Assign the experts who should diagnose this alert: every expert whose area the "
        "symptoms point to, and no other. Answer with one JSON object in a ```json code block: "
        '{"experts": ["<name>", ...]}'
    )


def expert_system_prompt(expert: str, catalogue: dict) -> str:
    """The system turn of an Expert item."""
    desc = catalogue["experts"][expert]["description"]
    return (
        f"You are the {expert} expert of a database diagnosis team ({desc}). Investigate the "
        "alert with the tools: check every metric of your area over the alert's anomaly window "
        "(pass the window's start and end exactly as the alert gives them) and use the other "
        "diagnostic tools of your area. Then answer, without calling tools, with a short "
        "diagnosis naming the abnormal metrics of your area."
    )


def parse_experts(text: str | None, names: list[str]) -> list[str]:
    """The experts an Assigner answer names: the ``experts`` list of a JSON object (or a JSON
    list) in the reply, else every expert name found as a word in the text. Unknown names are
    dropped; result sorted."""
    known = {n.lower() for n in names}
    if not text:
        return []
    for m in re.finditer(r"[{\[]", text):
        try:
            obj, _ = json.JSONDecoder().raw_decode(text[m.start() :])
        except ValueError:
            continue
        lst = obj.get("experts") if isinstance(obj, dict) else obj
        if isinstance(lst, list):
            return sorted({str(x).strip().lower() for x in lst} & known)
    return sorted(n for n in known if re.search(rf"\b{re.escape(n)}\b", text, re.IGNORECASE))


def maintenance_items(
    catalogue: dict, n_scenarios: int, seed: int
) -> tuple[list[dict], list[dict]]:
    """``(assigner items, expert items)`` for ``n_scenarios`` scenarios: one Assigner item per
    scenario (``assigner/<sid>``; reference ``{"experts": [...]}``) and one Expert item per
    right expert (``expert/<sid>/<expert>``; reference ``{"calls": expected calls}``). The
    scenario travels in ``context["scenario"]``."""
    assigner, expert = [], []
    names = list(catalogue["experts"])
    for i in range(n_scenarios):
        sc = generate_scenario(catalogue, i, seed)
        common = {
            "source": "simulated",
            "db_id": sc["instance"],
            "variant": "original",
            "level": 0,
            "seed": seed,
        }
        assigner.append(
            {
                "item_id": f"assigner/{sc['scenario_id']}",
                "phase": "assigner",
                "base_id": sc["scenario_id"],
                **common,
                "prompt": assigner_prompt(sc, catalogue),
                "reference": {"experts": sc["experts"]},
                "context": {"scenario": sc, "expert_names": names},
            }
        )
        for e in sc["experts"]:
            expert.append(
                {
                    "item_id": f"expert/{sc['scenario_id']}/{e}",
                    "phase": "expert",
                    "base_id": sc["scenario_id"],
                    **common,
                    "prompt": sc["alert"],
                    "reference": {"calls": expected_calls(sc, e, catalogue)},
                    "context": {
                        "scenario": sc,
                        "expert": e,
                        "system": expert_system_prompt(e, catalogue),
                    },
                }
            )
    return assigner, expert
