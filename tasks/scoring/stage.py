"""Scoring: the only place answers meet the answer key.

A built (or imported) dataset has two files under ``<root>/datasets/<name>/<version>/``:

- ``manifest.json`` — the **public trial manifest**: databases, description, hints, schema
  description, each query's ``id`` and ``question``. The trials stage, the tools and every
  agent read only this.
- ``scoring.json`` — the **private scoring file**: per query its
  ``ground_truth``, ``validator``, ``reference`` (solution as tool calls) and ``requires``
  (sources and operations, for failure modes), plus the ``canonical`` table URIs and the
  ``spec_file``. Read only by scorer-side code: this module, the report (failure modes, LLM
  judge, viewer) and the trusted ``oracle`` agent (its reference solutions). Writing, reading
  and digests of the two files: :mod:`tasks.scoring.scoring_file`.

The score step (its own stage, ``datasets → trials → score → report``) reads a run's
``trials.parquet`` (answers and terminate reasons, no verdicts), applies each query's validator
and writes ``runs/<run_id>/score/scores.parquet`` (schema :data:`schemas.artifacts.SCORES`): a
verdict per trial — ``correct`` / ``incorrect`` / ``errored`` — with the validator's reason and
:data:`SCORER_VERSION`. It also runs the trace audit (:mod:`tasks.scoring.audit`) into
``score/audit.parquet`` and writes ``score/summary.json``. Re-scoring (``querylab rescore``)
re-applies the (possibly fixed) validators to the stored answers and makes no model call.

Errored is not incorrect: a trial that ended ``api_error`` or ``error`` (an infrastructure or
harness failure, :data:`ERRORED_REASONS`) gets verdict ``errored`` and no ``is_correct``; the
report leaves it out of every denominator and counts it beside them.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

import polars as pl
import pyarrow as pa

from schemas import artifacts
from tasks.core import storage
from tasks.scoring.scoring_file import ScoringError, full_manifest, load_scoring, scoring_digest
from tasks.scoring.validate import check_answer
from tasks.core.layout import DatasetLayout, RunLayout

log = logging.getLogger("querylab.scoring")

#: Bump when a verdict rule changes (recorded in every ``scores`` row and ``summary.json``).
SCORER_VERSION = "3"
#: Terminate reasons of infrastructure or harness failures: such a trial has no verdict.
ERRORED_REASONS = frozenset({"api_error", "error"})
#: Verdicts of a ``scores`` row.
VERDICTS = ("correct", "incorrect", "errored")
#: ``errored_by_reason`` key of errored verdicts whose validator gave none (the trial itself
#: ended normally): fix the validator and rescore, re-running the trial changes nothing.
VALIDATOR_ERROR = "validator_error"


# --------------------------------------------------------------------------------------------
# The dataset files: public manifest, private scoring file
# --------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------
# Verdicts
# --------------------------------------------------------------------------------------------


def is_errored(terminate_reason: str) -> bool:
    """True for a terminate reason of an infrastructure or harness failure."""
    return terminate_reason in ERRORED_REASONS


def validator_digest(query: dict) -> str:
    """12 hex digits identifying what a query is scored with: its validator spec, its ground
    truth and, for a ``dab_script`` validator, the script's bytes. A changed validator gives
    a new digest (``scores.validator_digest``)."""
    h = hashlib.sha256(
        json.dumps([query.get("validator"), query.get("ground_truth")], sort_keys=True,
                   default=str).encode()
    )
    v = query.get("validator") or {}
    if v.get("kind") == "dab_script":
        try:
            h.update(storage.read_bytes(str(v["script"])))
        except (OSError, KeyError):
            h.update(b"<script unreadable>")
    return h.hexdigest()[:12]


def _first_line(text: str | None, limit: int = 300) -> str:
    return (text or "").strip().splitlines()[0][:limit] if (text or "").strip() else ""


def score_rows(trials: Iterable[dict], scorings: dict[str, dict],
               questions: dict[tuple[str, str], str] | None = None,
               score_no_tool_call: bool = False) -> list[dict]:
    """One ``scores`` row per trial (see :data:`schemas.artifacts.SCORES`).

    ``trials``: trial rows (``TRIALS`` columns); ``scorings``: dataset name → its scoring file
    (:func:`load_scoring`); ``questions``: (dataset, query id) → question text (the validators
    tell numbers the question names apart from candidate answers; :func:`load_questions`). An
    errored trial (:data:`ERRORED_REASONS`) is not validated. A validator that fails to give a
    verdict (a DAB ``validate.py`` that raised) makes the verdict ``errored`` too, with its
    traceback as the reason. Queries of DAB datasets follow DAB's scoring rules first
    (:func:`dab_verdict`; ``score_no_tool_call`` lifts the ``no_tool_call`` one). Raises
    ScoringError for a trial whose dataset or query has no scoring entry, or whose
    ``dataset_version`` differs from the scoring file's."""
    digests: dict[tuple[str, str], str] = {}
    out = []
    for t in trials:
        row = {
            "run_id": t["run_id"], "trial_key": t["trial_key"], "agent": t["agent"],
            "dataset": t["dataset"], "query_id": t["query_id"], "trial": t["trial"],
            "terminate_reason": t["terminate_reason"], "answer": t["answer"],
            "verdict": "errored", "is_correct": None, "reason": None, "validator": None,
            "validator_digest": None, "scorer_version": SCORER_VERSION, "audit_flags": 0,
        }
        scoring = scorings.get(t["dataset"])
        if scoring is None:
            raise ScoringError(f"trial {t['trial_key']}: no scoring file for dataset "
                               f"{t['dataset']!r}")
        version = t.get("dataset_version")
        if version and scoring.get("version") and version != scoring["version"]:
            raise ScoringError(
                f"trial {t['trial_key']} ran on {t['dataset']} version {version}, but the "
                f"scoring file is for version {scoring['version']}"
            )
        query = scoring["queries"].get(t["query_id"])
        if query is None:
            raise ScoringError(f"trial {t['trial_key']}: dataset {t['dataset']!r} has no query "
                               f"{t['query_id']!r} in its scoring file")
        row["validator"] = (query.get("validator") or {}).get("kind")
        key = (t["dataset"], t["query_id"])
        if key not in digests:
            digests[key] = validator_digest(query)
        row["validator_digest"] = digests[key]
        if is_errored(t["terminate_reason"]):
            why = _first_line(t.get("error")) or "no error message"
            row["reason"] = f"errored ({t['terminate_reason']}): {why}"
        else:
            v = dab_verdict(query, t, score_no_tool_call) or check_answer(
                t["answer"], query.get("ground_truth"), query["validator"],
                (questions or {}).get(key))
            if v.errored:  # the validator gave no verdict: errored, not incorrect
                row["reason"] = v.reason
            else:
                row["verdict"] = "correct" if v.ok else "incorrect"
                row["is_correct"] = v.ok
                row["reason"] = v.reason
        out.append(row)
    return out


