"""Deterministic failure-mode classifier (DAB's taxonomy FM1–FM5) over incorrect trials.

DAB's authors labelled failure modes by hand; querylab labels every incorrect trial by the rules
below, in this order (the first that fires wins). Correct trials get no label, errored trials
(``api_error`` / ``error``: infrastructure or harness failures, verdict ``errored``) get none
either — they are not the agent's failures and are counted beside the table — and labelling
never changes a denominator: every incorrect trial gets exactly one mode.

FM5 runtime — the trial stopped for a runtime reason: its ``terminate_reason`` is one of
    :data:`RUNTIME_REASONS` (``max_iterations``, ``max_wall_time``,
    ``max_tool_calls_per_turn``, ``token_budget``, ``context_window``, ...) or matches
    :data:`RUNTIME_REASON_PATTERN` (``error``, ``timeout``, ``limit``, ``budget``, ``max_``,
    ``exceeded``), or it has no answer and an ``error`` message. Rule ``runtime_stop`` /
    ``runtime_error``.
FM1 other — the answer came without any data tool call (no ``list_db`` / ``query_db`` /
    ``execute_python`` in the trajectory; rule ``no_data_tool_call``, or
    ``replay_no_trajectory`` for a replayed answer file that records no trajectory), the
    answer is missing or
    blank (``no_answer``), or the query's requirements are unknown because no dataset manifest
    for it was found (``requirements_unknown``), so FM2–FM4 cannot be told apart.
FM3 wrong data source — a source the query requires (``requires.sources`` in the dataset
    spec, ``"<database>.<table or collection>"``) was never touched: no ``query_db`` call on
    that database referenced it (rule ``source_not_touched``; ``missing_sources`` lists them).
    A call touches a SQL table when the table name follows ``FROM`` / ``JOIN`` or a comma in a
    ``FROM`` list (schema qualifiers and quotes ignored, case-insensitive), and a MongoDB
    collection when it is the query's ``"collection"`` or a ``$lookup`` ``"from"``. Attempts
    count even when the call failed: choosing the right source is what FM3 is about.
FM4 wrong implementation — every required source was touched and every required operation
    with a trajectory signature is evident (below), yet the answer is wrong (rule
    ``operations_evident``).
FM2 wrong plan — otherwise: every source was touched but a required operation left no trace
    (rule ``operation_missing``; ``missing_operations`` lists them).

Operation evidence (``requires.operations``; per-call signals from :mod:`tasks.report.features`,
per trial from :mod:`tasks.report.failure_evidence`):

- ``join_reformatted_key``: ``query_db`` on at least two distinct databases **and** a key
  reformatting construct somewhere in the trajectory (Python string surgery such as
  ``.split(`` / slicing / ``int(``, SQL string functions such as ``split_part`` /
  ``substr`` / ``||`` / ``CAST``, MongoDB ``$substr`` / ``$toInt`` / ``$concat``).
- ``extract_from_text``: any extraction method — a pattern match in a query (SQL ``LIKE`` /
  regexp, MongoDB ``$regex``), a regex or a string search in Python, or a model call.
- ``use_adjusted_close``: ``adj_close`` (or "adjusted close") in a query or Python code.
- ``domain_knowledge`` and any operation without a rule here: no trajectory signature; they are
  never counted as missing (so they cannot turn FM4 into FM2) and are reported as unchecked.

Everything is vectorised Polars; the only Python loops run over manifests and queries.
"""

from __future__ import annotations

from collections.abc import Iterator

import polars as pl

from schemas.report import ALL, FAILURE_MODES
from tasks.report.failure_evidence import (
    CHECKED_OPERATIONS,
    evident_operations,
    trajectory_evidence,
)
from tasks.report.features import features_for_report
from tasks.report.metrics import as_strings, with_verdicts
from tasks.report.tool_use import PARTITION_TRIALS, trial_id_expr

