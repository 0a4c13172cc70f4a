"""The optional LLM rewrite of templated design/implementation requirements, over real HTTP
against the scripted OpenAI-compatible server: the paraphrase reaches the items and the prompts
a model sees, the template is kept beside it, a failing call (or a paraphrase losing a column
name) falls back to the template with the error recorded, tokens and USD cost are recorded;
without a rewrite model the items are the templated ones."""

from __future__ import annotations

import argparse

import pytest

from schemas.lifecycle import ITEMS, LifecycleConfig
from schemas.settings import Settings
from tasks.core import storage
from tasks.lifecycle.agents import AgentConfigError, OpenAIAgent
from tasks.lifecycle.items import generate_phase_items
from tasks.lifecycle.pipeline import (
    generate_lifecycle_items,
    items_to_table,
    read_items,
    read_items_table,
)
from tasks.lifecycle.rewrite import (
    REWRITE_SYSTEM_PROMPT,
    check_rewrite_spec,
    requirements_text,
    rewrite_items,
)
from tasks.lifecycle.runner import RunContext, run_item
from tests.fakes.openai_server import ScriptedOpenAIServer, error, message
from tests.helpers import SHARED_DATA, register_model

CHINOOK = SHARED_DATA / "chinook" / "Chinook_Sqlite.sqlite"
CFG = LifecycleConfig(include_chinook=True, spider_db_ids=[], design_table_counts=[1, 2], seed=5)
USAGE = {"prompt_tokens": 100, "completion_tokens": 40}


def _paraphrase(text: str) -> str:
    return "PARAPHRASED. " + text.replace("\n\n", "\n")


class _Responder:
    """Paraphrases every request, fails the design k1 item (HTTP 400) and drops a column name
    from the implementation ``all`` item's paraphrase."""

    def __call__(self, body: dict, index: int):
        user = body["messages"][-1]["content"]
        text = user.split("Rewrite this text:\n\n", 1)[1]
        if text.startswith("The database must hold one kind of record"):
            return error(400, "scripted rewrite failure")
        if text.count("Table ") > 5:  # implementation/chinook/all: lose one column name
            return message(_paraphrase(text).replace("- BillingCity:", "- city:"), USAGE)
        return message(f"```\n{_paraphrase(text)}\n```", USAGE)


@pytest.fixture
def models_env(tmp_path, monkeypatch):
    def setup(base_url: str) -> Settings:
        register_model(base_url, tmp_path, monkeypatch.setenv, name="rw",
                       key_env="QUERYLAB_OPENAI_API_KEY", api_key_required=False,
                       prices="{input: 1.0, output: 2.0}")
        return Settings(openai_base_url=base_url, openai_api_key="sk-test")

    return setup


@pytest.fixture(scope="module")
def databases(tmp_path_factory):
    d = {"spider": {}, "chinook": str(CHINOOK), "variants": {}, "questions": "unused"}
    return storage.write_json(str(tmp_path_factory.mktemp("dbs") / "databases.json"), d)


def _phase_items(databases_uri: str, phase: str) -> list[dict]:
    return generate_phase_items(phase, storage.read_json(databases_uri), CFG)[0]


def test_rewrite_reaches_items_keeps_template_and_falls_back(databases, models_env, tmp_path):
    design = _phase_items(databases, "design")
    impl = _phase_items(databases, "implementation")
    assert [i["item_id"] for i in design] == ["design/chinook/k1/0", "design/chinook/k2/0"]
    with ScriptedOpenAIServer(_Responder()) as srv:
        settings = models_env(srv.base_url)
        out, summary = rewrite_items(design + impl, "openai:rw", settings, CFG, str(tmp_path))
        reqs = list(srv.requests)
    by_id = {i["item_id"]: i for i in out}
    assert len(reqs) == len(design) + len(impl) == 5
    # the prompt forbids adding or dropping entities, attributes, relationships
    for r in reqs:
        assert r["model"] == "rw" and r["messages"][0]["content"].startswith(REWRITE_SYSTEM_PROMPT)
        assert "Do not add any entity, attribute or relationship" in r["messages"][0]["content"]
    assert "exactly as written" in reqs[-1]["messages"][0]["content"]

    # design k2: paraphrased (fence stripped) in prompt and context; template kept
    orig = {i["item_id"]: i for i in design + impl}
    k2 = by_id["design/chinook/k2/0"]
    template = orig["design/chinook/k2/0"]["context"]["requirements"]
    assert k2["requirements_template"] == template
    assert k2["context"]["requirements"] == _paraphrase(template)
    assert f"Requirements:\n\n{_paraphrase(template)}\n\nDesign a relational" in k2["prompt"]
    assert k2["rewritten_by"] == "openai:rw" and k2["rewrite_error"] is None
    assert (k2["rewrite_prompt_tokens"], k2["rewrite_completion_tokens"]) == (100, 40)
    assert k2["rewrite_cost_usd"] == pytest.approx((100 * 1.0 + 40 * 2.0) / 1e6)
    assert k2["reference"] == orig["design/chinook/k2/0"]["reference"]

    # design k1: the call failed -> template kept, error recorded, nothing paid
    k1 = by_id["design/chinook/k1/0"]
    assert k1["prompt"] == orig["design/chinook/k1/0"]["prompt"]
    assert k1["rewritten_by"] is None and k1["rewrite_error"].startswith("api_error")
    assert "scripted rewrite failure" in k1["rewrite_error"]
    assert k1["requirements_template"] == orig["design/chinook/k1/0"]["context"]["requirements"]

    # implementation: paraphrased structured design; the one losing a column name falls back
    ik2 = by_id["implementation/chinook/k2/0"]
    assert ik2["rewritten_by"] == "openai:rw"
    assert _paraphrase(ik2["requirements_template"]) in ik2["prompt"]
    assert ik2["requirements_template"] == requirements_text(orig["implementation/chinook/k2/0"])
    whole = by_id["implementation/chinook/all"]
    assert whole["prompt"] == orig["implementation/chinook/all"]["prompt"]
    assert whole["rewrite_error"] == "rewrite lost names ['BillingCity']"
    assert whole["rewrite_cost_usd"] == pytest.approx(180 / 1e6)  # it was paid for

    assert summary["n_items"] == 5 and summary["n_rewritten"] == 3 and summary["n_fallback"] == 2
    assert summary["prompt_tokens"] == 400 and summary["completion_tokens"] == 160
    assert summary["cost_usd"] == pytest.approx(4 * 180 / 1e6)
    assert set(summary["errors"]) == {"design/chinook/k1/0", "implementation/chinook/all"}


