"""Scoring: the only place answers meet the answer key.

A built (or imported) dataset has two files under ``<root>/datasets/<name>/<version>/``:

- ``manifest.json`` — the **public trial manifest**: databases, description, hints, schema
  description, each query's ``id`` and ``question``. The trials stage, the tools and every
  agent read only this.
- ``scoring.json`` — the **private scoring file** (:func:`scoring_uri`): per query its
  ``ground_truth``, ``validator``, ``reference`` (solution as tool calls) and ``requires``
  (sources and operations, for failure modes), plus the ``canonical`` table URIs and the
  ``spec_file``. Read only by scorer-side code: this module, the report (failure modes, LLM
  judge, viewer) and the trusted ``oracle`` agent (its reference solutions).

The score step (its own stage, ``datasets → trials → score → report``) reads a run's
``trials.parquet`` (answers and terminate reasons, no verdicts), applies each query's validator
and writes ``runs/<run_id>/score/scores.parquet`` (schema :data:`schemas.artifacts.SCORES`): a
verdict per trial — ``correct`` / ``incorrect`` / ``errored`` — with the validator's reason and
:data:`SCORER_VERSION`. It also runs the trace audit (:mod:`tasks.audit`) into
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
from tasks import storage
from tasks.validate import check_answer

log = logging.getLogger("querylab.scoring")

#: Bump when a verdict rule changes (recorded in every ``scores`` row and ``summary.json``).
SCORER_VERSION = "3"
#: Version of the public/private dataset layout; older manifests are rebuilt.
MANIFEST_VERSION = 2
#: Terminate reasons of infrastructure or harness failures: such a trial has no verdict.
ERRORED_REASONS = frozenset({"api_error", "error"})
#: Per-query keys that only the scorer (and the trusted oracle) may read.
PRIVATE_QUERY_KEYS = ("ground_truth", "validator", "reference", "requires")
#: Manifest-level keys that only the scorer may read.
PRIVATE_MANIFEST_KEYS = ("canonical", "spec_file")
#: Verdicts of a ``scores`` row.
VERDICTS = ("correct", "incorrect", "errored")


class ScoringError(ValueError):
    """A run cannot be scored as asked (no trials, a missing scoring file, a trial for a query
    the scoring file lacks, stale scores). The message names what and how to fix it."""


# --------------------------------------------------------------------------------------------
# The dataset files: public manifest, private scoring file
# --------------------------------------------------------------------------------------------


def scoring_uri(manifest_uri: str) -> str:
    """URI of the private scoring file beside a public ``manifest.json``."""
    if not manifest_uri.endswith("manifest.json"):
        raise ScoringError(f"{manifest_uri}: not a dataset manifest.json")
    return manifest_uri[: -len("manifest.json")] + "scoring.json"


def split_manifest(manifest_uri: str, full: dict) -> str:
    """Write a dataset's full description as the public ``manifest.json`` and the private
    ``scoring.json`` (see the module docstring); returns the manifest URI.

    ``full`` has the public keys plus :data:`PRIVATE_MANIFEST_KEYS` and, per query,
    :data:`PRIVATE_QUERY_KEYS`. The scoring file is written first and the manifest last, so a
    manifest in the current layout means both exist (:func:`is_current_dataset`)."""
    public = {k: v for k, v in full.items() if k not in (*PRIVATE_MANIFEST_KEYS, "queries")}
    public["manifest_version"] = MANIFEST_VERSION
    public["queries"] = [
        {k: v for k, v in q.items() if k not in PRIVATE_QUERY_KEYS} for q in full["queries"]
    ]
    private = {
        "name": full["name"],
        "version": full["version"],
        "manifest_version": MANIFEST_VERSION,
        **{k: full[k] for k in PRIVATE_MANIFEST_KEYS if k in full},
        "queries": {
            q["id"]: {k: q[k] for k in PRIVATE_QUERY_KEYS if k in q} for q in full["queries"]
        },
    }
    storage.write_json(scoring_uri(manifest_uri), private)
    return storage.write_json(manifest_uri, public)


def is_current_dataset(manifest_uri: str) -> bool:
    """True when ``manifest_uri`` and its scoring file exist in the current layout (an older
    manifest that carried ground truth itself is rebuilt)."""
    if not (storage.exists(manifest_uri) and storage.exists(scoring_uri(manifest_uri))):
        return False
    try:
        return storage.read_json(manifest_uri).get("manifest_version") == MANIFEST_VERSION
    except (OSError, ValueError):
        return False


def _legacy_scoring(manifest: dict) -> dict:
    """The scoring file of a manifest from before the split (answers inline)."""
    return {
        "name": manifest["name"], "version": manifest.get("version"),
        **{k: manifest[k] for k in PRIVATE_MANIFEST_KEYS if k in manifest},
        "queries": {q["id"]: {k: q[k] for k in PRIVATE_QUERY_KEYS if k in q}
                    for q in manifest.get("queries", [])},
    }


def load_scoring(manifest_uri: str) -> dict:
    """The private scoring file of a dataset manifest (scorer side only): ``{"name",
    "version", "canonical", "spec_file", "queries": {id: {"ground_truth", "validator",
    "reference", "requires"}}}``. A manifest written before the split (answers inline, no
    ``manifest_version``) is read as its own scoring file. ScoringError naming the file when a
    current manifest has none."""
    uri = scoring_uri(manifest_uri)
    if storage.exists(uri):
        return storage.read_json(uri)
    manifest = storage.read_json(manifest_uri)
    if manifest.get("manifest_version") is None and any(
        k in q for q in manifest.get("queries", []) for k in PRIVATE_QUERY_KEYS
    ):
        return _legacy_scoring(manifest)
    raise ScoringError(
        f"{uri}: no scoring file for this dataset; rebuild it (`querylab datasets build "
        f"{manifest.get('name', '<name>')}` or any run of it)"
    )


def full_manifest(manifest_uri: str) -> dict:
    """Public manifest merged with its scoring file: every query with its question *and* its
    ground truth, validator, reference and requirements. Scorer-side code only (failure modes,
    the LLM judge, the viewer); never hand it to the trial side."""
    public = storage.read_json(manifest_uri)
    private = load_scoring(manifest_uri)
    extra = private.get("queries", {})
    return {
        **public,
        **{k: private[k] for k in PRIVATE_MANIFEST_KEYS if k in private},
        "queries": [{**q, **extra.get(q["id"], {})} for q in public["queries"]],
    }


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
               questions: dict[tuple[str, str], str] | None = None) -> list[dict]:
    """One ``scores`` row per trial (see :data:`schemas.artifacts.SCORES`).

    ``trials``: trial rows (``TRIALS`` columns); ``scorings``: dataset name → its scoring file
    (:func:`load_scoring`); ``questions``: (dataset, query id) → question text (the validators
    tell numbers the question names apart from candidate answers; :func:`load_questions`). An
    errored trial (:data:`ERRORED_REASONS`) is not validated.
    Raises ScoringError for a trial whose dataset or query has no scoring entry, or whose
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
            v = check_answer(t["answer"], query.get("ground_truth"), query["validator"],
                             (questions or {}).get(key))
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
    return storage.join(artifacts_root, "runs", run_id, "score")


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
    return storage.join(artifacts_root, "runs", run_id, "trials", f"{name}.parquet")