#: Terminate reasons that are runtime failures (FM5).
RUNTIME_REASONS = (
    "api_error",
    "error",
    "max_iterations",
    "max_tool_calls_per_turn",
    "context_window",
    "timeout",
    "wall_time",
    "max_wall_time",
    "time_limit",
    "max_tool_calls",
    "tool_call_limit",
    "token_budget",
    "token_limit",
    "context_length",
    "context_limit",
    "max_tokens",
    "budget_exceeded",
)
#: Any other terminate reason matching this (case-insensitive) is a runtime failure too.
RUNTIME_REASON_PATTERN = r"(?i)error|timeout|timed_out|limit|budget|max_|exceeded"


RULES = {
    "runtime_stop": "FM5",
    "runtime_error": "FM5",
    "no_data_tool_call": "FM1",
    "replay_no_trajectory": "FM1",
    "no_answer": "FM1",
    "requirements_unknown": "FM1",
    "source_not_touched": "FM3",
    "operations_evident": "FM4",
    "operation_missing": "FM2",
}

REQUIREMENTS_SCHEMA = {
    "dataset": pl.String,
    "query_id": pl.String,
    "sources": pl.List(pl.String),
    "operations": pl.List(pl.String),
}


class RequirementsError(ValueError):
    """A manifest's ``requires`` annotation is malformed (the message names dataset and query)."""


def requirements_from_manifests(manifests: list[dict]) -> pl.DataFrame:
    """One row per (dataset, query_id) with its required ``sources`` (``"<db>.<table>"``) and
    ``operations``, from dataset manifests (``queries[].requires``).

    A query without ``requires`` is left out (its incorrect trials become FM1
    ``requirements_unknown``); when a dataset's manifest is given twice, the first wins. Raises RequirementsError for a source not written
    ``"<db>.<table>"`` or naming a database the manifest does not have.
    """
    rows = []
    for m in manifests:
        dbs = set(m.get("databases", {}))
        for q in m.get("queries", []):
            req = q.get("requires")
            if not req:
                continue
            for s in req.get("sources", []):
                db, _, table = str(s).partition(".")
                if not db or not table:
                    raise RequirementsError(
                        f"{m['name']}/{q['id']}: requires.sources entry {s!r} is not '<db>.<table>'"
                    )
                if dbs and db not in dbs:
                    raise RequirementsError(
                        f"{m['name']}/{q['id']}: requires.sources {s!r} names database {db!r}, "
                        f"not one of {sorted(dbs)}"
                    )
            rows.append(
                {
                    "dataset": m["name"],
                    "query_id": q["id"],
                    "sources": list(req.get("sources", [])),
                    "operations": list(req.get("operations", [])),
                }
            )
    return pl.DataFrame(rows, schema=REQUIREMENTS_SCHEMA).unique(
        subset=["dataset", "query_id"], keep="first", maintain_order=True
    )


def answer_flags() -> tuple[pl.Expr, pl.Expr]:
    """``(no_answer, has_error)``: all that the rules read of a trial's ``answer`` (null or
    blank) and ``error`` (not null), as two Boolean expressions over those columns."""
    return (
        (pl.col("answer").is_null() | (pl.col("answer").str.strip_chars() == ""))
        .alias("no_answer"),
        pl.col("error").is_not_null().alias("has_error"),
    )


def classify_failures(
    trials: pl.DataFrame,
    tool_calls: pl.DataFrame | pl.LazyFrame,
    requirements: pl.DataFrame | None = None,
) -> pl.DataFrame:
    """Label every incorrect trial with FM1–FM5 by the rules of this module: the
    :func:`failure_label_slices` concatenated (same arguments, same errors), so a caller that
    writes or counts the labels slice by slice never holds them all (the report stage:
    :func:`tasks.report.stage.write_failure_labels`)."""
    parts = list(failure_label_slices(trials, tool_calls, requirements))
    labels = parts[0] if len(parts) == 1 else pl.concat(parts)
    return labels.with_columns(as_strings(*LABEL_CODED))


