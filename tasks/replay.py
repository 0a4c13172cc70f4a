"""The ``replay:<file>`` agent: scores recorded answers in DAB's leaderboard format.

An answer file is a JSON list (or JSON Lines) of ``{"dataset", "query", "run", "answer"}``
objects, as DAB leaderboard submissions are::

    [{"dataset": "STOCKS", "query": "1", "run": "0", "answer": "Facebook"}, ...]

- ``dataset`` matches a querylab dataset name, case-insensitively;
- ``query`` is a query id (``nasdaq_top_volume_2012``) or, as in DAB, its 1-based position in the
  dataset's query list (``"1"``, ``1`` or ``"query1"``); an exact id wins;
- ``run`` is the 0-based trial index (int or digit string);
- ``answer`` is the free-text answer (a non-string is scored as its JSON text; null = none).

Each trial of a replay run takes the answer of its (dataset, query, run) and scores it with the
query's validator, like any agent's ``return_answer``; a trial with no entry ends with terminate
reason ``no_answer`` (incorrect). Other keys of an entry are ignored. Problems in the file
(not JSON, missing keys, a bad run, duplicates, a query that a dataset of the run does not
have) raise :class:`ReplayError` naming the file and entry before any trial runs.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from tasks.agent import TrialOutcome
from tasks.llm import AgentConfigError

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

    def datasets(self) -> set[str]:
        """Lower-cased dataset names that have entries."""
        return {d for d, _, _ in self.entries}


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
    return out


def resolve_query(manifest: dict, query: str) -> str | None:
    """The query id an entry's ``query`` refers to in ``manifest`` (exact id, else 1-based
    position as ``"3"`` or ``"query3"``), or None."""
    ids = [q["id"] for q in manifest["queries"]]
    if query in ids:
        return query
    m = re.fullmatch(r"(?:query)?(\d+)", query, flags=re.IGNORECASE)
    if m and 1 <= int(m.group(1)) <= len(ids):
        return ids[int(m.group(1)) - 1]
    return None


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
        raise ReplayError(
            f"{answers.path}: dataset {manifest['name']!r} has no queries {sorted(set(unknown))}; "
            f"it has {[q['id'] for q in manifest['queries']]} (or 1..{len(manifest['queries'])})"
        )
    return out


def run_replay(answers: dict[tuple[str, int], str | None], query_id: str, trial: int) -> TrialOutcome:
    """The trial outcome for ``(query_id, trial)``: the recorded answer with terminate reason
    ``replay``, or ``no_answer`` when the file has none."""
    if (query_id, trial) not in answers:
        return TrialOutcome(None, "no_answer", f"no answer for query {query_id!r} run {trial}")
    return TrialOutcome(answers[(query_id, trial)], "replay")
