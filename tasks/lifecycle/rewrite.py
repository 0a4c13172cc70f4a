"""Optional LLM rewrite of the templated requirements texts of P1 Design and P2 Implementation
items (DBLifeBench renders requirements from the schema; a rewrite makes them read less
mechanically while describing the same schema).

Without a rewrite model nothing runs and the items are exactly the templated ones. With
``openai:<model>`` every design/implementation item's requirements text — the design
requirements (``context["requirements"]``, the ``Requirements:`` block of the prompt) or the
structured design of an implementation prompt (:func:`tasks.lifecycle.design.describe_design`)
— is paraphrased by the model through the shared model layer :mod:`tasks.core.llm` (models table,
retries, the response cache under ``<artifacts>/cache/llm`` keyed by the item and the
conversation, USD prices) with :data:`REWRITE_SYSTEM_PROMPT`: it forbids adding or dropping
entities, attributes or relationships; implementation texts must also keep every table and
column name verbatim. The item's prompt is rebuilt around the paraphrase; the templated text is
kept beside it.

Per rewritten item the :data:`schemas.lifecycle.ITEMS` columns ``requirements_template`` (the
templated text), ``rewritten_by`` (the model label when the prompt holds its paraphrase),
``rewrite_error`` (why the template text was kept: API failure after retries, an empty answer,
an implementation paraphrase missing a table or column name), ``rewrite_prompt_tokens``,
``rewrite_completion_tokens`` and ``rewrite_cost_usd`` (null when the model has no price) are
set. A failed rewrite keeps the template text (and records the error); it never drops an item.
"""

from __future__ import annotations

import copy
import re

from schemas.lifecycle import LifecycleConfig
from schemas.settings import Settings
from tasks.core import llm
from tasks.lifecycle.agents import AgentConfigError, item_trial_index
from tasks.lifecycle.design import describe_design, design_prompt, implementation_prompt
from tasks.lifecycle.schema import Schema

__all__ = [
    "REWRITE_PHASES",
    "REWRITE_SYSTEM_PROMPT",
    "check_rewrite_spec",
    "requirements_text",
    "rewrite_items",
    "rewrite_label",
    "rewrite_request",
]

#: Phases whose items carry a templated requirements text.
REWRITE_PHASES = ("design", "implementation")

REWRITE_SYSTEM_PROMPT = (
    "You rewrite database requirements documents. Paraphrase the text you are given so that it "
    "reads naturally, as a person describing what they need would write it: vary the wording "
    "and the sentence structure. The rewrite must describe exactly the same database: keep "
    "every entity (kind of record), every attribute with its kind of value, every identifying "
    "attribute and every relationship between entities. Do not add any entity, attribute or "
    "relationship, do not drop or merge any, and do not invent constraints. Answer with the "
    "rewritten text only: no preamble, no comments, no code block."
)
_IMPLEMENTATION_RULE = (
    "This text is a database design. Keep every table name and column name exactly as written "
    "(same spelling and case), with its data type, its primary key and the columns it "
    "references."
)


def check_rewrite_spec(spec: str) -> str:
    """The model name of a rewrite spec ``openai:<model>``; raises
    :class:`tasks.lifecycle.agents.AgentConfigError` for anything else (oracle and replay
    agents have nothing to paraphrase with)."""
    kind, _, name = (spec or "").partition(":")
    if kind != "openai" or not name:
        raise AgentConfigError(
            f"rewrite model {spec!r}: use 'openai:<model>' (a chat model of the models table)"
        )
    return name


def rewrite_label(spec: str | None) -> str | None:
    """The label a rewrite spec records in ``rewritten_by`` (None: no rewrite stage)."""
    return None if spec is None else f"openai:{check_rewrite_spec(spec)}"


def requirements_text(item: dict) -> str:
    """The templated requirements text of a design or implementation item. Raises ValueError
    for other phases."""
    if item["phase"] == "design":
        return item["context"]["requirements"]
    if item["phase"] == "implementation":
        return describe_design(Schema.from_dict(item["reference"]["schema"]))
    raise ValueError(f"{item['item_id']}: phase {item['phase']!r} has no requirements text")


