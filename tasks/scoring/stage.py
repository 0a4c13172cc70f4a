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
import re
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

import polars as pl
import pyarrow as pa

from schemas import artifacts
from tasks.core import storage
from tasks.scoring.validate import check_answer
from tasks.core.layout import DatasetLayout, RunLayout

log = logging.getLogger("querylab.scoring")

#: Bump when a verdict rule changes (recorded in every ``scores`` row and ``summary.json``).
SCORER_VERSION = "3"
#: Version of the public/private dataset layout; older manifests are rebuilt.
MANIFEST_VERSION = 3
#: Terminate reasons of infrastructure or harness failures: such a trial has no verdict.
ERRORED_REASONS = frozenset({"api_error", "error"})
#: Per-query keys that only the scorer (and the trusted oracle) may read.
PRIVATE_QUERY_KEYS = ("ground_truth", "validator", "reference", "requires")
#: Manifest-level keys that only the scorer may read.
PRIVATE_MANIFEST_KEYS = ("canonical", "spec_file")
#: Verdicts of a ``scores`` row.
VERDICTS = ("correct", "incorrect", "errored")
#: ``errored_by_reason`` key of errored verdicts whose validator gave none (the trial itself
#: ended normally): fix the validator and rescore, re-running the trial changes nothing.
VALIDATOR_ERROR = "validator_error"


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