def score_frame(trials: pl.DataFrame, manifest_uris: list[str]) -> pl.DataFrame:
    """``trials`` (a ``TRIALS`` frame, e.g. one batch's) with their verdicts joined on
    (``verdict``, ``is_correct``, ``reason``), scored with the manifests' scoring files —
    the score step without writing anything (no audit). For checks and tests."""
    rows = score_rows(trials.iter_rows(named=True), load_scorings(manifest_uris),
                      load_questions(manifest_uris))
    return scored_trials(trials, scores_frame(rows))


def scores_frame(rows: list[dict]) -> pl.DataFrame:
    """``scores`` rows as a Polars frame with the :data:`schemas.artifacts.SCORES` types."""
    return pl.from_arrow(pa.Table.from_pylist(rows, schema=artifacts.SCORES))


# --------------------------------------------------------------------------------------------
# The score step of a run
# --------------------------------------------------------------------------------------------


def score_prefix(artifacts_root: str, run_id: str) -> str:
    """``runs/<run_id>/score``."""
    return RunLayout(artifacts_root, run_id).score()


def scores_uri(artifacts_root: str, run_id: str) -> str:
    """URI of a run's ``score/scores.parquet``."""
    return storage.join(score_prefix(artifacts_root, run_id), "scores.parquet")


def audit_uri(artifacts_root: str, run_id: str) -> str:
    """URI of a run's ``score/audit.parquet``."""
    return storage.join(score_prefix(artifacts_root, run_id), "audit.parquet")


