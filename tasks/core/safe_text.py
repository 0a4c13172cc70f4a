"""Text from a model or an endpoint made safe for a terminal or a log line.

An endpoint's error message or a model's reply can carry ANSI escape sequences (``ESC[2K``
erases a line, ``ESC]...BEL`` retitles the terminal) and other control characters that
rewrite what the user sees, e.g. the "Errored trials" lines. :func:`terminal_text` removes
them; it is applied where such text is printed or logged."""

from __future__ import annotations

import re

#: ANSI escape sequences: CSI (``ESC [`` ... final byte), OSC (``ESC ]`` ... BEL or ST), the
#: other two-character escapes, and their 8-bit C1 forms (CSI ``\x9b``, OSC ``\x9d``).
_ANSI = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]"
    r"|(?:\x1b\]|\x9d)[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"
    r"|\x1b[@-Z\\-_]"
)
#: Control characters left after the sequences are gone (C0 but tab/newline/CR, DEL, C1),
#: bidirectional overrides and lone surrogates.
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069"
                      "\ud800-\udfff]")


def terminal_text(text: object, limit: int | None = None) -> str:
    """``text`` (``str()`` of anything) without ANSI escape sequences or control characters,
    its whitespace runs (newlines included) folded to one space, cut to ``limit`` characters
    with ``…`` when longer: one printable line."""
    s = _CONTROL.sub("", _ANSI.sub("", text if isinstance(text, str) else str(text)))
    s = " ".join(s.split())
    return s if limit is None or len(s) <= limit else s[: max(limit - 1, 0)] + "…"
