"""DAB's run conditions, as DAB's own code sets them, for datasets imported in DAB's format.

Sources (ucbepic/DataAgentBench): ``run_agent.py`` (``--iterations`` default 100, ``--use_hints``
appends ``db_description_withhint.txt``, ``exec_python_timeout=600``),
``common_scaffold/DataAgent.py`` (``max_iterations=100``, model call ``timeout=600``,
``exec_python_timeout=600``, results longer than ``PREVIEW_LENGTH`` shown as a preview),
``common_scaffold/prompts/prompt_builder.py`` (``PREVIEW_LENGTH = 10000``),
``stats_scripts/accuracy.py`` (a ``no_tool_call`` ending is invalid without running the
validator), ``common_scaffold/validate/validate.py`` (an empty answer is invalid without
running ``validate.py``), ``common_scaffold/validate/pass_k.py`` and
``stats_scripts/avg_pass_k.py`` (pass@1 per query over the runs found, mean over a dataset's
queries that have runs) and ``docs/data/leaderboards.json`` (the overall figure: the mean of
the dataset figures).

- **Limits** (:data:`DAB_AGENT_DEFAULTS`, :func:`agent_options_for`): the defaults of agents
  on a DAB dataset; an option given explicitly (``--python-timeout``) wins.
- **Scoring** (:func:`dab_rule_verdict`): applied by the score stage to queries with a
  ``dab_script`` validator; ``--score-no-tool-call`` scores a ``no_tool_call`` text instead.
- **The leaderboard figure** (:func:`leaderboard_pass_at_1`).
- **The condition** of a run on a dataset (:func:`dataset_condition`): recorded in
  ``run.json`` and shown in the report.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from tasks.scoring.validate import Verdict

#: Agent options on DAB datasets when not given explicitly (AgentOptions fields).
DAB_AGENT_DEFAULTS: dict[str, Any] = {
    "max_iterations": 100,          # DataAgent(max_iterations=100), run_agent.py --iterations
    "python_timeout_s": 600.0,      # run_agent.py: DataAgent(exec_python_timeout=600)
    "python_cpu_s": 600,            # (querylab's CPU cap for that cell, matched to it)
    "request_timeout_s": 600.0,     # DataAgent.call_llm: chat.completions.create(timeout=600)
    "preview_chars": 10_000,        # prompt_builder.PREVIEW_LENGTH: longer results previewed
    "preview_rows": 10_000,         # DAB shows whole results up to PREVIEW_LENGTH characters
    "preview_value_chars": 10_000,  # (no per-value cut in DAB's preview)
    # DAB has no limit per trial (100 calls x up to 600 s each); querylab's backstop: 12 h
    "max_wall_time_s": 43_200.0,
}

#: What each default means, for the report.
DAB_LIMITS_TEXT = (
    "100 model calls, 600 s per execute_python call (and per model request), tool results "
    "shown whole up to 10,000 characters (DAB's PREVIEW_LENGTH), no per-trial time limit in "
    "DAB (querylab stops a trial after 12 h)"
)

#: The reason recorded for a ``no_tool_call`` ending on a DAB dataset.
NO_TOOL_CALL_REASON = ("no_tool_call ending: invalid under DAB's rule (stats_scripts/"
                       "accuracy.py scores it without running validate.py; "
                       "--score-no-tool-call scores its text)")
#: The reason recorded for an empty answer on a DAB dataset.
EMPTY_ANSWER_REASON = ("empty answer: invalid under DAB's rule (common_scaffold/validate/"
                       "validate.py does not run validate.py on an empty answer)")


def is_dab(manifest: dict) -> bool:
    """True for a dataset imported in DAB's format (:mod:`tasks.datasets.dab_import`)."""
    return manifest.get("format") == "dab"


def agent_options_for(manifest: dict, explicit: dict | None) -> dict:
    """The agent options of a run on ``manifest``: for a DAB dataset
    :data:`DAB_AGENT_DEFAULTS` overlaid with the options given explicitly (``explicit``: what
    the user set, e.g. ``{"python_timeout_s": 60}``); for any other dataset ``explicit``
    itself."""
    if not is_dab(manifest):
        return dict(explicit or {})
    return {**DAB_AGENT_DEFAULTS, **(explicit or {})}


def dab_rule_verdict(terminate_reason: str, answer: str | None,
                     score_no_tool_call: bool = False) -> Verdict | None:
    """DAB's verdict for a trial of a DAB query when DAB decides without its ``validate.py``:
    a ``no_tool_call`` ending is invalid (unless ``score_no_tool_call``), and so is an empty
    answer (``""``); None when the validator decides."""
    if terminate_reason == "no_tool_call" and not score_no_tool_call:
        return Verdict(False, NO_TOOL_CALL_REASON)
    if answer is not None and answer == "":
        return Verdict(False, EMPTY_ANSWER_REASON)
    return None


def dataset_condition(manifest: dict, explicit: dict | None, hints: list[str],
                      score_no_tool_call: bool) -> dict:
    """The condition a run's agents ran a dataset under: ``format`` (``dab`` or ``querylab``),
    ``hints`` (the run's hint conditions), ``agent_options`` (the effective options that
    differ from querylab's defaults for this dataset: DAB's limits on a DAB dataset, with the
    explicit ones over them) and ``scoring`` (the rules applied besides the validator)."""
    from schemas.models import AgentOptions

    effective = AgentOptions.model_validate(agent_options_for(manifest, explicit))
    differing = effective.model_dump(exclude_defaults=True)
    rules = []
    if is_dab(manifest):
        rules.append("no_tool_call endings scored by their text (--score-no-tool-call)"
                     if score_no_tool_call else "no_tool_call endings invalid (DAB)")
        rules.append("empty answers invalid (DAB)")
        rules.append("validate.py in a sandbox with its query folder; a crash is errored")
    return {
        "format": "dab" if is_dab(manifest) else "querylab",
        "hints": list(hints),
        "agent_options": differing,
        "scoring": rules,
        "limits": DAB_LIMITS_TEXT if is_dab(manifest) else None,
    }


