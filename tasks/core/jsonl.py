"""Reading a JSONL file line by line, naming the line of a bad one."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

__all__ = ["parse_jsonl"]

T = TypeVar("T")


def parse_jsonl(text: str, parse: Callable[[Any], T], fail: Callable[[int, Exception], Exception],
                catch: tuple[type[BaseException], ...] = (ValueError, KeyError, TypeError),
                ) -> Iterator[tuple[int, T]]:
    """``(line number, parse(object))`` for each non-blank line of ``text`` (JSONL; lines
    numbered from 1), lazily, in order — so ``parse`` may read what the caller did with the
    lines before. An exception of ``catch`` from decoding a line or from ``parse`` raises
    ``fail(line number, exception)`` instead (its cause suppressed); anything else
    propagates."""
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            value = parse(json.loads(line))
        except catch as exc:
            raise fail(lineno, exc) from None
        yield lineno, value