def run_manifest_uris(
    artifacts_root: str, run_id: str, trials: pl.DataFrame, manifest_uris: list[str] | None = None
) -> list[str]:
    """The dataset manifests a run's trials ran on: ``manifest_uris`` when given; else
    ``trials/manifests.json`` (written by the trials stage); else the run record's manifests;
    else ``<root>/datasets/<name>/<dataset_version>/manifest.json`` for each dataset version in
    the trials. ScoringError naming the datasets none of these covers."""
    if manifest_uris:
        return list(manifest_uris)
    recorded = storage.join(artifacts_root, "runs", run_id, "trials", "manifests.json")
    if storage.exists(recorded):
        return list(storage.read_json(recorded))
    from tasks import runs

    record = runs.find_run(artifacts_root, run_id)
    if record is not None and record.manifests:
        return list(record.manifests)
    uris, missing = [], []
    for name, version in trials.select("dataset", "dataset_version").unique().iter_rows():
        uri = storage.join(artifacts_root, "datasets", name, version or "?", "manifest.json")
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


def load_scorings(manifest_uris: list[str]) -> dict[str, dict]:
    """Dataset name → scoring file for each manifest (the first manifest of a name wins)."""
    out: dict[str, dict] = {}
    for uri in manifest_uris:
        scoring = load_scoring(uri)
        out.setdefault(scoring["name"], scoring)
    return out