def summary_uri(artifacts_root: str, run_id: str) -> str:
    """URI of a run's ``score/summary.json``."""
    return storage.join(score_prefix(artifacts_root, run_id), "summary.json")


def trials_uri(artifacts_root: str, run_id: str, name: str = "trials") -> str:
    """URI of one of a run's combined trial artifacts (``trials/<name>.parquet``)."""
    return RunLayout(artifacts_root, run_id).trials(f"{name}.parquet")


def run_manifest_uris(
    artifacts_root: str, run_id: str, trials: pl.DataFrame, manifest_uris: list[str] | None = None
) -> list[str]:
    """The dataset manifests a run's trials ran on: ``manifest_uris`` when given; else
    ``trials/manifests.json`` (written by the trials stage); else the run record's manifests;
    else ``<root>/datasets/<name>/<dataset_version>/manifest.json`` for each dataset version in
    the trials. ScoringError naming the datasets none of these covers."""
    if manifest_uris:
        return list(manifest_uris)
    recorded = RunLayout(artifacts_root, run_id).trials("manifests.json")
    if storage.exists(recorded):
        return list(storage.read_json(recorded))
    from tasks.core import runs

    record = runs.find_run(artifacts_root, run_id)
    if record is not None and record.manifests:
        return list(record.manifests)
    uris, missing = [], []
    for name, version in trials.select("dataset", "dataset_version").unique().iter_rows():
        uri = DatasetLayout(artifacts_root, name, version or "?").manifest
        (uris if version and storage.exists(uri) else missing).append(uri if version else name)
    if missing:
        raise ScoringError(f"run {run_id!r}: no dataset manifest found for {missing}; pass "
                           "the manifests (`querylab rescore --manifest URI`)")
    return uris


def load_questions(manifest_uris: list[str]) -> dict[tuple[str, str], str]:
    """(dataset, query id) → question, from the public manifests (the first of a name wins)."""
    out: dict[tuple[str, str], str] = {}
    for uri in manifest_uris:
        m = storage.read_json(uri)
        for q in m.get("queries", []):
            out.setdefault((m["name"], q["id"]), q.get("question") or "")
    return out


def load_engines(manifest_uris: list[str]) -> dict[str, dict[str, str]]:
    """Dataset → database → engine, from the public manifests."""
    out: dict[str, dict[str, str]] = {}
    for uri in manifest_uris:
        m = storage.read_json(uri)
        out.setdefault(m["name"], {n: d.get("engine", "") for n, d in m["databases"].items()})
    return out


def load_scorings(manifest_uris: list[str],
                  digests: dict[str, str] | None = None) -> dict[str, dict]:
    """Dataset name → scoring file for each manifest (the first manifest of a name wins),
    each checked against its digest (:func:`load_scoring`; ``digests``: dataset name → the
    digest to load instead of the manifest's)."""
    out: dict[str, dict] = {}
    for uri in manifest_uris:
        name = storage.read_json(uri)["name"]
        if name not in out:
            out[name] = load_scoring(uri, (digests or {}).get(name))
    return out


def run_scoring_digests(artifacts_root: str, run_id: str) -> dict[str, str]:
    """Dataset name → the scoring digest a run was last scored with (``score/summary.json``;
    empty when it was never scored or scored before digests were recorded)."""
    uri = summary_uri(artifacts_root, run_id)
    if not storage.exists(uri):
        return {}
    return dict(storage.read_json(uri).get("scoring") or {})


def run_full_manifests(artifacts_root: str, run_id: str, manifest_uris: list[str]) -> list[dict]:
    """:func:`full_manifest` of each manifest with the scoring the run was scored with (so a
    report or viewer of an old run shows the ground truth its verdicts were decided on, even
    after a spec fix moved the dataset to a newer scoring); a recorded scoring that is gone
    falls back to the current one."""
    digests = run_scoring_digests(artifacts_root, run_id)
    out = []
    for uri in manifest_uris:
        digest = digests.get(storage.read_json(uri)["name"])
        try:
            out.append(full_manifest(uri, digest))
        except ScoringError:
            if digest is None:
                raise
            out.append(full_manifest(uri))
    return out


