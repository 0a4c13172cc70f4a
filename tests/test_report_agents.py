"""The report's Agents section (M2) and the marks of unsafe / interrupted runs in `querylab
runs` / `status` (M4, M1): from a run's agents.json, stage records and lease."""

from __future__ import annotations

import json
import socket

import pytest

from querylab.cmd_ops import cmd_runs, cmd_status
from tasks.core import runs
from tasks.core import storage
from tasks.report.agents import agent_rows, agents_section

LOCAL = {
    "agent": "local:smollm2-135m", "kind": "local", "model_id": "smollm2-135m",
    "base_url": "http://127.0.0.1:41235/v1", "tool_protocol": "json_schema",
    "tool_protocol_configured": "auto",
    "local": {"weights": "/x/SmolLM2-135M-Instruct.Q4_1.gguf", "threads": 1, "parallel": 1,
              "n_ctx": 8192, "load_s": 2.6},
    "sampling": {"temperature": 0},
    "options": {"max_iterations": 4, "max_wall_time_s": 300.0, "max_retries": 5},
    "model_defaults": {"max_iterations": 4, "max_wall_time_s": 300},
    "sandbox": {"isolated": False, "missing": ["cgroup_memory", "cgroup_pids"],
                "unsafe_sandbox": True},
}
REMOTE = {"agent": "openai:gpt-4o-mini", "kind": "openai", "model_id": "gpt-4o-mini",
          "base_url": "https://api.openai.com/v1", "tool_protocol": "native",
          "tool_protocol_configured": "native", "sampling": {}, "options": {},
          "sandbox": {"isolated": True, "missing": [], "unsafe_sandbox": False}}


def _write_run(root: str, run_id: str, agents: list[dict]) -> None:
    runs.record_benchmark(root, run_id, {"datasets": ["stocks"],
                                         "agents": [a["agent"] for a in agents]})
    storage.write_json(storage.join(root, "runs", run_id, "trials", "agents.json"), agents)


def test_agents_section_describes_each_agent(tmp_path):
    root = str(tmp_path)
    _write_run(root, "r1", [LOCAL, REMOTE, {"agent": "oracle", "kind": "oracle"}])
    sec = agents_section(root, "r1")
    assert sec.title == "Agents" and [t.title for t in sec.blocks] == [
        "Agent `local:smollm2-135m`", "Agent `openai:gpt-4o-mini`", "Agent `oracle`"]
    local = dict(agent_rows(LOCAL))
    assert local["endpoint host"] == "127.0.0.1 (served by querylab)"
    assert local["tool protocol"] == "json_schema (chosen by the auto probe)"
    assert local["weights"].endswith(".gguf") and "1 thread(s)" in local["server"]
    # only what differs from querylab's defaults (max_retries 5 is the default)
    assert local["options unlike the defaults"].startswith("max_iterations 4, max_wall_time_s 300")
    assert "max_retries" not in local["options unlike the defaults"]
    assert local["execute_python sandbox"].startswith("UNSAFE") and \
        "only resource limits were missing" in local["execute_python sandbox"]
    remote = dict(agent_rows(REMOTE))
    assert remote["endpoint host"] == "api.openai.com" and remote["tool protocol"] == "native"
    assert remote["execute_python sandbox"].startswith("sealed")
    assert agents_section(root, "nope") is None


def test_runs_and_status_mark_unsafe_and_interrupted_runs(tmp_path, capsys):
    root = str(tmp_path)
    _write_run(root, "r2", [LOCAL])
    storage.write_json(runs.stage_uri(root, "r2", "trials"), {
        "run_id": "r2", "stage": "trials", "status": "running", "attempt": 1,
        "started_at": "2026-12-01T18:51:01Z"})
    # its holder was SIGKILLed: a lease naming a process that does not exist
    storage.write_json(runs.lease_uri(root, "r2"), {
        "host": socket.gethostname(), "pid": 2 ** 22 + 7, "since": "2026-12-01T18:51:01Z"})
    (listed,) = runs.list_runs(root)
    assert listed["status"] == "interrupted"
    assert listed["unsafe_sandbox"] == {"local:smollm2-135m": ["cgroup_memory", "cgroup_pids"]}

    class Args:
        artifacts = root
        json = False
        run_id = "r2"

    assert cmd_runs(Args()) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("r2"))
    assert "interrupted UNSAFE-SANDBOX" in line
    assert cmd_status(Args()) == 0
    out = capsys.readouterr().out
    assert "sandbox: UNSAFE: local:smollm2-135m ran with --unsafe-sandbox; only resource " \
        "limits were missing" in out
    assert any(ln.startswith("trials") and "interrupted" in ln for ln in out.splitlines())


@pytest.mark.parametrize("missing, says, not_says", [
    (["cgroup_memory", "cgroup_pids", "cgroup_cpu"], "only resource limits were missing",
     "may have reached"),
    (["filesystem_view", "cgroup_memory"], "may have reached the answer key", "only resource"),
])
def test_unsafe_note_says_what_was_missing(tmp_path, missing, says, not_says):
    from tasks.sandbox.session import sandbox_notes

    root = str(tmp_path)
    _write_run(root, "r3", [{**LOCAL, "sandbox": {**LOCAL["sandbox"], "missing": missing}}])
    (note,) = sandbox_notes(root, "r3")
    assert note.startswith("UNSAFE SANDBOX: `local:smollm2-135m`") and says in note
    assert not_says not in note
    assert json.dumps(note)  # one line of text
