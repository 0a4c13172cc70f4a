"""The report stage on hand-built run artifacts: every table written with its schema, manifests
found and recorded, llm_calls optional, Markdown/HTML content, the LLM-judge stage over real
HTTP (scripted server), Prefect artifacts inside a flow, and the ``querylab report`` command."""

from __future__ import annotations

import argparse
import base64
import re
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest

from schemas import artifacts
from schemas import report as rs
from tasks.core import storage
from tasks.report.failure_judge import judge_prompt, parse_judge_reply
from tasks.report.loaders import report_uri
from tasks.report.stage import (
    compute_report_tables,
    judge_failure_modes,
    render_report,
)
from tests.fakes.openai_server import ScriptedOpenAIServer, error, message
from tests.helpers import make_report, write_run, write_scores

@pytest.mark.slow
def test_report_from_artifacts_alone(tmp_path):
    root = str(tmp_path)
    write_run(root)
    tables, out = make_report(root)
    # every table is Parquet with its schema version
    for name, uri in tables["uris"].items():
        meta = pq.read_schema(uri).metadata
        assert (
            meta[b"schema_version"]
            == rs.ALL_SCHEMAS[meta[b"artifact"].decode()].metadata[b"schema_version"]
        ), name
    assert tables["counts"] == {
        "trials": 12,
        "scored": 11,
        "errored": 1,
        "agents": 2,
        "datasets": 1,
        "queries": 2,
        "incorrect": 3,
        "tool_calls": 37,
        "flagged": 0,
    }
    # the api_error trial is errored: out of n, counted beside it, never a failure mode
    assert tables["failed"] == [
        {"agent": "openai:m", "dataset": "movies", "query_id": "fresh", "n": 2, "n_errored": 1,
         "c": 1},
        {"agent": "openai:m", "dataset": "movies", "query_id": "oscars", "n": 3, "n_errored": 0,
         "c": 1},
    ]
    assert storage.read_json(report_uri(root, "hand", "manifests.json")) == [
        f"{root}/datasets/movies/1-test/manifest.json"
    ]
    assert any("llm_calls.parquet" in n for n in tables["notes"])
    labels = pl.read_parquet(tables["uris"]["failure_labels"])
    assert dict(zip(labels["trial_key"], labels["failure_mode"])) == {
        "openai:m|movies|fresh|1": "FM1",
        "openai:m|movies|oscars|1": "FM4",
        "openai:m|movies|oscars|2": "FM3",
    }
    fm = pl.read_parquet(tables["uris"]["failure_modes"]).filter(pl.col("dataset") == "ALL")
    assert fm.filter(pl.col("agent") == "oracle")["incorrect"].item() == 0
    m_fm = fm.filter(pl.col("agent") == "openai:m").row(0, named=True)
    assert (m_fm["trials"], m_fm["errored"], m_fm["incorrect"], m_fm["FM5"]) == (5, 1, 3, 0)
    ci = pl.read_parquet(tables["uris"]["pass_at_1_ci"]).filter(
        pl.col("agent") == "openai:m", pl.col("dataset") == "ALL (queries)").row(0, named=True)
    assert (ci["trials"], ci["errored"], ci["correct"]) == (5, 1, 2)
    assert ci["pass_at_1"] == pytest.approx((1 / 3 + 1 / 2) / 2)  # over scored trials only
    cost = pl.read_parquet(tables["uris"]["cost"])
    m_all = cost.filter(pl.col("agent") == "openai:m", pl.col("dataset") == "ALL").row(
        0, named=True
    )
    assert m_all["cost_usd"] == pytest.approx(0.12) and m_all[
        "cost_per_correct_usd"
    ] == pytest.approx(0.06)
    assert (m_all["trials"], m_all["errored"]) == (6, 1)  # errored trials cost money too
    assert m_all["llm_calls"] is None

    md = Path(out["markdown"]).read_text()
    for heading in (
        "## pass@k",
        "## pass@1 with confidence intervals",
        "## Cost",
        "## Failure modes",
        "## Errored trials",
        "## Trace audit",
        "## Tool use",
        "## Per query",
        "## Terminate reasons",
    ):
        assert heading in md
    assert re.search(r"\| oracle +\| movies", md) and "pass@3" in md and "pass^3" in md
    for name in ("pass_at_k", "pass_at_1_heatmap", "cost_vs_pass_at_1", "failure_modes"):
        assert f"](plots/{name}.png)" in md
        assert Path(out["plots"][name]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "domain_knowledge" in md  # reported as unchecked
    assert out["table"].startswith("| agent") and "ALL (queries)" in out["table"]
    assert "n_errored" in out["table"] and "--retry-errors" in md
    assert "No trial was flagged by the trace audit" in md  # an empty section is one sentence
    # examples show question, answer and ground truth, and link to the viewer
    assert "How many films won at least one Oscar?" in md and "viewer.html#trial=" in md
    assert Path(out["viewer"]).name == "viewer.html" and Path(out["viewer"]).exists()

    html = Path(out["html"]).read_text()
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', html)
    assert len(images) == 4 and all(base64.b64decode(i)[:4] == b"\x89PNG" for i in images)
    assert html.count('<table class="data') == 14  # cost and tool-use split; queries per k
    assert "http://" not in html.replace("http://127.0.0.1", "") and "<link" not in html
    assert out["prefect_artifacts"] == []  # not inside a flow run


@pytest.mark.slow
def test_llm_calls_feed_cache_and_retries(tmp_path):
    root = str(tmp_path)
    write_run(root, llm_calls=True)
    tables, _ = make_report(root)
    assert not any("llm_calls" in n for n in tables["notes"])
    cost = pl.read_parquet(tables["uris"]["cost"])
    m_all = cost.filter(pl.col("agent") == "openai:m", pl.col("dataset") == "ALL").row(
        0, named=True
    )
    assert m_all["llm_calls"] == 18 and m_all["retries"] == 6
    assert m_all["unpriced_calls"] == 2  # call 1 of each trial 0
    # a cost with unpriced calls in it is unknown, not $0 (or a lower bound passed off as one)
    assert m_all["cost_usd"] is None and m_all["cost_per_trial_usd"] is None
    assert m_all["response_cache_hit_share"] == pytest.approx(1 / 3)
    assert m_all["prompt_cache_share"] == pytest.approx(0.4)


@pytest.mark.slow
def test_missing_manifest_and_missing_run(tmp_path):
    root = str(tmp_path)
    write_run(root, manifest=False)
    tables, _ = make_report(root)
    assert any("No manifest for dataset `movies`" in n for n in tables["notes"])
    labels = pl.read_parquet(tables["uris"]["failure_labels"])
    assert set(labels["rule"]) <= {"requirements_unknown", "no_data_tool_call"}
    with pytest.raises(storage.StorageError, match="runs/nope/trials/trials.parquet"):
        compute_report_tables.fn("nope", root)


def test_parse_judge_reply():
    assert parse_judge_reply('{"failure_mode": "FM3", "rationale": "no films"}') == (
        "FM3",
        "no films",
        None,
    )
    assert parse_judge_reply('```json\n{"failure_mode": "FM 4"}\n```')[0] == "FM4"
    assert parse_judge_reply("I think this is FM2: wrong plan.")[0] == "FM2"
    assert parse_judge_reply("no idea") == (None, None, "no failure mode in reply")
    assert parse_judge_reply(None)[2] == "empty reply"
    prompt = judge_prompt("Q?", 42, None, "api_error", "boom", [], {"sources": ["a.b"]})
    assert "Q?" in prompt and "42" in prompt and "(no tool calls)" in prompt and "a.b" in prompt


@pytest.mark.slow
def test_judge_stage_over_http(tmp_path):
    root = str(tmp_path)
    write_run(root)
    tables = compute_report_tables.fn("hand", root)

    def responder(body, index):
        user = body["messages"][1]["content"]
        if "fresh|1" in user or "answer: 5" not in user and index == 99:
            return message("hmm")
        if "Stop reason: api_error" in user:
            return message('{"failure_mode": "FM5", "rationale": "API failed"}')
        if "Stop reason: no_tool_call" in user:
            return message("unsure")  # unparseable: recorded as an error
        if "revenue" in user and "films" not in user.split("Trajectory")[1]:
            return message('{"failure_mode": "FM3", "rationale": "never read films"}')
        return (
            error(500, "judge backend down")
            if index == 100
            else message('{"failure_mode": "FM2", "rationale": "plan"}')
        )

    with ScriptedOpenAIServer(responder) as srv:
        uri = judge_failure_modes.fn(
            "hand",
            root,
            "openai:judge-model",
            tables["manifests"],
            limit=10,
            base_url=srv.base_url,
            api_key="test",
        )
        first = srv.request_count
        # idempotent: trials judged without error are not asked again
        judge_failure_modes.fn(
            "hand",
            root,
            "openai:judge-model",
            tables["manifests"],
            limit=10,
            base_url=srv.base_url,
            api_key="test",
        )
        second = srv.request_count - first
        bodies = srv.requests
    assert first == 3 and second == 1  # only the unparseable one is retried
    assert bodies[0]["model"] == "judge-model" and bodies[0]["temperature"] == 0
    assert "How many films" in bodies[0]["messages"][1]["content"]
    judged = pl.read_parquet(uri)
    assert judged.height == 3 and set(judged["model"]) == {"judge-model"}
    got = dict(zip(judged["trial_key"], judged["failure_mode"]))
    assert "openai:m|movies|fresh|0" not in got  # errored: not a failure, never judged
    assert got["openai:m|movies|oscars|2"] == "FM3"
    assert got["openai:m|movies|fresh|1"] is None
    assert (
        judged.filter(pl.col("failure_mode").is_null())["error"].item()
        == "no failure mode in reply"
    )
    # the deterministic labels are untouched and the report shows the agreement table
    assert pl.read_parquet(tables["uris"]["failure_labels"]).height == 3
    tables["uris"]["failure_judge"] = uri
    out = render_report.fn("hand", root, tables)
    assert (
        "LLM judge `judge-model` vs deterministic labels (3 trials judged)"
        in Path(out["markdown"]).read_text()
    )


@pytest.mark.slow
def test_report_cli_with_judge_needs_no_prefect(tmp_path, capsys, monkeypatch):
    from querylab.cmd_report import register

    root = str(tmp_path)
    write_run(root, run_id="cli-hand")
    parser = argparse.ArgumentParser(prog="querylab")
    register(parser.add_subparsers(dest="command", required=True))
    verdict = message('{"failure_mode": "FM2", "rationale": "plan"}')
    with ScriptedOpenAIServer(lambda body, index: verdict) as srv:
        monkeypatch.setenv("QUERYLAB_OPENAI_BASE_URL", srv.base_url)
        monkeypatch.setenv("QUERYLAB_OPENAI_API_KEY", "test-key")
        args = parser.parse_args(
            ["report", "--run-id", "cli-hand", "--artifacts", root, "--judge-model",
             "openai:judge", "--judge-limit", "2"]
        )
        assert args.func(args) == 0  # openai:m failed queries, but no oracle failure
        assert srv.request_count == 2  # --judge-limit
        assert srv.request_headers[0]["authorization"] == "Bearer test-key"
    out = capsys.readouterr().out
    assert "| openai:m | movies" in out and "openai:m movies/fresh: 1/2 correct" in out
    assert "Errored trials: 1 of 12 (api_error 1)" in out
    html = next(line.split()[-1] for line in out.splitlines() if line.startswith("html:"))
    assert Path(html).name == "report.html" and Path(html).exists()
    assert "LLM judge `judge` vs deterministic labels (2 trials judged)" in Path(html).read_text()
    assert "test-key" not in Path(html).read_text()


def test_report_flow_publishes_prefect_artifacts(tmp_path, prefect_harness):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from flows.report import report

    root = str(tmp_path)
    write_run(root, run_id="flow-hand")
    out = report("flow-hand", artifacts_root=root)
    assert out["counts"]["errored"] == 1 and Path(out["viewer"]).exists()
    with get_client(sync_client=True) as client:
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(like_="querylab-%flow-hand"))
        )
    kinds = {a.key: a.type for a in found}
    assert kinds["querylab-report-flow-hand"] == "markdown"
    assert kinds["querylab-pass-k-flow-hand"] == "table"
    assert kinds["querylab-failure-modes-of-incorrect-trials-count-and-share-flow-hand"] == "table"
    assert kinds["querylab-tool-calls-flow-hand"] == "table"
    assert kinds["querylab-errored-trials-flow-hand"] == "table"