def score_run(
    run_id: str, artifacts_root: str, manifest_uris: list[str] | None = None
) -> dict[str, Any]:
    """Score every trial of a run and audit its transcripts; write ``score/scores.parquet``,
    ``score/audit.parquet`` and ``score/summary.json``.

    Idempotent and cheap to repeat (``querylab rescore``): the verdicts are recomputed from the
    stored answers with each dataset's current scoring file (checked against the manifest's
    ``scoring_digest``: a hand-edited file is refused); no model is called. Returns
    ``{"scores": uri, "audit": uri, "summary": uri, **summary}`` where the summary holds
    ``scorer_version``, ``scoring`` (dataset → the scoring digest used), ``trials``,
    ``correct``, ``incorrect``, ``errored``,
    ``error_share`` (errored / trials), ``errored_by_reason``, ``flagged`` (trials with audit
    findings) and ``scored_at``. Raises ScoringError (see :func:`run_manifest_uris`,
    :func:`score_rows`) and StorageError when the run has no ``trials.parquet``."""
    from tasks.scoring.audit import audit_run

    uri_t = trials_uri(artifacts_root, run_id)
    if not storage.exists(uri_t):
        raise ScoringError(f"run {run_id!r} has no trials to score (missing {uri_t}); run its "
                           f"trials stage first (`querylab rerun --run-id {run_id} --stage trials`)")
    trials = pl.from_arrow(storage.read_parquet(uri_t, artifacts.TRIALS))
    manifests = run_manifest_uris(artifacts_root, run_id, trials, manifest_uris)
    scorings = load_scorings(manifests)
    questions = load_questions(manifests)
    rows = score_rows(trials.iter_rows(named=True), scorings, questions,
                      score_no_tool_call=run_scores_no_tool_call(artifacts_root, run_id))
    messages_uri = trials_uri(artifacts_root, run_id, "messages")
    tool_calls_uri = trials_uri(artifacts_root, run_id, "tool_calls")
    messages = (pl.from_arrow(storage.read_parquet(messages_uri, artifacts.MESSAGES))
                if storage.exists(messages_uri) else None)
    tool_calls = (pl.from_arrow(storage.read_parquet(tool_calls_uri, artifacts.TOOL_CALLS))
                  if storage.exists(tool_calls_uri) else None)
    findings = audit_run(trials, messages, tool_calls, scorings, questions,
                         load_engines(manifests))
    flags: dict[str, int] = {}
    for f in findings:
        flags[f["trial_key"]] = flags.get(f["trial_key"], 0) + 1
    for r in rows:
        r["audit_flags"] = flags.get(r["trial_key"], 0)
    scores = scores_frame(rows).sort("trial_key")
    out_scores = storage.write_parquet(
        scores_uri(artifacts_root, run_id), scores.to_arrow(), artifacts.SCORES
    )
    out_audit = storage.write_parquet(
        audit_uri(artifacts_root, run_id),
        pa.Table.from_pylist(findings, schema=artifacts.AUDIT), artifacts.AUDIT,
    )
    summary = summarise(scores)
    summary.update(
        scorer_version=SCORER_VERSION, manifests=manifests,
        scoring={name: scoring_digest(sc) for name, sc in sorted(scorings.items())},
        scored_at=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        flagged=len(flags), transcripts=messages is not None,
    )
    out_summary = storage.write_json(summary_uri(artifacts_root, run_id), summary)
    log.info("scored run %s: %d trials, %d correct, %d incorrect, %d errored, %d flagged",
             run_id, summary["trials"], summary["correct"], summary["incorrect"],
             summary["errored"], summary["flagged"])
    return {"scores": out_scores, "audit": out_audit, "summary": out_summary, **summary}