# --------------------------------------------------------------------------------------------
# The leaderboard figure
# --------------------------------------------------------------------------------------------


def pass_at_k(n: int, c: int, k: int) -> float:
    """DAB's ``common_scaffold/validate/pass_k.py``: 0 when ``c == 0``, 1 when ``n - c < k``,
    else ``1 - C(n-c, k) / C(n, k)``."""
    from math import comb

    if c == 0:
        return 0.0
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def leaderboard_pass_at_1(scores: pl.DataFrame) -> dict[str, dict]:
    """DAB's leaderboard pass@1 per agent, computed as DAB's scripts compute it from the
    scores of a run (``dataset``, ``query_id``, ``agent``, ``terminate_reason``, ``verdict``,
    ``is_correct``).

    A DAB *run* of a query is a trial with a recorded ending: replay trials without an entry
    in the answer file (``no_answer``) are not runs (``accuracy.discover_runs`` finds only the
    runs that exist); a trial that ended ``api_error`` / ``error`` is a run with an invalid
    answer (DAB's agent records an empty ``final_result`` for it). Per query
    ``pass@1 = pass_at_k(n, c, 1)`` over its runs; per dataset the mean over its queries with
    at least one run (``avg_pass_k.py``); overall the mean of the dataset figures (the
    leaderboard's ``Average``). A trial whose ``validate.py`` errored would stop DAB's
    scripts: it is left out and counted in ``validator_errors``.

    Returns agent → ``{"pass_at_1", "datasets": [{"dataset", "queries", "runs", "correct",
    "pass_at_1"}], "queries": [{"dataset", "query_id", "runs", "correct", "pass_at_1"}],
    "missing_runs" (no_answer trials), "validator_errors", "pass_at_1_missing_as_failures"}``
    (the last: the same figure with no_answer trials counted as invalid runs, as the
    leaderboard counted two missing trials of one submission)."""
    out: dict[str, dict] = {}
    if scores.is_empty():
        return out
    errored_trial = pl.col("terminate_reason").is_in(["api_error", "error"])
    validator_error = (pl.col("verdict") == "errored") & ~errored_trial
    for (agent,), rows in scores.group_by("agent", maintain_order=True):
        missing = rows.filter(pl.col("terminate_reason") == "no_answer").height
        bad = rows.filter(validator_error).height
        main = _figure(rows.filter(~validator_error & (pl.col("terminate_reason") != "no_answer")))
        alt = _figure(rows.filter(~validator_error))
        out[agent] = {**main, "missing_runs": missing, "validator_errors": bad,
                      "pass_at_1_missing_as_failures": alt["pass_at_1"]}
    return out


def _figure(rows: pl.DataFrame) -> dict:
    per_query = (
        rows.with_columns(pl.col("is_correct").fill_null(False).cast(pl.Int64).alias("_c"))
        .group_by("dataset", "query_id", maintain_order=True)
        .agg(pl.len().alias("runs"), pl.col("_c").sum().alias("correct"))
        .sort("dataset", "query_id")
    )
    queries = [
        {**r, "pass_at_1": pass_at_k(r["runs"], r["correct"], 1)}
        for r in per_query.iter_rows(named=True) if r["runs"] > 0
    ]
    datasets = []
    for name in sorted({q["dataset"] for q in queries}):
        qs = [q for q in queries if q["dataset"] == name]
        datasets.append({
            "dataset": name, "queries": len(qs), "runs": sum(q["runs"] for q in qs),
            "correct": sum(q["correct"] for q in qs),
            "pass_at_1": sum(q["pass_at_1"] for q in qs) / len(qs),
        })
    overall = (sum(d["pass_at_1"] for d in datasets) / len(datasets)) if datasets else None
    return {"pass_at_1": overall, "datasets": datasets, "queries": queries}


def condition_notes(artifacts_root: str, run_id: str) -> list[str]:
    """Report notes: the condition of the run's DAB datasets (from ``run.json``, recorded by
    the datasets stage): hints, the limits in force and the scoring rules. [] for runs
    without DAB datasets or without a record."""
    from tasks.core import runs

    try:
        record = runs.find_run(artifacts_root, run_id)
    except Exception:  # noqa: BLE001 - no record, no note
        return []
    if record is None:
        return []
    dab = {n: c for n, c in record.conditions.items() if c.get("format") == "dab"}
    if not dab:
        return []
    notes = []
    by_text: dict[str, list[str]] = {}
    for name, c in dab.items():
        explicit = {k: v for k, v in c.get("agent_options", {}).items()
                    if DAB_AGENT_DEFAULTS.get(k) != v}
        text = (f"hints {'/'.join(c.get('hints') or ['off'])}; limits as DAB: {c.get('limits')}"
                + (f" (given explicitly: {explicit})" if explicit else "")
                + "; scoring: " + ", ".join(c.get("scoring") or []))
        by_text.setdefault(text, []).append(name)
    for text, names in by_text.items():
        notes.append(f"DAB condition of {', '.join(f'`{n}`' for n in sorted(names))}: {text}.")
    return notes
