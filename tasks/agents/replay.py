"""The ``replay:<file>`` agent: scores recorded answers in DAB's leaderboard format.

An answer file is a JSON list (or JSON Lines) of ``{"dataset", "query", "run", "answer"}``
objects, as DAB leaderboard submissions are::

    [{"dataset": "STOCKS", "query": "1", "run": "0", "answer": "Facebook"}, ...]

- ``dataset`` matches a querylab dataset name, case-insensitively;
- ``query`` is a query id (``nasdaq_top_volume_2012``) or, as in DAB, its number: ``"3"``,
  ``3`` or ``"query3"`` is the query folder ``query3`` of an imported DAB dataset (even when
  ``query2`` is missing), and the 3rd query of a built dataset; an exact id wins;
- ``run`` is the 0-based trial index (int or digit string);
- ``answer`` is the free-text answer (a non-string is scored as its JSON text; null = none).

Each trial of a replay run takes the answer of its (dataset, query, run) and scores it with the
query's validator, like any agent's ``return_answer``; a trial with no entry ends with terminate
reason ``no_answer`` (incorrect; DAB's own scripts find no run there, see
:func:`tasks.scoring.dab_rules.leaderboard_pass_at_1`). Other keys of an entry are ignored. Problems
in the file (not JSON, missing keys, a bad run, duplicates, a query that a dataset of the run
does not have, no entry for any dataset of the run) raise :class:`ReplayError` naming the
file and the entries before any trial runs; :func:`unmatched_datasets` names the entries for
datasets a run does not have.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from tasks.agents.react import TrialOutcome
from tasks.core.llm import AgentConfigError

_REQUIRED = ("dataset", "query", "run", "answer")


class ReplayError(AgentConfigError):
    """A replay answer file cannot be used; ``str(err)`` names the file and the entry."""


@dataclass
class AnswerFile:
    """A parsed answer file: ``path``, ``sha256`` of its bytes and ``entries`` keyed by
    ``(dataset lower-cased, query as text, run)`` → answer text (or None)."""

    path: Path
    sha256: str
    entries: dict[tuple[str, str, int], str | None] = field(default_factory=dict)
    #: lower-cased dataset name → as the file spells it (its first entry's spelling)
    spelled: dict[str, str] = field(default_factory=dict)

    def datasets(self) -> set[str]:
        """Lower-cased dataset names that have entries."""
        return {d for d, _, _ in self.entries}

    def count(self, dataset: str) -> int:
        """Entries for a (lower-cased) dataset name."""
        return sum(1 for d, _, _ in self.entries if d == dataset)


def _records(path: Path, text: str) -> list:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as first:
        try:  # JSON Lines
            data = [json.loads(line) for line in text.splitlines() if line.strip()]
        except json.JSONDecodeError:
            raise ReplayError(f"{path}: not valid JSON: {first}") from None
    if not isinstance(data, list):
        raise ReplayError(f"{path}: expected a JSON list of answer objects, got {type(data).__name__}")
    return data


def load_answers(path: str | Path) -> AnswerFile:
    """Parse and check an answer file (see the module docstring); raises ReplayError."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ReplayError(f"{path}: answer file not found") from None
    except OSError as exc:
        raise ReplayError(f"{path}: cannot read answer file: {exc}") from None
    out = AnswerFile(path=path, sha256=hashlib.sha256(raw).hexdigest())
    for i, rec in enumerate(_records(path, raw.decode("utf-8", errors="replace"))):
        where = f"{path}: entry {i}"
        if not isinstance(rec, dict):
            raise ReplayError(f"{where}: expected an object, got {type(rec).__name__}")
        missing = [k for k in _REQUIRED if k not in rec]
        if missing:
            raise ReplayError(f"{where}: missing keys {missing} (need {list(_REQUIRED)})")
        run = rec["run"]
        if isinstance(run, str) and run.strip().isdigit():
            run = int(run)
        if isinstance(run, bool) or not isinstance(run, int) or run < 0:
            raise ReplayError(f"{where}: run must be a non-negative integer, got {rec['run']!r}")
        dataset, query = str(rec["dataset"]).strip().lower(), str(rec["query"]).strip()
        if not dataset or not query:
            raise ReplayError(f"{where}: empty dataset or query")
        answer = rec["answer"]
        if answer is not None and not isinstance(answer, str):
            answer = json.dumps(answer, ensure_ascii=False)
        key = (dataset, query, run)
        if key in out.entries:
            raise ReplayError(
                f"{where}: duplicate answer for dataset {rec['dataset']!r} query {query!r} run {run}"
            )
        out.entries[key] = answer
        out.spelled.setdefault(dataset, str(rec["dataset"]).strip())
    return out