def summarise(scores: pl.DataFrame) -> dict[str, Any]:
    """Counts of a ``scores`` frame: ``trials``, ``correct``, ``incorrect``, ``errored``,
    ``error_share`` (errored / trials, 0 without trials) and ``errored_by_reason``
    (terminate reason → count; :data:`VALIDATOR_ERROR` for validators that gave no verdict);
    with an ``agent`` column also ``by_agent`` (agent → ``{"trials", "errored",
    "error_share"}``: the allowed share of errored trials applies to each agent, so an
    oracle's trials never hide an agent whose every trial errored)."""
    n = scores.height
    count = {v: int((scores["verdict"] == v).sum()) for v in VERDICTS}
    # an errored verdict of a trial that ended normally is its validator's (VALIDATOR_ERROR)
    reason = pl.when(pl.col("terminate_reason").is_in(list(ERRORED_REASONS))).then(
        pl.col("terminate_reason")).otherwise(pl.lit(VALIDATOR_ERROR))
    by_reason = {
        r: int(c) for r, c in scores.filter(pl.col("verdict") == "errored")
        .group_by(reason.alias("r")).len().sort("r").iter_rows()
    }
    out: dict[str, Any] = {
        "trials": n, **count, "error_share": (count["errored"] / n) if n else 0.0,
        "errored_by_reason": by_reason,
    }
    if "agent" in scores.columns:
        per = scores.group_by("agent").agg(
            pl.len().alias("trials"), (pl.col("verdict") == "errored").sum().alias("errored"))
        out["by_agent"] = {
            r["agent"]: {"trials": int(r["trials"]), "errored": int(r["errored"]),
                         "error_share": r["errored"] / r["trials"] if r["trials"] else 0.0}
            for r in per.sort("agent").iter_rows(named=True)
        }
    return out


def load_scores(artifacts_root: str, run_id: str) -> pl.DataFrame:
    """A run's ``scores`` (schema-checked). ScoringError naming the command to run when the
    run has not been scored."""
    return scan_scores(artifacts_root, run_id).collect(engine="streaming")


def scan_scores(artifacts_root: str, run_id: str) -> pl.LazyFrame:
    """A run's ``scores`` as a lazy scan (schema-checked; nothing read until collected);
    ScoringError as :func:`load_scores`."""
    uri = scores_uri(artifacts_root, run_id)
    if not storage.exists(uri):
        raise ScoringError(f"run {run_id!r} has not been scored (missing {uri}): run "
                           f"`querylab rescore --run-id {run_id}`")
    return storage.scan_parquet(uri, artifacts.SCORES)


