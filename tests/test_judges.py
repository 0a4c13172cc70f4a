"""LLM judges over real HTTP (scripted OpenAI-compatible server): prompts, verdict parsing,
and execution of the counterexample a model claims."""

from __future__ import annotations

import json

import pytest

from schemas.equivalence import EquivalenceOptions, JudgeOptions, QueryPair
from schemas.settings import Settings
from tasks.equivalence.methods import evaluate, parse_method
from tasks.equivalence.judges import (
    build_messages,
    explanation_of,
    extract_counterexample,
    judge_model,
    parse_verdict,
    run_judge,
)
from tests.fakes.openai_server import ScriptedOpenAIServer, error, message
from tests.helpers import register_model

SCHEMA = ("CREATE TABLE employee (id INTEGER PRIMARY KEY, name TEXT NOT NULL, "
          "salary INTEGER NOT NULL);")
PAIR = QueryPair.model_validate({
    "id": "ties", "label": "not_equivalent", "schema": SCHEMA,
    "sql1": "SELECT name FROM employee ORDER BY salary DESC LIMIT 1",
    "sql2": "SELECT name FROM employee WHERE salary = (SELECT MAX(salary) FROM employee)",
})

GOOD_COUNTEREXAMPLE = """Two employees share the top salary, so the MAX query returns both.

```sql
INSERT INTO employee (id, name, salary) VALUES (1, 'ann', 10), (2, 'bob', 10);
```

VERDICT: NOT EQUIVALENT"""

# the model believes this separates the queries, but with one employee both return 'ann'
BOGUS_COUNTEREXAMPLE = """With a single employee the LIMIT query might differ.

```sql
INSERT INTO employee VALUES (1, 'ann', 10);
```

**Verdict:** Not Equivalent"""

# breaks the primary key: two rows with id 1
KEY_BREAKING = """```sql
INSERT INTO employee VALUES (1, 'ann', 10);
INSERT INTO employee VALUES (1, 'bob', 10);
```
VERDICT: NOT EQUIVALENT"""


@pytest.mark.parametrize("technique", ["counter_example", "miniature_mull", "explain_compare"])
@pytest.mark.parametrize("notion", ["semantic", "relaxed"])
def test_prompts_carry_technique_notion_schema_and_queries(technique, notion):
    msgs = build_messages(technique, notion, PAIR.sql1, PAIR.sql2, SCHEMA, "duckdb")
    assert [m["role"] for m in msgs] == ["system", "user"]
    user = msgs[1]["content"]
    assert PAIR.sql1 in user and PAIR.sql2 in user and SCHEMA in user
    assert ("SEMANTICALLY EQUIVALENT" in user) == (notion == "semantic")
    assert ("RELAXED EQUIVALENT" in user) == (notion == "relaxed")
    marker = {"counter_example": "look for a counterexample",
              "miniature_mull": "miniature database",
              "explain_compare": "explain, then compare"}[technique]
    assert marker in user
    assert "VERDICT: NOT EQUIVALENT" in user and "INSERT INTO" in user


def test_unknown_technique_or_notion():
    with pytest.raises(ValueError, match="technique"):
        build_messages("vibes", "semantic", "SELECT 1", "SELECT 1", "")
    with pytest.raises(ValueError, match="notion"):
        build_messages("counter_example", "strict", "SELECT 1", "SELECT 1", "")


@pytest.mark.parametrize("text, verdict", [
    ("reasoning...\nVERDICT: EQUIVALENT", "equivalent"),
    ("VERDICT: NOT EQUIVALENT", "not_equivalent"),
    ("**Verdict:** Not Equivalent", "not_equivalent"),
    ("Final answer: **NOT_EQUIVALENT**", "not_equivalent"),
    ("verdict = non-equivalent.", "not_equivalent"),
    ("Verdict: `EQUIVALENT`", "equivalent"),
    ("VERDICT - NOT SEMANTICALLY EQUIVALENT", "not_equivalent"),
    ("First VERDICT: NOT EQUIVALENT. On reflection... VERDICT: EQUIVALENT", "equivalent"),
    ('{"equivalent": false, "reason": "ties"}', "not_equivalent"),
    ("Answer: Yes", "equivalent"),
    ("Answer: No", "not_equivalent"),
    ("So the two queries are not equivalent.", "not_equivalent"),
    ("Both queries are semantically equivalent.", "equivalent"),
    ("Conclusion: they are inequivalent", "not_equivalent"),
    ("I cannot tell.", "unparsed"),
    ("", "unparsed"),
    (None, "unparsed"),
])
def test_verdict_parsing_is_robust_to_formatting(text, verdict):
    assert parse_verdict(text) == verdict


def test_counterexample_extraction():
    assert extract_counterexample(GOOD_COUNTEREXAMPLE).startswith("INSERT INTO employee")
    two_blocks = "```sql\nSELECT 1;\n```\nthen\n```\nINSERT INTO t VALUES (1);\n```\nVERDICT: NOT EQUIVALENT"
    assert extract_counterexample(two_blocks) == "INSERT INTO t VALUES (1);\n"
    bare = "Use:\ninsert into t values (1);\nINSERT INTO t VALUES (2);\nVERDICT: NOT EQUIVALENT"
    assert extract_counterexample(bare) == "insert into t values (1);\nINSERT INTO t VALUES (2);\n"
    assert extract_counterexample("VERDICT: EQUIVALENT") is None
    explanation = explanation_of(GOOD_COUNTEREXAMPLE)
    assert "top salary" in explanation and "INSERT" not in explanation and "VERDICT" not in explanation


def _client(srv, model: str = "scripted", **options):
    """The judge model ``model`` at the scripted server (not in the models table: unpriced)."""
    settings = Settings(openai_base_url=srv.base_url, openai_api_key="test")
    return judge_model(model, settings, JudgeOptions(**{"api_retries": 0, **options}))


