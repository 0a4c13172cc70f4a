"""A dataset version's two files: the public trial manifest and the private scoring file.

Under ``<root>/datasets/<name>/<version>/``: ``manifest.json`` holds what the trial side may
read (databases, description, hints, each query's ``id`` and ``question``); ``scoring.json``
(:func:`scoring_uri`) holds per query its :data:`PRIVATE_QUERY_KEYS` and the dataset's
:data:`PRIVATE_MANIFEST_KEYS`, read only by scorer-side code. :func:`split_manifest` writes
both from a dataset's full description; the scoring file is content-addressed
(:func:`scoring_digest`, ``scoring/<digest>.json``) and :func:`load_scoring` refuses one that
no longer matches its digest; :func:`full_manifest` merges the two for scorer-side code.

Split out of :mod:`tasks.scoring.stage`; the code moved verbatim."""

from __future__ import annotations

import hashlib
import json
import logging
import re

from tasks.core import storage

log = logging.getLogger("querylab.scoring")


#: Version of the public/private dataset layout; older manifests are rebuilt.
MANIFEST_VERSION = 3
#: Per-query keys that only the scorer (and the trusted oracle) may read.
PRIVATE_QUERY_KEYS = ("ground_truth", "validator", "reference", "requires")
#: Manifest-level keys that only the scorer may read.
PRIVATE_MANIFEST_KEYS = ("canonical", "spec_file")


class ScoringError(ValueError):
    """A run cannot be scored as asked (no trials, a missing scoring file, a trial for a query
    the scoring file lacks, stale scores). The message names what and how to fix it."""


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