@pytest.mark.slow
def test_empty_run_still_reports(tmp_path):
    root = str(tmp_path)
    storage.write_parquet(
        f"{root}/runs/empty/trials/trials.parquet", artifacts.TRIALS.empty_table(), artifacts.TRIALS
    )
    write_scores(root, "empty", [])
    tables, out = make_report(root, "empty")
    assert tables["counts"]["trials"] == 0 and tables["failed"] == []
    assert any("tool_calls.parquet" in n for n in tables["notes"])
    assert "0 trials" in Path(out["markdown"]).read_text()
    assert all(Path(u).read_bytes()[:4] == b"\x89PNG" for u in out["plots"].values())


def test_one_slug_rule_for_html_ids_and_prefect_keys():
    """Section anchors, table ids and Prefect artifact keys use one rule (issue 16): a table's
    artifact key carries its HTML id byte for byte."""
    from tasks.report.html import render_html, slug
    from tasks.report.html import Section as S, Table as T

    assert slug("Pass^k -- per query (k = 1, 3)") == "pass-k-per-query-k-1-3"
    assert slug("  --  ") == "section" and slug("--", "run") == "run"
    title = "Failure modes -- of incorrect trials (count & share)"
    page = render_html("t", "", [S(title, "", [T(title, pl.DataFrame({"a": [1]}))])])
    assert f'id="{slug(title)}"' in page
    assert slug(title) == "failure-modes-of-incorrect-trials-count-share"