def test_pipeline_items_artifact_and_model_prompt(databases, models_env, tmp_path):
    root = str(tmp_path / "art")
    plain = generate_lifecycle_items.fn("plain", root, "design", databases, CFG.model_dump())
    assert "rewrite" not in plain
    rows = read_items(plain["uri"])
    # no rewrite model: the templated items, rewrite columns null
    assert items_to_table(_phase_items(databases, "design")).equals(read_items_table(plain["uri"]))
    assert all(r["requirements_template"] is None and r["rewritten_by"] is None for r in rows)

    with ScriptedOpenAIServer(_Responder()) as srv:
        models_env(srv.base_url)
        man = generate_lifecycle_items.fn(
            "rw", root, "design", databases, CFG.model_dump(), "openai:rw"
        )
        text2 = generate_lifecycle_items.fn(
            "rw", root, "assigner", databases, CFG.model_dump(), "openai:rw"
        )
        n_rewrite_calls = srv.request_count
    assert man["rewrite"]["n_rewritten"] == 1 and man["rewrite"]["n_fallback"] == 1
    assert "rewrite" not in text2 and n_rewrite_calls == 2  # only design items are rewritten
    items = {r["item_id"]: r for r in read_items(man["uri"])}
    k2 = items["design/chinook/k2/0"]
    assert k2["rewritten_by"] == "openai:rw"
    assert k2["requirements_template"] != k2["context"]["requirements"]
    # a re-run with another rewrite model is refused; with the same one the items are kept
    with pytest.raises(ValueError, match="rewrite model openai:rw, not none"):
        generate_lifecycle_items.fn("rw", root, "design", databases, CFG.model_dump())
    again = generate_lifecycle_items.fn(
        "rw", root, "design", databases, CFG.model_dump(), "openai:rw"
    )
    assert again["uri"] == man["uri"]

    # the model under test sees the paraphrase
    with ScriptedOpenAIServer([message("```json\n{}\n```")]) as srv:
        settings = models_env(srv.base_url)
        agent = OpenAIAgent("rw", settings, LifecycleConfig(api_retries=0))
        ctx = RunContext(storage.read_json(databases), CFG)
        run_item(agent, k2, ctx, "r")
        agent.close()
        seen = srv.requests[0]["messages"][-1]["content"]
    assert "PARAPHRASED. " in seen and k2["context"]["requirements"] in seen


def test_old_items_without_rewrite_columns_still_read(databases, tmp_path):
    table = items_to_table(_phase_items(databases, "design"))
    old = table.select([f.name for f in ITEMS if not f.name.startswith(("requirements_", "rewr"))])
    uri = str(tmp_path / "old.parquet")
    storage.write_parquet(uri, old.replace_schema_metadata(ITEMS.metadata))
    assert read_items_table(uri).equals(table)


def test_bad_rewrite_spec(tmp_path):
    for spec in ("oracle", "replay:x.jsonl", "openai:", "rw"):
        with pytest.raises(AgentConfigError, match="openai:<model>"):
            check_rewrite_spec(spec)
    with pytest.raises(AgentConfigError, match="QUERYLAB_OPENAI"):
        rewrite_items([], "openai:nowhere-model", Settings(), CFG)

    from querylab import cmd_lifecycle

    parser = argparse.ArgumentParser()
    cmd_lifecycle.register(parser.add_subparsers())
    args = parser.parse_args(
        [
            "lifecycle",
            "items",
            "--no-chinook",
            "--spider-dir",
            "x",
            "--questions",
            "y",
            "--rewrite-model",
            "oracle",
        ]
    )
    assert args.rewrite_model == "oracle" and args.func(args) == 2