def test_run_judge_over_http_records_tokens_cost_and_temperature_zero(tmp_path, monkeypatch):
    usage = {"prompt_tokens": 1200, "completion_tokens": 300}
    with ScriptedOpenAIServer([message(GOOD_COUNTEREXAMPLE, usage=usage)]) as srv:
        # prices come from the models table only
        register_model(srv.base_url, tmp_path, monkeypatch.setenv, name="judge-model",
                       prices="{input: 2.0, output: 8.0}")
        chat = judge_model("judge-model", Settings(), artifacts_root=str(tmp_path / "art"))
        out = run_judge(chat, "counter_example", "semantic",
                        sql1=PAIR.sql1, sql2=PAIR.sql2, schema_ddl=SCHEMA)
        request = srv.requests[0]
        # the same question again is answered by the shared response cache, at no cost
        again = run_judge(chat, "counter_example", "semantic",
                          sql1=PAIR.sql1, sql2=PAIR.sql2, schema_ddl=SCHEMA)
        assert srv.request_count == 1
    assert request["temperature"] == 0 and request["model"] == "judge-model"
    assert request["max_completion_tokens"] == 2048
    assert "tools" not in request and len(request["messages"]) == 2
    assert out.verdict == "not_equivalent" and out.error is None
    assert (out.prompt_tokens, out.completion_tokens) == (1200, 300)
    assert out.cost_usd == pytest.approx((1200 * 2.0 + 300 * 8.0) / 1e6) and out.priced
    assert out.counterexample.startswith("INSERT") and out.response == GOOD_COUNTEREXAMPLE
    assert out.finish_reason == "stop" and out.seconds > 0 and out.attempts == 1
    assert again.cache_hit and again.cost_usd == 0 and again.verdict == out.verdict
    assert again.counterexample == out.counterexample and again.attempts == 0


def test_unpriced_judge_costs_zero_and_infra_errors_are_retried():
    script = [error(503, retry_after=0), message("VERDICT: EQUIVALENT",
                                                   {"prompt_tokens": 10, "completion_tokens": 2})]
    with ScriptedOpenAIServer(script) as srv:
        out = run_judge(_client(srv, "unlisted", api_retries=1), "explain_compare", "relaxed",
                        sql1="SELECT 1", sql2="SELECT 1", schema_ddl="")
        assert srv.request_count == 2
    assert out.verdict == "equivalent" and out.attempts == 2
    assert out.priced is False and out.cost_usd == 0 and out.prompt_tokens == 10


def test_api_error_is_a_verdict_not_an_exception():
    with ScriptedOpenAIServer([error(400, "bad request"), message("VERDICT: EQUIVALENT")]) as srv:
        out = run_judge(_client(srv, "m", api_retries=3), "explain_compare", "relaxed",
                        sql1="SELECT 1", sql2="SELECT 2", schema_ddl="")
        assert srv.request_count == 1  # a 400 is not retried
    assert out.verdict == "error" and "bad request" in out.error and out.attempts == 1


def _evaluate(reply: str, method: str = "judge:counter_example:semantic:scripted"):
    with ScriptedOpenAIServer([message(reply)]) as srv:
        row = evaluate(PAIR, parse_method(method), EquivalenceOptions(), client=_client(srv))
        assert srv.request_count == 1
    return row


def test_claimed_counterexample_that_separates_is_verified():
    row = _evaluate(GOOD_COUNTEREXAMPLE)
    assert row["verdict"] == "not_equivalent" and row["correct"] is True
    assert row["verified"] is True and row["verify_error"] is None
    assert row["counterexample_rows"] == 2
    details = json.loads(row["details"])
    assert details["result1"].startswith("1 row") and details["result2"].startswith("2 rows")


def test_claimed_counterexample_that_does_not_separate_is_recorded_unverified():
    row = _evaluate(BOGUS_COUNTEREXAMPLE, "judge:miniature_mull:semantic:scripted")
    assert row["verdict"] == "not_equivalent"  # the model's verdict is kept ...
    assert row["counterexample"].startswith("INSERT INTO employee VALUES (1, 'ann', 10)")
    assert row["verified"] is False  # ... but its counterexample was executed and failed
    assert row["verify_error"] is None
    assert row["technique"] == "miniature_mull" and row["model"] == "scripted"


def test_claimed_counterexample_that_breaks_the_schema_is_unverified():
    row = _evaluate(KEY_BREAKING)
    assert row["verified"] is False and "breaks the schema" in row["verify_error"]


def test_equivalent_verdict_without_counterexample_and_relaxed_labels():
    row = _evaluate("They differ only in aliases.\nVERDICT: EQUIVALENT",
                    "judge:explain_compare:relaxed:scripted")
    assert row["verdict"] == "equivalent" and row["verified"] is None
    # a single "not_equivalent" label is a semantic label: no relaxed label, no correctness
    assert row["notion"] == "relaxed" and row["label"] is None and row["correct"] is None


def test_unparsed_reply_is_recorded():
    row = _evaluate("Hmm, hard to say.")
    assert row["verdict"] == "unparsed" and row["response"] == "Hmm, hard to say."
    assert row["correct"] is None


def test_judge_without_configuration_is_an_error_row(settings):
    with pytest.raises(ValueError, match="QUERYLAB_OPENAI"):
        judge_model("m", Settings())
    with pytest.raises(ValueError, match="models table"):
        JudgeOptions.model_validate({"prices": {"m": [1.0, 2.0]}})
    row = evaluate(PAIR, parse_method("judge:counter_example:semantic:m"), EquivalenceOptions(),
                   client=None, client_error="no key")
    assert row["verdict"] == "error" and row["error"] == "no key"