#: Label columns :func:`failure_label_slices` gives as ``pl.Categorical`` / ``pl.Enum``
#: (4 bytes or less a row instead of a string view: about 0.4 GB less per 2.5M labels) —
#: the keys as the trials hold them (String stays String), ``rule`` and ``failure_mode`` as
#: Enums; :func:`classify_failures` gives them all as String.
LABEL_CODED = ("run_id", "agent", "dataset", "query_id", "terminate_reason", "failure_mode",
               "rule")
_RULE_ENUM = pl.Enum(list(RULES))
_MODE_ENUM = pl.Enum(list(FAILURE_MODES))


def failure_label_slices(
    trials: pl.DataFrame,
    tool_calls: pl.DataFrame | pl.LazyFrame,
    requirements: pl.DataFrame | None = None,
) -> Iterator[pl.DataFrame]:
    """Label every incorrect trial with FM1–FM5 by the rules of this module, yielding the
    labels of consecutive slices of at most ``PARTITION_TRIALS`` incorrect trials (one slice
    for a run whose trial keys do not hash to unique ids, or without the stored per-call
    features), in trial_key order across slices. Nothing is computed until the first slice
    is asked for (the ValueError below included).

    ``trials``: scored trials — ``TRIALS`` columns (run_id, trial_key, agent, dataset,
    query_id, trial, answer, terminate_reason, error) with ``verdict`` (or ``is_correct``);
    instead of answer and error it may carry only what the rules read of them, the booleans
    ``no_answer`` (answer null or blank) and ``has_error`` (error not null), as
    :func:`tasks.report.loaders.load_report_trials` gives them. Only ``incorrect`` trials are
    labelled, errored ones never. ``tool_calls``: ``TOOL_CALLS`` rows (any
    superset; only the incorrect trials' calls are read). ``requirements``: output of
    :func:`requirements_from_manifests`; None or a missing query makes its trials FM1
    ``requirements_unknown`` unless FM5/FM1 fired first. Yields frames of the
    ``schemas.report.FAILURE_LABELS`` columns, one row per incorrect trial, sorted by
    trial_key (at least one frame, empty without incorrect trials; the :data:`LABEL_CODED`
    columns coded, not String); ``missing_sources`` / ``missing_operations`` are sorted
    lists (empty when none) and are filled for every incorrect trial, whatever its mode.
    """
    need = [
        "run_id",
        "trial_key",
        "agent",
        "dataset",
        "query_id",
        "trial",
        "terminate_reason",
        *(("no_answer", "has_error") if {"no_answer", "has_error"} <= set(trials.columns)
          else ("answer", "error")),
    ]
    missing = [c for c in need if c not in trials.columns]
    if missing:
        raise ValueError(f"classify_failures needs trial columns {missing}")
    trials = with_verdicts(trials)
    if requirements is None:
        requirements = pl.DataFrame(schema=REQUIREMENTS_SCHEMA)
    tid = trial_id_expr(trials)
    bad = (
        trials.lazy()
        .filter(pl.col("verdict") == "incorrect")
        .select(*need)
        .with_columns(tid)
        .join(
            requirements.lazy().select("dataset", "query_id").with_row_index("qid").cast(
                {k: trials.schema[k] for k in ("dataset", "query_id")}),  # String or Categorical
            on=["dataset", "query_id"],
            how="left",
            maintain_order="left",
        )
    )
    # the labels' order, kept by every join below: trials as querylab writes them are sorted
    # by key already (then no sort: it would gather every column of the incorrect trials)
    keys = trials["trial_key"]
    in_order = keys.null_count() == 0 and keys.is_sorted()  # (the sorted flag ignores nulls)
    bad = (bad if in_order else bad.sort("trial_key")).collect()

    # required sources and operations per query, as small integer-coded tables
    req = requirements.with_row_index("qid")
    req_src = (
        req.select("qid", pl.col("sources").alias("source"))
        .explode("source")
        .drop_nulls("source")
        .unique()
    )
    parts = pl.col("source").str.splitn(".", 2)  # db, then the rest (may hold dots)
    codes = (
        req_src.select("source")
        .unique()
        .sort("source")
        .with_row_index("sid")
        .with_columns(
            (
                parts.struct.field("field_0")
                + "."
                + parts.struct.field("field_1").str.to_lowercase()
            ).alias("norm")
        )
    )
    req_src = req_src.join(codes.select("source", "sid"), on="source").select("qid", "sid")
    # checked operations as bit masks: bit i is CHECKED_OPERATIONS[i]
    op_bit = pl.col("operation").replace_strict(
        {op: 1 << i for i, op in enumerate(CHECKED_OPERATIONS)}, return_dtype=pl.UInt8)
    req_ops = (
        req.select("qid", pl.col("operations").alias("operation"))
        .explode("operation")
        .filter(pl.col("operation").is_in(CHECKED_OPERATIONS))
        .unique()
        .group_by("qid")
        .agg(op_bit.sum().alias("required_ops"))
    )
    ops_of_mask = pl.DataFrame(
        {
            "missing_ops": list(range(1 << len(CHECKED_OPERATIONS))),
            "missing_operations": [
                sorted(op for i, op in enumerate(CHECKED_OPERATIONS) if m >> i & 1)
                for m in range(1 << len(CHECKED_OPERATIONS))
            ],
        },
        schema={"missing_ops": pl.UInt8, "missing_operations": pl.List(pl.String)},
    )

    reason = pl.col("terminate_reason")
    # the reason rules on each distinct terminate reason (a few), not on every trial's text
    reasons = bad["terminate_reason"].cast(pl.String).unique().drop_nulls()
    runtime = reasons.filter(
        reasons.is_in(RUNTIME_REASONS) | reasons.str.contains(RUNTIME_REASON_PATTERN))
    runtime_reason = reason.is_in(runtime.to_list())
    no_answer, has_error = (
        answer_flags() if "answer" in need else (pl.col("no_answer"), pl.col("has_error")))
    rule = (
        pl.when(runtime_reason)
        .then(pl.lit("runtime_stop"))
        .when(no_answer & has_error)
        .then(pl.lit("runtime_error"))
        .when((reason == "replay") & (pl.col("data_calls") == 0))
        .then(pl.lit("replay_no_trajectory"))
        .when(pl.col("data_calls") == 0)
        .then(pl.lit("no_data_tool_call"))
        .when(no_answer)
        .then(pl.lit("no_answer"))
        .when(~pl.col("known"))
        .then(pl.lit("requirements_unknown"))
        .when(pl.col("missing_sources").list.len() > 0)
        .then(pl.lit("source_not_touched"))
        .when(pl.col("missing_operations").list.len() == 0)
        .then(pl.lit("operations_evident"))
        .otherwise(pl.lit("operation_missing"))
    )
    # rule and mode as Enums (a byte a row, not a string), like the keys: see LABEL_CODED
    mode = rule.replace_strict(RULES, return_dtype=_MODE_ENUM)
    rule = rule.cast(_RULE_ENUM)
    empty = pl.lit([], dtype=pl.List(pl.String))
    calls, stored = features_for_report(tool_calls.lazy(), "failure modes")

    def label(part: pl.DataFrame) -> pl.DataFrame:
        """The labels of ``part``, consecutive rows of ``bad``."""
        stats, touched = trajectory_evidence(
            calls, tid, part.select("tid"), codes.select(pl.col("norm").alias("source"), "sid"),
            stored,
        )
        need_src = part.select("tid", "qid").join(req_src, on="qid")
        # sid order is source order: the ids' lists, sorted, map to sorted source lists
        missing_src = (
            need_src.join(touched, on=["tid", "sid"], how="anti")
            .group_by("tid")
            .agg(
                pl.col("sid").sort().replace_strict(codes["sid"], codes["source"])
                .alias("missing_sources")
            )
        )
        # data_calls beside the evident operations: one join of the per-trial evidence
        evidence = pl.concat(
            [stats.lazy().select("tid", "data_calls"),
             evident_operations(stats.lazy()).select("evident_ops")],
            how="horizontal",
        )
        lf = (
            part.lazy()
            .join(evidence.collect().lazy(), on="tid", how="left", maintain_order="left")
            .join(req_ops.lazy(), on="qid", how="left", maintain_order="left")
            .with_columns(
                (pl.col("required_ops").fill_null(0) & ~pl.col("evident_ops").fill_null(0))
                .alias("missing_ops")
            )
            .join(ops_of_mask.lazy(), on="missing_ops", how="left", maintain_order="left")
            .join(missing_src.lazy(), on="tid", how="left", maintain_order="left")
            .with_columns(
                pl.col("data_calls").fill_null(0),
                pl.col("qid").is_not_null().alias("known"),
                pl.col("missing_sources").fill_null(empty),
                pl.col("missing_operations").fill_null(empty),
            )
        )
        out = lf.with_columns(rule.alias("rule"), mode.alias("failure_mode")).select(
            "run_id",
            "trial_key",
            "agent",
            "dataset",
            "query_id",
            pl.col("trial").cast(pl.Int32),
            "terminate_reason",
            "failure_mode",
            "rule",
            "missing_sources",
            "missing_operations",
        )
        return out.collect(engine="streaming")

    # consecutive slices of the incorrect trials (sorted by key: the labels' order), each
    # labelled on its own, so the per-trial evidence of at most PARTITION_TRIALS trials is in
    # memory at a time (an older artifact without stored features: one slice, its calls
    # parsed slice by slice instead); every rule reads only its own trial's rows
    # (a run whose keys are not unique groups by the key strings: one slice, so that the
    # repeated rows of a key are never cut apart)
    sliced = stored and bad.schema["tid"] != pl.String
    step = PARTITION_TRIALS if sliced else max(bad.height, 1)
    for offset in range(0, max(bad.height, 1), step):
        yield label(bad.slice(offset, step))


