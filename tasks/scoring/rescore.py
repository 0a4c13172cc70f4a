"""Rescoring a run after a spec fix: the data version against the scoring version.

A dataset version has two halves (:mod:`tasks.datasets.build`): the **data version** — what agents saw
(databases, perturbed tables, questions, descriptions, hints; the ``<version>`` of
``datasets/<name>/<version>/``) — and the **scoring** — ground truth (computed from the
canonical tables by the spec's SQL), validators, reference solutions, requirements, identified
by its digest (:func:`tasks.scoring.scoring_file.scoring_digest`). Stored answers stay valid while the data
version is unchanged, whatever the scoring does.

``querylab rescore --run-id X`` (:func:`plan_rescore` then :func:`apply_rescore`) re-derives
each dataset's scoring from the **current** spec (``data/<name>.yaml``): the spec's data
version must equal the one the run's trials saw, else the rescore is refused in one line
before anything is written (the answers were given to other data: re-run the trials). The
ground truth is recomputed from the dataset's canonical tables, a changed scoring is written
as a new content-addressed scoring file (the dataset's current one from then on), the run is
scored with it and its summary records the digest. What it used and what changed is returned
for the command to print. A dataset without a spec (a DAB import) is scored with its recorded
scoring file. A hand-edited ``scoring.json`` is refused (:func:`tasks.scoring.scoring_file.load_scoring`):
fixes go into the spec.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from schemas import artifacts
from tasks.core import storage
from tasks.scoring.scoring_file import ScoringError, load_scoring, replace_scoring, scoring_digest
from tasks.scoring.stage import run_manifest_uris, trials_uri


class RescoreRefused(ScoringError):
    """A rescore that cannot be done as asked; raised before anything is written (the run's
    records are untouched). The message is one line saying why and what to do."""


@dataclass
class DatasetRescore:
    """What rescoring does to one dataset of a run: ``name``; ``manifest`` URI; the
    ``data_version`` the trials saw; ``source`` (``spec``: re-derived from ``spec_file``;
    ``recorded``: its scoring file as recorded — no spec, or asked for); ``old`` / ``new``
    scoring digests; ``changes``: one line per query whose scoring changed; ``queries``: the
    new per-query entries (None when not re-derived)."""

    name: str
    manifest: str
    data_version: str
    source: str
    old: str
    new: str
    spec_file: str | None = None
    changes: list[str] = field(default_factory=list)
    queries: dict | None = None
    note: str | None = None

    def line(self) -> str:
        """One line for the terminal: which scoring, from where, what changed."""
        where = (f"re-derived from {self.spec_file}" if self.source == "spec"
                 else "its recorded scoring file")
        what = ("unchanged" if self.old == self.new
                else f"{self.old} -> {self.new}, {len(self.changes)} query(ies) changed")
        text = f"{self.name}: data version {self.data_version}; scoring {where}: {what}"
        return text + (f" ({self.note})" if self.note else "")


def _short(value, limit: int = 80) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _changes(old: dict, new: dict) -> list[str]:
    """One line per query whose scoring entry differs (ground truth, validator, reference,
    requirements; added or removed queries)."""
    out = []
    for qid in sorted(set(old) | set(new)):
        a, b = old.get(qid), new.get(qid)
        if a == b:
            continue
        if a is None or b is None:
            out.append(f"{qid}: {'added' if a is None else 'removed'}")
            continue
        parts = [f"{k} {_short(a.get(k))} -> {_short(b.get(k))}"
                 for k in ("ground_truth", "validator", "requires") if a.get(k) != b.get(k)]
        if a.get("reference") != b.get("reference"):
            parts.append("reference solution changed")
        out.append(f"{qid}: " + "; ".join(parts))
    return out


def plan_rescore(run_id: str, artifacts_root: str, manifest_uris: list[str] | None = None,
                 source: str = "spec") -> list[DatasetRescore]:
    """What :func:`apply_rescore` will do for each dataset of the run, computed without
    writing anything. ``source``: ``spec`` (re-derive from the current spec where there is
    one) or ``recorded`` (the scoring files as they are). Raises :class:`RescoreRefused` when
    the current spec gives another data version than the trials ran on, or the spec no longer
    builds; ScoringError (e.g. a hand-edited scoring file) and StorageError as the score step."""
    from tasks.datasets.build import derive_scoring, spec_data_version
    from tasks.datasets.catalogue import SHARED_DATASETS, shared_data_dir
    from tasks.datasets.spec import SpecError, load_spec, spec_path

    if source not in ("spec", "recorded"):
        raise ValueError(f"source {source!r}: use 'spec' or 'recorded'")
    uri_t = trials_uri(artifacts_root, run_id)
    if not storage.exists(uri_t):
        raise RescoreRefused(f"run {run_id!r} has no trials to score (missing {uri_t})")
    trials = pl.from_arrow(storage.read_parquet(uri_t, artifacts.TRIALS))
    seen = {d: set(v) for d, v in trials.group_by("dataset").agg(
        pl.col("dataset_version").drop_nulls().unique()).iter_rows()}
    plans = []
    for uri in run_manifest_uris(artifacts_root, run_id, trials, manifest_uris):
        public = storage.read_json(uri)
        name = public["name"]
        if name not in seen:
            continue
        if seen[name] and public.get("version") not in seen[name]:
            raise RescoreRefused(
                f"cannot rescore run {run_id!r} with {uri}: its {name} trials ran on data "
                f"version {', '.join(sorted(seen[name]))}, that manifest is version "
                f"{public.get('version')}; the answers were given to other data")
        private = load_scoring(uri)
        old = scoring_digest(private)
        plan = DatasetRescore(name, uri, public.get("version", "?"), "recorded", old, old)
        spec_name = private.get("spec_file")
        path = None
        if source == "spec" and spec_name:
            try:
                path = spec_path(name)
            except SpecError:
                path = None
            if path is not None and Path(path).name != spec_name:
                path = None
            if path is None:
                plan.note = f"no spec {spec_name} in the catalogue: scored as recorded"
        elif source == "spec":
            plan.note = "no spec (an imported dataset): scored as recorded"
        if path is not None:
            src = shared_data_dir() if name in SHARED_DATASETS else None
            try:
                now = spec_data_version(path, src)
                spec = load_spec(path)
            except SpecError as exc:
                raise RescoreRefused(f"cannot rescore run {run_id!r} from the spec: {exc}") \
                    from None
            ran = sorted(seen[name] or {plan.data_version})
            if ran != [now]:
                raise RescoreRefused(
                    f"cannot rescore run {run_id!r} from the current spec: its {name} trials "
                    f"ran on data version {', '.join(ran)}, the spec {Path(path).name} now "
                    f"gives {now} (databases, questions, descriptions or hints changed), so the "
                    "stored answers were given to other data; re-run the trials (`querylab run "
                    f"--dataset {name} ...`) or score as recorded (`querylab rescore --run-id "
                    f"{run_id} --scoring recorded`)")
            canonical = {n: storage.read_parquet(u) for n, u in private["canonical"].items()}
            try:
                queries = derive_scoring(spec, canonical, path)
            except SpecError as exc:
                raise RescoreRefused(f"cannot rescore run {run_id!r} from the spec: {exc}") \
                    from None
            plan.source, plan.spec_file, plan.queries = "spec", str(path), queries
            plan.new = scoring_digest({**private, "queries": queries})
            plan.changes = _changes(private["queries"], queries)
        plans.append(plan)
    return plans


def apply_rescore(plans: list[DatasetRescore]) -> None:
    """Write the re-derived scoring of each planned dataset whose scoring changed (a new
    content-addressed scoring file, the dataset's current one from then on: runs already
    scored keep the digest they recorded). Score the run afterwards
    (:func:`tasks.scoring.stage.score_run`)."""
    for plan in plans:
        if plan.queries is not None and plan.new != plan.old:
            replace_scoring(plan.manifest, plan.queries)