def rewrite_request(item: dict, text: str) -> list[dict]:
    """The chat messages asking for a paraphrase of ``text`` (system + user turn)."""
    rule = f" {_IMPLEMENTATION_RULE}" if item["phase"] == "implementation" else ""
    return [
        {"role": "system", "content": REWRITE_SYSTEM_PROMPT + rule},
        {"role": "user", "content": f"Rewrite this text:\n\n{text}"},
    ]


_FENCE = re.compile(r"^```[A-Za-z]*\n(.*)\n```$", re.DOTALL)


def _clean(content: str | None) -> str:
    text = (content or "").strip()
    m = _FENCE.match(text)
    return m.group(1).strip() if m else text


def _missing_names(item: dict, text: str) -> list[str]:
    """Implementation items: table/column names of the design absent from ``text``."""
    if item["phase"] != "implementation":
        return []
    schema = item["reference"]["schema"]
    names = []
    for t in schema["tables"]:
        names.append(t["name"])
        names += [c["name"] for c in t["columns"]]
    return [n for n in dict.fromkeys(names) if not re.search(rf"(?<!\w){re.escape(n)}(?!\w)", text)]


def _with_text(item: dict, text: str) -> dict:
    out = copy.deepcopy(item)
    if item["phase"] == "design":
        out["prompt"] = design_prompt(text, item["context"]["k"])
        out["context"]["requirements"] = text
    else:
        out["prompt"] = implementation_prompt(Schema.from_dict(item["reference"]["schema"]), text)
    return out


def rewrite_items(
    items: list[dict],
    model: str,
    settings: Settings,
    config: LifecycleConfig,
    artifacts_root: str | None = None,
) -> tuple[list[dict], dict]:
    """Paraphrase the requirements text of every design/implementation item of ``items`` with
    ``model`` (``openai:<model>``; module docstring). Other items pass through unchanged.

    Returns ``(items, summary)``: new item dicts with the rewrite columns set, and ``{"model",
    "n_items", "n_rewritten", "n_fallback", "prompt_tokens", "completion_tokens", "cost_usd"
    (None when a call had no price), "errors": {item_id: error} (first 20)}``. Raises
    :class:`tasks.lifecycle.agents.AgentConfigError` for a bad spec or a model that cannot be
    resolved (no endpoint, missing key) — before any call."""
    name = check_rewrite_spec(model)
    try:
        resolved = llm.resolve_model(name, env=llm.settings_env(settings))
    except llm.AgentConfigError as exc:
        raise AgentConfigError(f"rewrite model: {exc}") from None
    label = f"openai:{name}"
    cache = llm.ResponseCache(artifacts_root, config.cache) if artifacts_root else None
    chat = llm.ChatModel(resolved, config.agent_options(), cache)
    out, errors = [], {}
    n_items = n_rewritten = prompt_tokens = completion_tokens = 0
    cost: float | None = 0.0
    try:
        for item in items:
            if item["phase"] not in REWRITE_PHASES:
                out.append(item)
                continue
            n_items += 1
            template = requirements_text(item)
            error, new = None, None
            try:
                resp, rec = chat.complete(
                    rewrite_request(item, template),
                    None,
                    trial=item_trial_index(item["item_id"]),
                    call_index=0,
                )
                new = _clean(resp.choices[0].message.content)
                if not new:
                    error = "empty rewrite"
                elif missing := _missing_names(item, new):
                    error = f"rewrite lost names {missing[:10]}"
            except llm.LLMCallError as exc:
                rec, error = exc.record, f"api_error: {exc}"[:500]
            call_cost = rec.cost_usd if rec.priced else None  # 0 for a failed call
            prompt_tokens += rec.prompt_tokens
            completion_tokens += rec.completion_tokens
            cost = None if cost is None or call_cost is None else cost + call_cost
            row = item if error else _with_text(item, new)
            row = {
                **row,
                "requirements_template": template,
                "rewritten_by": None if error else label,
                "rewrite_error": error,
                "rewrite_prompt_tokens": rec.prompt_tokens,
                "rewrite_completion_tokens": rec.completion_tokens,
                "rewrite_cost_usd": call_cost,
            }
            if error:
                errors[item["item_id"]] = error
            else:
                n_rewritten += 1
            out.append(row)
    finally:
        chat.close()
    summary = {
        "model": label,
        "n_items": n_items,
        "n_rewritten": n_rewritten,
        "n_fallback": n_items - n_rewritten,
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "cost_usd": cost,
        "errors": dict(list(errors.items())[:20]),
    }
    return out, summary
