"""Semantic name matching for the lifecycle suite (ACC-Entity/Data/Key, T-Level, F-Level).

No LLM is involved: two names match when their **keys** are equal, and a key is computed by a
fixed normalisation:

1. **Split into words** at underscores, hyphens, spaces, dots and other non-alphanumerics, at
   lower→upper case boundaries (``InvoiceLine`` → invoice, line), inside acronyms
   (``TVChannel`` → tv, channel) and around digits (``line2`` → line, 2); **lower-case** every
   word.
2. **Singularise** each word with English rules: irregular plurals (people → person, children →
   child, indices → index...), ``-ies`` → ``-y`` (countries) except ``-ie`` words (movies),
   ``-sses``/``-xes``/``-ches``/``-shes`` → drop ``es``, ``-uses`` of ``-us`` words (statuses),
   a few ``-ves`` → ``-f(e)`` words (shelves), otherwise a final ``s`` is dropped — except after
   ``ss``/``us``/``is``, in words of three letters or fewer (``has``; ``ids`` is the exception)
   and in invariant words (series, news, species...).
3. **Synonyms**: runs of words found in the synonym list (``data/lifecycle/synonyms.yaml``,
   longest entry first) are replaced by their group's canonical entry, so ``staff`` →
   employee, ``qty`` → quantity, ``given_name`` → first name.
4. For a **table** name, a leading ``tbl``/``tb``/``t`` word (a table prefix) is dropped when
   other words remain.
5. The key is the **concatenation** of the remaining words, so word boundaries do not matter
   (``home_town`` = ``HomeTown`` = ``hometown``).

A **column** also matches when the key of one side equals the other side's key with its table's
key removed from the front (``singer.Singer_ID`` ~ ``singers.id``; ``singer.name`` ~
``singer.singer_name``). Matching is one-to-one and greedy in reference order: exact keys first,
then the table-prefix rule (:func:`match_names`).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

import yaml

__all__ = [
    "SYNONYMS_FILE",
    "NamingError",
    "column_key",
    "load_synonyms",
    "match_names",
    "name_key",
    "names_match",
    "singularise",
    "split_words",
    "table_key",
]

SYNONYMS_FILE = Path(__file__).resolve().parents[2] / "data" / "lifecycle" / "synonyms.yaml"

_WORD = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+")

_IRREGULAR = {
    "people": "person",
    "persons": "person",
    "children": "child",
    "men": "man",
    "women": "woman",
    "mice": "mouse",
    "geese": "goose",
    "teeth": "tooth",
    "feet": "foot",
    "indices": "index",
    "vertices": "vertex",
    "matrices": "matrix",
    "criteria": "criterion",
    "phenomena": "phenomenon",
    "analyses": "analysis",
    "theses": "thesis",
    "crises": "crisis",
    "wolves": "wolf",
    "knives": "knife",
    "lives": "life",
    "wives": "wife",
    "shelves": "shelf",
    "leaves": "leaf",
    "halves": "half",
    "thieves": "thief",
    "calves": "calf",
    "heroes": "hero",
    "potatoes": "potato",
    "tomatoes": "tomato",
    "echoes": "echo",
    "ids": "id",
}
_INVARIANT = {
    "series",
    "species",
    "news",
    "means",
    "data",
    "physics",
    "mathematics",
    "economics",
    "athletics",
    "politics",
    "statistics",
    "analytics",
    "headquarters",
}
_IE_WORDS = {
    "movie",
    "cookie",
    "pie",
    "tie",
    "calorie",
    "zombie",
    "lie",
    "die",
    "rookie",
    "prairie",
    "brownie",
    "genie",
    "selfie",
    "sortie",
    "goalie",
    "smoothie",
    "specie",
    "hippie",
}
_US_WORDS = {"status", "bus", "campus", "virus", "bonus", "census", "focus", "genus", "corpus"}
_TABLE_PREFIXES = {"tbl", "tb", "t"}


class NamingError(ValueError):
    """The synonym list is missing or malformed (the message names the file)."""


def split_words(name: str) -> list[str]:
    """``name`` split into lower-case words (rule 1 of the module docstring).

    ``"Song_release_year"`` → ``["song", "release", "year"]``, ``"TVChannel"`` → ``["tv",
    "channel"]``, ``"Home Town"`` → ``["home", "town"]``."""
    return [w.lower() for w in _WORD.findall(str(name))]


def singularise(word: str) -> str:
    """The singular of one lower-case English word (rule 2 of the module docstring)."""
    w = word.lower()
    if w in _IRREGULAR:
        return _IRREGULAR[w]
    if w in _INVARIANT or len(w) <= 3 or not w.endswith("s"):
        return w
    if w.endswith(("ss", "us", "is")):
        return w
    if w.endswith("ies"):
        return w[:-1] if w[:-1] in _IE_WORDS else w[:-3] + "y"
    if w.endswith(("sses", "xes", "ches", "shes", "zzes")):
        return w[:-3] if w.endswith("zzes") else w[:-2]
    if w.endswith("uses") and w[:-2] in _US_WORDS:
        return w[:-2]
    return w[:-1]


@functools.lru_cache(maxsize=8)
def _load(path: str) -> tuple[dict[tuple[str, ...], tuple[str, ...]], int]:
    p = Path(path)
    try:
        raw = yaml.safe_load(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise NamingError(f"{p}: synonym list not found") from None
    except yaml.YAMLError as e:
        raise NamingError(f"{p}: not valid YAML: {e}") from None
    groups = raw.get("groups") if isinstance(raw, dict) else None
    if not isinstance(groups, list):
        raise NamingError(f"{p}: expected a mapping with a 'groups' list")
    table: dict[tuple[str, ...], tuple[str, ...]] = {}
    longest = 1
    for i, group in enumerate(groups):
        if not isinstance(group, list) or len(group) < 2:
            raise NamingError(f"{p}: groups[{i}] must list at least two entries")
        canon = tuple(singularise(w) for w in split_words(str(group[0])))
        for entry in group:
            words = tuple(singularise(w) for w in split_words(str(entry)))
            if not words:
                raise NamingError(f"{p}: groups[{i}] has an empty entry")
            if words in table and table[words] != canon:
                raise NamingError(f"{p}: {entry!r} appears in two synonym groups")
            table[words] = canon
            longest = max(longest, len(words))
    return table, longest


def load_synonyms(path: str | Path | None = None) -> dict[tuple[str, ...], tuple[str, ...]]:
    """The synonym table ``{words: canonical words}`` from ``path`` (default
    :data:`SYNONYMS_FILE`). Raises :class:`NamingError` for a missing or malformed file or an
    entry listed in two groups."""
    return dict(_load(str(path or SYNONYMS_FILE))[0])


def _canonical_words(name: str, synonyms_path: str | None) -> list[str]:
    table, longest = _load(str(synonyms_path or SYNONYMS_FILE))
    words = [singularise(w) for w in split_words(name)]
    out: list[str] = []
    i = 0
    while i < len(words):
        for n in range(min(longest, len(words) - i), 0, -1):
            canon = table.get(tuple(words[i : i + n]))
            if canon is not None:
                out.extend(canon)
                i += n
                break
        else:
            out.append(words[i])
            i += 1
    return out


def name_key(name: str, synonyms_path: str | Path | None = None) -> str:
    """The matching key of a column (or any) name: rules 1–3 and 5 of the module docstring.

    ``name_key("Song_release_year") == name_key("songReleaseYears") == "songreleaseyear"``."""
    return "".join(_canonical_words(name, str(synonyms_path) if synonyms_path else None))


def table_key(name: str, synonyms_path: str | Path | None = None) -> str:
    """The matching key of a table name: like :func:`name_key` plus rule 4 (a leading
    ``tbl``/``tb``/``t`` word is dropped), so ``tbl_Singers`` → ``singer``."""
    words = _canonical_words(name, str(synonyms_path) if synonyms_path else None)
    if len(words) > 1 and words[0] in _TABLE_PREFIXES:
        words = words[1:]
    return "".join(words)


def column_key(column: str, table: str | None = None, synonyms_path: str | Path | None = None):
    """``(key, key without the table's key in front)`` of a column of ``table``; the second is
    None when the column key does not start with the table key (or nothing would remain)."""
    key = name_key(column, synonyms_path)
    if table:
        tkey = table_key(table, synonyms_path)
        if tkey and key.startswith(tkey) and len(key) > len(tkey):
            return key, key[len(tkey) :]
    return key, None


def names_match(
    a: str,
    b: str,
    table_a: str | None = None,
    table_b: str | None = None,
    synonyms_path: str | Path | None = None,
) -> bool:
    """True when column ``a`` (of ``table_a``) and column ``b`` (of ``table_b``) are the same
    name under the module's rules. Without tables only keys are compared."""
    ka, sa = column_key(a, table_a, synonyms_path)
    kb, sb = column_key(b, table_b, synonyms_path)
    return ka == kb or (sa is not None and sa == kb) or (sb is not None and sb == ka)


def match_names(
    reference: Sequence[str],
    predicted: Sequence[str],
    *,
    kind: str = "column",
    reference_table: str | None = None,
    predicted_table: str | None = None,
    synonyms_path: str | Path | None = None,
) -> dict[int, int]:
    """One-to-one matching of ``predicted`` names to ``reference`` names.

    ``kind``: ``"table"`` (keys by :func:`table_key`) or ``"column"`` (keys by
    :func:`column_key`, with the table-prefix rule using ``reference_table`` /
    ``predicted_table``). Greedy in reference order: first every exact key match, then the
    table-prefix rule for what is left. Returns ``{reference index: predicted index}``.
    Raises ValueError for an unknown ``kind``."""
    if kind not in ("table", "column"):
        raise ValueError(f"kind must be 'table' or 'column', got {kind!r}")
    if kind == "table":
        ref = [(table_key(n, synonyms_path), None) for n in reference]
        pred = [(table_key(n, synonyms_path), None) for n in predicted]
    else:
        ref = [column_key(n, reference_table, synonyms_path) for n in reference]
        pred = [column_key(n, predicted_table, synonyms_path) for n in predicted]
    out: dict[int, int] = {}
    used: set[int] = set()
    for i, (rk, _) in enumerate(ref):
        for j, (pk, _) in enumerate(pred):
            if j not in used and pk == rk:
                out[i] = j
                used.add(j)
                break
    for i, (rk, rs) in enumerate(ref):
        if i in out:
            continue
        for j, (pk, ps) in enumerate(pred):
            if j in used:
                continue
            if (
                (rs is not None and rs == pk)
                or (ps is not None and ps == rk)
                or (rs is not None and rs == ps)
            ):
                out[i] = j
                used.add(j)
                break
    return out


def unmatched(names: Iterable[str], matched: Iterable[int]) -> list[str]:
    """The names whose index is not in ``matched`` (for error details)."""
    m = set(matched)
    return [n for i, n in enumerate(names) if i not in m]