#: The invariant that keeps the failure-mode denominators unchanged, named by its errors.
ONE_LABEL = "every incorrect trial needs exactly one label"


def check_label_keys(keys: pl.Series, after: str | None = None) -> None:
    """Check the ``trial_key`` column of one slice of failure labels (as
    :func:`failure_label_slices` yields them: sorted, one per incorrect trial) as it is
    streamed: ValueError (naming :data:`ONE_LABEL`) for a null key, a key twice, keys out of
    order, or a first key not after ``after`` (the previous slice's last key)."""
    nulls = keys.null_count()
    if nulls:
        raise ValueError(f"{ONE_LABEL}: {nulls} incorrect trials have no trial_key")
    if not keys.len():
        return
    if not keys.is_sorted() or (after is not None and keys[0] < after):
        raise ValueError(f"{ONE_LABEL}: the labels are not in trial_key order")
    if not _unique(keys) or (after is not None and keys[0] == after):
        raise ValueError(f"{ONE_LABEL}: a trial_key has more than one failure label")


def _unique(keys: pl.Series) -> bool:
    """Whether ``keys`` has no value twice: by comparing neighbours when it is sorted (as
    :func:`classify_failures` returns its labels: no hash set of millions of keys), else by
    counting distinct values."""
    if keys.len() < 2:
        return True
    if keys.is_sorted():
        return not keys.slice(1).eq_missing(keys.slice(0, keys.len() - 1)).any()
    return keys.n_unique() == keys.len()