def score_run(
    run_id: str, artifacts_root: str, manifest_uris: list[str] | None = None
) -> dict[str, Any]:
    """Score every trial of a run and audit its transcripts; write ``score/scores.parquet``,
    ``score/audit.parquet`` and ``score/summary.json``.

    Idempotent and cheap to repeat (``querylab rescore``): the verdicts are recomputed from the
    stored answers with the validators as they are now; no model is called. Returns
    ``{"scores": uri, "audit": uri, "summary": uri, **summary}`` where the summary holds
    ``scorer_version``, ``trials``, ``correct``, ``incorrect``, ``errored``,
    ``error_share`` (errored / trials), ``errored_by_reason``, ``flagged`` (trials with audit
    findings) and ``scored_at``. Raises ScoringError (see :func:`run_manifest_uris`,
    :func:`score_rows`) and StorageError when the run has no ``trials.parquet``."""
    from tasks.audit import audit_run

    uri_t = trials_uri(artifacts_root, run_id)
    if not storage.exists(uri_t):
        raise ScoringError(f"run {run_id!r} has no trials to score (missing {uri_t}); run its "
                           f"trials stage first (`querylab rerun --run-id {run_id} --stage trials`)")
    trials = pl.from_arrow(storage.read_parquet(uri_t, artifacts.TRIALS))
    manifests = run_manifest_uris(artifacts_root, run_id, trials, manifest_uris)
    scorings = load_scorings(manifests)
    questions = load_questions(manifests)
    rows = score_rows(trials.iter_rows(named=True), scorings, questions)
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
    (terminate reason → count)."""
    n = scores.height
    count = {v: int((scores["verdict"] == v).sum()) for v in VERDICTS}
    by_reason = {
        r: int(c) for r, c in scores.filter(pl.col("verdict") == "errored")
        .group_by("terminate_reason").len().sort("terminate_reason").iter_rows()
    }
    return {
        "trials": n, **count, "error_share": (count["errored"] / n) if n else 0.0,
        "errored_by_reason": by_reason,
    }


def load_scores(artifacts_root: str, run_id: str) -> pl.DataFrame:
    """A run's ``scores`` (schema-checked). ScoringError naming the command to run when the
    run has not been scored."""
    uri = scores_uri(artifacts_root, run_id)
    if not storage.exists(uri):
        raise ScoringError(f"run {run_id!r} has not been scored (missing {uri}): run "
                           f"`querylab rescore --run-id {run_id}`")
    return pl.from_arrow(storage.read_parquet(uri, artifacts.SCORES))


def scored_trials(trials: pl.DataFrame, scores: pl.DataFrame, run_id: str = "?") -> pl.DataFrame:
    """``trials`` with the verdict columns of ``scores`` (``verdict``, ``is_correct`` — null
    for errored trials —, ``reason``, ``audit_flags``) joined on.

    Raises ScoringError when the scores are stale: a trial without a score, or scored with
    another answer or terminate reason than it has now (trials re-run after scoring)."""
    s = scores.select(
        "trial_key", "verdict", "is_correct", "reason", "audit_flags",
        pl.col("answer").alias("_scored_answer"),
        pl.col("terminate_reason").alias("_scored_reason"),
    )
    joined = trials.drop([c for c in ("verdict", "is_correct", "reason", "audit_flags")
                          if c in trials.columns]).join(s, on="trial_key", how="left")
    stale = joined.filter(
        pl.col("verdict").is_null()
        | (pl.col("_scored_reason") != pl.col("terminate_reason"))
        | pl.col("_scored_answer").ne_missing(pl.col("answer"))
    )
    if stale.height:
        raise ScoringError(
            f"run {run_id!r}: the scores are stale for {stale.height} trial(s) (e.g. "
            f"{stale['trial_key'][0]}): run `querylab rescore --run-id {run_id}`"
        )
    return joined.drop("_scored_answer", "_scored_reason")