def unmatched_datasets(answers: AnswerFile, manifests: list[dict]) -> dict[str, int]:
    """Datasets of the answer file (as it spells them) that none of ``manifests`` is —
    compared ignoring case — with their entry counts."""
    names = {m["name"].lower() for m in manifests}
    return {answers.spelled.get(d, d): answers.count(d)
            for d in sorted(answers.datasets() - names)}


def check_matches(answers: AnswerFile, manifests: list[dict], strict: bool = False) -> None:
    """ReplayError when no entry of the file is for a dataset of ``manifests`` (a run that
    would score nothing), naming the file's datasets and the run's; with ``strict`` also when
    any entry is for a dataset the run does not have, naming those."""
    missing = unmatched_datasets(answers, manifests)
    have = sorted(m["name"] for m in manifests)
    shown = ", ".join(f"{d!r} ({n} entries)" for d, n in missing.items())
    if manifests and len(missing) == len(answers.datasets()):
        raise ReplayError(f"{answers.path}: no entry is for a dataset of this run: the file "
                          f"answers {shown or 'nothing'}; the run has {have}")
    if strict and missing:
        raise ReplayError(f"{answers.path}: entries for datasets this run does not have: "
                          f"{shown}; the run has {have} (import them, or drop those entries)")


def resolve_query(manifest: dict, query: str) -> str | None:
    """The query id an entry's ``query`` refers to in ``manifest``, or None: the exact id;
    else a number (``"3"`` or ``"query3"``): the query folder ``query3`` of a DAB dataset
    (DAB numbers queries by folder), the 3rd query of a built dataset (1-based position)."""
    ids = [q["id"] for q in manifest["queries"]]
    if query in ids:
        return query
    m = re.fullmatch(r"(?:query)?(\d+)", query, flags=re.IGNORECASE)
    if not m:
        return None
    n = int(m.group(1))
    if manifest.get("format") == "dab":
        return f"query{n}" if f"query{n}" in ids else None
    return ids[n - 1] if 1 <= n <= len(ids) else None


def answers_for(answers: AnswerFile, manifest: dict) -> dict[tuple[str, int], str | None]:
    """The file's answers for one dataset as ``{(query_id, run): answer}``.

    Raises ReplayError listing entries whose query the dataset does not have.
    """
    name = manifest["name"].lower()
    out: dict[tuple[str, int], str | None] = {}
    unknown = []
    for (dataset, query, run), answer in answers.entries.items():
        if dataset != name:
            continue
        qid = resolve_query(manifest, query)
        if qid is None:
            unknown.append(query)
            continue
        if (qid, run) in out:
            raise ReplayError(
                f"{answers.path}: dataset {manifest['name']!r} query {qid!r} run {run} is answered "
                "twice (by id and by position)"
            )
        out[(qid, run)] = answer
    if unknown:
        ids = [q["id"] for q in manifest["queries"]]
        also = "" if manifest.get("format") == "dab" else f" (or 1..{len(ids)})"
        raise ReplayError(
            f"{answers.path}: dataset {manifest['name']!r} has no queries "
            f"{sorted(set(unknown))}; it has {ids}{also}"
        )
    return out


def run_replay(answers: dict[tuple[str, int], str | None], query_id: str, trial: int) -> TrialOutcome:
    """The trial outcome for ``(query_id, trial)``: the recorded answer with terminate reason
    ``replay``, or ``no_answer`` when the file has none."""
    if (query_id, trial) not in answers:
        return TrialOutcome(None, "no_answer", f"no answer for query {query_id!r} run {trial}")
    return TrialOutcome(answers[(query_id, trial)], "replay")