def scored_trials(
    trials: pl.DataFrame | pl.LazyFrame, scores: pl.DataFrame | pl.LazyFrame, run_id: str = "?",
    verdicts: tuple[str, ...] = ("verdict", "is_correct", "reason", "audit_flags"),
    categorical: tuple[str, ...] = (),
    drop: tuple[str, ...] = (),
) -> pl.DataFrame:
    """``trials`` with the verdict columns of ``scores`` (``verdicts``: by default ``verdict``,
    ``is_correct`` — null for errored trials —, ``reason``, ``audit_flags``) joined on, in the
    order of ``trials``.

    Either may be a lazy scan of the artifact: the join and the staleness check then run as
    streaming queries (the scored answers are compared in them, never kept). When the two are
    aligned row for row (the same, strictly ascending trial keys: the artifacts as querylab
    writes them) the verdicts are put beside the trials by position instead of by a join on
    the keys (the same rows, less memory and time). ``categorical`` names String columns (of
    ``trials`` or ``verdicts``) to hold as ``pl.Categorical``: same values, 4 bytes a row
    instead of at least 16 (for low-cardinality columns such as agent, dataset, query_id or
    verdict of a large run), cast as the rows stream in. ``drop``: trial columns the staleness
    check reads but the result leaves out (e.g. the answers, once their check is done).
    Raises ScoringError when the scores are stale: a trial without a score, or scored with
    another answer or terminate reason than it has now (trials re-run after scoring)."""
    names = trials.collect_schema().names()
    cat = [c for c in categorical if c in names]
    scores = scores.lazy()
    trials = trials.lazy()
    reason = pl.col("terminate_reason").cast(pl.String)  # a no-op if the caller made it categorical
    stale = (
        pl.col("verdict").is_null()
        | (pl.col("_scored_reason") != reason)
        | pl.col("_scored_answer").ne_missing(pl.col("answer"))
    ).fill_null(True)
    scored = scores.select(pl.col("trial_key").alias("_scored_key"), "verdict",
                           pl.col("answer").alias("_scored_answer"),
                           pl.col("terminate_reason").alias("_scored_reason"))
    keys = trials.select("trial_key", "answer", "terminate_reason")
    # the artifacts as querylab writes them (both sorted by trial key: combine_trials,
    # score_run) are aligned row for row: then the scores are put beside the trials by
    # position, with no hash table of the keys (at 10M trials the load took 1.5 s and 1.7 GB
    # instead of 10 s and 2.6 GB). Aligned = the same key in every row and the keys strictly
    # ascending (so unique: what the join would match), checked in one streaming pass that
    # also counts the stale rows.
    ascending = (
        pl.col("trial_key") < pl.col("_next_key")
    ).fill_null(True)  # the last row has no next one
    n_trials, n_scores = (lf.select(pl.len()).collect().item() for lf in (trials, scores))
    aligned = n_trials == n_scores
    if aligned:  # equal heights (from the Parquet footers): rows may be paired by position
        following = pl.concat([  # each row's next key; null after the last
            trials.select(pl.col("trial_key").alias("_next_key")).slice(1),
            pl.LazyFrame({"_next_key": [None]}, schema={"_next_key": pl.String}),
        ]).head(n_trials)
        aligned, n_stale, first = (
            pl.concat([keys, scored, following], how="horizontal")
            .select(
                ((pl.col("trial_key") == pl.col("_scored_key")).fill_null(False) & ascending)
                .all().alias("aligned"),
                stale.sum().alias("n"),
                pl.col("trial_key").filter(stale).first().alias("first"),
            )
            .collect(engine="streaming")
            .row(0)
        )
    if not aligned:
        # the staleness check is a query of its own, reduced to a count and the first stale key
        # as it streams: the scored answers and reasons never sit beside the joined columns (at
        # 10M trials the load's peak RSS fell from 3.03 to 2.66 GB; the trials are read twice)
        n_stale, first = (
            keys.join(scored.rename({"_scored_key": "trial_key"}), on="trial_key", how="left",
                      maintain_order="left")
            .select(stale.sum().alias("n"),
                    pl.col("trial_key").filter(stale).first().alias("first"))
            .collect(engine="streaming")
            .row(0)
        )
    if n_stale:
        raise ScoringError(
            f"run {run_id!r}: the scores are stale for {n_stale} trial(s) (e.g. "
            f"{first}): run `querylab rescore --run-id {run_id}`"
        )
    s = scores.select(
        "trial_key", *[pl.col(c).cast(pl.Categorical) if c in categorical else pl.col(c)
                       for c in verdicts],
    )
    left = trials.drop(
        [c for c in ("verdict", "is_correct", "reason", "audit_flags", *drop) if c in names]
    ).with_columns(pl.col(c).cast(pl.Categorical) for c in cat)
    if aligned:
        return pl.concat([left, s.drop("trial_key")], how="horizontal").collect(
            engine="streaming")
    return left.join(s, on="trial_key", how="left", maintain_order="left").collect(
        engine="streaming")


# --------------------------------------------------------------------------------------------
# DAB's scoring rules (datasets imported in DAB's format; see tasks.scoring.dab_rules)
# --------------------------------------------------------------------------------------------


def dab_verdict(query: dict, trial: dict, score_no_tool_call: bool = False):
    """DAB's own verdict for a trial of a DAB query (validator kind ``dab_script``) when DAB
    decides without the query's ``validate.py`` — a ``no_tool_call`` ending (unless
    ``score_no_tool_call``) or an empty answer is invalid
    (:func:`tasks.scoring.dab_rules.dab_rule_verdict`); None otherwise (the validator decides)."""
    if (query.get("validator") or {}).get("kind") != "dab_script":
        return None
    from tasks.scoring.dab_rules import dab_rule_verdict

    return dab_rule_verdict(trial["terminate_reason"], trial["answer"], score_no_tool_call)


def run_scores_no_tool_call(artifacts_root: str, run_id: str) -> bool:
    """Whether the run asked to score ``no_tool_call`` texts on DAB datasets
    (``--score-no-tool-call``, recorded in ``run.json``); False for runs without a record."""
    from tasks.core import runs

    try:
        record = runs.find_run(artifacts_root, run_id)
    except Exception:  # noqa: BLE001 - an unreadable record: DAB's default rule
        return False
    bench = record.benchmark if record is not None else None
    return bool(getattr(bench, "score_no_tool_call", False))