def failure_mode_table(
    trials: pl.DataFrame, labels: pl.DataFrame | pl.LazyFrame
) -> pl.DataFrame:
    """Failure-mode counts per (agent, dataset) and per agent (``dataset == "ALL"``).

    ``trials`` (agent, dataset, trial_key, ``verdict`` or ``is_correct``) gives ``trials``
    (scored), ``errored`` (beside them) and ``incorrect``;
    ``labels`` (:func:`classify_failures` output, or a lazy scan of it as written to
    ``failure_labels.parquet``: then only its trial_key, agent, dataset and failure_mode are
    streamed, in one query, never held) gives one count column per mode FM1–FM5 and
    ``FM<i>_share`` = count / incorrect (null without incorrect trials). Raises ValueError
    (naming :data:`ONE_LABEL`) when labels and incorrect trials disagree (a label per
    incorrect trial is the invariant that keeps denominators unchanged). Returns
    ``schemas.report.FAILURE_MODE_TABLE`` columns.
    """
    verdict_cols = [c for c in ("verdict", "is_correct") if c in trials.columns]
    trials = with_verdicts(trials.select("agent", "dataset", *verdict_cols))
    verdict = pl.col("verdict")
    n_bad = int((trials["verdict"] == "incorrect").sum())
    mode_aggs = [(pl.col("failure_mode") == m).sum().cast(pl.Int64).alias(m) for m in FAILURE_MODES]
    if isinstance(labels, pl.LazyFrame):
        # the key checks and the counts per (agent, dataset): one streaming query over four
        # columns of the file
        lf = labels.select("trial_key", *as_strings("agent", "dataset"), "failure_mode")
        checks, tally = pl.collect_all(
            [lf.select(pl.len(), pl.col("trial_key").n_unique()),
             lf.group_by("agent", "dataset").agg(mode_aggs)], engine="streaming")
        n_labels, n_keys = checks.row(0)
        unique = n_keys == n_labels
    else:
        n_labels, unique = labels.height, _unique(labels["trial_key"])
        tally = labels.group_by("agent", "dataset").agg(mode_aggs)
    if not unique:
        raise ValueError(f"{ONE_LABEL}: a trial_key has more than one failure label")
    if n_labels != n_bad:
        raise ValueError(f"{ONE_LABEL}: {n_labels} failure labels for {n_bad} incorrect trials")
    base_aggs = [
        (verdict != "errored").sum().cast(pl.Int64).alias("trials"),
        (verdict == "errored").sum().cast(pl.Int64).alias("errored"),
        (verdict == "incorrect").sum().cast(pl.Int64).alias("incorrect"),
    ]
    tally = tally.with_columns(as_strings("agent", "dataset"))
    frames = []
    for keys, label in ((["agent", "dataset"], None), (["agent"], ALL)):
        base = trials.group_by(keys).agg(base_aggs).with_columns(as_strings(*keys))
        modes = tally.group_by(keys).agg(pl.col(m).sum() for m in FAILURE_MODES)
        t = base.join(modes, on=keys, how="left").with_columns(
            *[pl.col(m).fill_null(0) for m in FAILURE_MODES]
        )
        if label is not None:
            t = t.with_columns(pl.lit(label).alias("dataset"))
        frames.append(t)
    cols = ["agent", "dataset", "trials", "errored", "incorrect", *FAILURE_MODES]
    out = pl.concat([f.select(cols) for f in frames])
    denom = pl.when(pl.col("incorrect") > 0).then(pl.col("incorrect"))
    return out.with_columns(*[(pl.col(m) / denom).alias(f"{m}_share") for m in FAILURE_MODES]).sort(
        "agent", pl.col("dataset") == ALL, "dataset"
    )


def unchecked_operations(requirements: pl.DataFrame) -> list[str]:
    """Required operations that have no trajectory signature (reported, never counted
    missing), sorted."""
    ops = requirements["operations"].explode().drop_nulls().unique().to_list()
    return sorted(o for o in ops if o not in CHECKED_OPERATIONS)