def scoring_digest(private: dict) -> str:
    """16 hex digits of SHA-256 over a scoring file's content (canonical JSON: sorted keys, no
    whitespace; canonical-table URIs relative to the dataset directory, so the same dataset
    built under two artifact roots has one digest): its identity. The public manifest records the digest of the scoring file
    written with it (``scoring_digest``), content-addressed copies live at
    ``scoring/<digest>.json`` (:func:`pinned_scoring_uri`), and a run's score summary records
    the digest it was scored with. The digest commits to the answer key without revealing it
    (the file also holds the reference solutions and SQL)."""
    content = dict(private)
    canonical = content.get("canonical")
    if isinstance(canonical, dict):  # locations count relative to the dataset directory
        content["canonical"] = {n: re.sub(r"^.*/datasets/[^/]+/[^/]+/", "", str(u))
                                for n, u in canonical.items()}
    blob = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      default=str)
    return hashlib.sha256(blob.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def pinned_scoring_uri(manifest_uri: str, digest: str) -> str:
    """URI of the content-addressed scoring file ``scoring/<digest>.json`` of a dataset
    version (written once, never replaced)."""
    if not re.fullmatch(r"[0-9a-f]{16}", digest or ""):
        raise ScoringError(f"bad scoring digest {digest!r}")
    return scoring_uri(manifest_uri)[: -len("scoring.json")] + f"scoring/{digest}.json"


def write_scoring(manifest_uri: str, private: dict) -> str:
    """Write a dataset version's scoring file: the content-addressed copy
    (:func:`pinned_scoring_uri`) and ``scoring.json`` (the current one). Returns its digest.
    The caller records the digest in the public manifest (``scoring_digest``)."""
    digest = scoring_digest(private)
    pinned = pinned_scoring_uri(manifest_uri, digest)
    if not storage.exists(pinned):
        storage.write_json(pinned, private)
    storage.write_json(scoring_uri(manifest_uri), private)
    return digest


def split_manifest(manifest_uri: str, full: dict) -> str:
    """Write a dataset's full description as the public ``manifest.json`` and the private
    scoring file (see the module docstring, :func:`write_scoring`); returns the manifest URI.

    ``full`` has the public keys plus :data:`PRIVATE_MANIFEST_KEYS` and, per query,
    :data:`PRIVATE_QUERY_KEYS`. The scoring file is written first and the manifest last (with
    the scoring file's digest, ``scoring_digest``), so a manifest in the current layout means
    both exist (:func:`is_current_dataset`) and a scoring file edited afterwards is detected
    (:func:`load_scoring`)."""
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
    public["scoring_digest"] = write_scoring(manifest_uri, private)
    return storage.write_json(manifest_uri, public)


def replace_scoring(manifest_uri: str, queries: dict[str, dict]) -> tuple[str, str]:
    """Give a built dataset version new per-query scoring entries (``queries``: id → ``{
    "ground_truth", "validator", "reference", "requires"}``, e.g. re-derived from a fixed
    spec) without touching its data: a new content-addressed scoring file, ``scoring.json`` and
    the manifest's ``scoring_digest``. Returns ``(old digest, new digest)`` (equal: nothing was
    written). Runs already scored keep the digest they recorded."""
    public = storage.read_json(manifest_uri)
    before = public.get("scoring_digest")
    pinned = pinned_scoring_uri(manifest_uri, before) if before else None
    base_uri = pinned if pinned and storage.exists(pinned) else scoring_uri(manifest_uri)
    base = storage.read_json(base_uri)
    before = before or scoring_digest(base)
    private = {**base, "queries": queries}
    after = scoring_digest(private)
    current = storage.read_json(scoring_uri(manifest_uri)) if storage.exists(
        scoring_uri(manifest_uri)) else None
    if current is None or scoring_digest(current) != after:
        if current is not None and after == before:
            log.warning("%s did not match its digest (edited by hand?): rewritten from the "
                        "spec", scoring_uri(manifest_uri))
        write_scoring(manifest_uri, private)
    if after != public.get("scoring_digest"):
        public["scoring_digest"] = after
        storage.write_json(manifest_uri, public)
    return before, after


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


def load_scoring(manifest_uri: str, digest: str | None = None) -> dict:
    """The private scoring file of a dataset manifest (scorer side only): ``{"name",
    "version", "canonical", "spec_file", "queries": {id: {"ground_truth", "validator",
    "reference", "requires"}}}``, checked against its digest (tamper-evident).

    ``digest``: the scoring a run recorded (``scoring/<digest>.json``, or ``scoring.json``
    when that is the same content); default: the manifest's ``scoring_digest`` (the scoring
    file written with it). ScoringError when the file's content does not match the digest (it
    was edited by hand or tampered with: fix the spec and rebuild / rescore instead) or when a
    current manifest has no scoring file. A manifest written before digests is read
    unchecked; one from before the split (answers inline, no ``manifest_version``) as its own
    scoring file."""
    uri = scoring_uri(manifest_uri)
    manifest = storage.read_json(manifest_uri)
    expected = digest or manifest.get("scoring_digest")
    if expected:
        # a run's recorded scoring: its content-addressed copy (or scoring.json if the same);
        # the manifest's own: scoring.json, which must still be what was written with it
        candidates = [pinned_scoring_uri(manifest_uri, expected), uri] if digest else [uri]
        seen = None
        for candidate in candidates:
            if storage.exists(candidate):
                private = storage.read_json(candidate)
                got = scoring_digest(private)
                if got == expected:
                    return private
                seen = seen or (candidate, got)
        if seen is None:
            raise ScoringError(f"{uri}: no scoring file with digest {expected} for this "
                               "dataset; rebuild it (`querylab datasets build "
                               f"{manifest.get('name', '<name>')}`)")
        raise ScoringError(
            f"{seen[0]} does not match the scoring digest recorded when it was written "
            f"({expected}; its content gives {seen[1]}): it was edited by hand or tampered "
            "with. Scoring files are derived: fix the dataset spec and run `querylab rescore "
            "--run-id <run>` (or `querylab datasets build "
            f"{manifest.get('name', '<name>')}`)")
    if storage.exists(uri):
        return storage.read_json(uri)
    if manifest.get("manifest_version") is None and any(
        k in q for q in manifest.get("queries", []) for k in PRIVATE_QUERY_KEYS
    ):
        return _legacy_scoring(manifest)
    raise ScoringError(
        f"{uri}: no scoring file for this dataset; rebuild it (`querylab datasets build "
        f"{manifest.get('name', '<name>')}` or any run of it)"
    )


def full_manifest(manifest_uri: str, digest: str | None = None) -> dict:
    """Public manifest merged with its scoring file (``digest``: the one a run recorded, see
    :func:`load_scoring`): every query with its question *and* its ground truth, validator,
    reference and requirements. Scorer-side code only (failure modes, the LLM judge, the
    viewer); never hand it to the trial side."""
    public = storage.read_json(manifest_uri)
    private = load_scoring(manifest_uri, digest)
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
    trials: pl.DataFrame | pl.LazyFrame, scores: pl.DataFrame | pl.LazyFrame, run_id: str = "?"
) -> pl.DataFrame:
    """``trials`` with the verdict columns of ``scores`` (``verdict``, ``is_correct`` — null
    for errored trials —, ``reason``, ``audit_flags``) joined on, in the order of ``trials``.

    Either may be a lazy scan of the artifact: the join and the staleness check then run as
    one streaming query (the scored answers are compared in it, never kept).
    Raises ScoringError when the scores are stale: a trial without a score, or scored with
    another answer or terminate reason than it has now (trials re-run after scoring)."""
    s = scores.lazy().select(
        "trial_key", "verdict", "is_correct", "reason", "audit_flags",
        pl.col("answer").alias("_scored_answer"),
        pl.col("terminate_reason").alias("_scored_reason"),
    )
    names = trials.collect_schema().names()
    stale = (
        pl.col("verdict").is_null()
        | (pl.col("_scored_reason") != pl.col("terminate_reason"))
        | pl.col("_scored_answer").ne_missing(pl.col("answer"))
    )
    joined = (
        trials.lazy()
        .drop([c for c in ("verdict", "is_correct", "reason", "audit_flags") if c in names])
        .join(s, on="trial_key", how="left", maintain_order="left")
        .with_columns(stale.fill_null(True).alias("_stale"))
        .drop("_scored_answer", "_scored_reason")
        .collect(engine="streaming")
    )
    n_stale = int(joined["_stale"].sum())
    if n_stale:
        first = joined.filter(pl.col("_stale"))["trial_key"][0]
        raise ScoringError(
            f"run {run_id!r}: the scores are stale for {n_stale} trial(s) (e.g. "
            f"{first}): run `querylab rescore --run-id {run_id}`"
        )
    return joined.drop("_stale")


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
