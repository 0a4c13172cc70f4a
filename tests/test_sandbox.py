"""The execute_python sandbox (tasks/sandbox.py) and the ToolBox around it: limits, a stripped
environment, variables from earlier tool calls, large outputs saved to files."""

from __future__ import annotations

import json
import os
import time

import pytest

from tasks.engines import open_databases
from tasks.sandbox import Sandbox
from tasks.tools import ToolBox, variable_name

SECRETS = {
    "OPENAI_API_KEY": "sk-sandbox-SECRET-1",
    "QUERYLAB_OPENAI_API_KEY": "sk-sandbox-SECRET-2",
    "AWS_SECRET_ACCESS_KEY": "aws-sandbox-SECRET-3",
    "QUERYLAB_POSTGRES_URL": "postgresql://u:pw-SECRET-4@h/db",
}


@pytest.fixture(scope="module")
def sandbox():
    # started with the secrets in our environment, so the test proves they are stripped
    old = {k: os.environ.get(k) for k in SECRETS}
    os.environ.update(SECRETS)
    try:
        sb = Sandbox()  # its zygote starts at the first cell, with the secrets still set
        yield sb
    finally:
        sb.close()
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_infinite_loop_is_killed_at_the_timeout(sandbox, tmp_path):
    t0 = time.monotonic()
    res = sandbox.run("while True:\n    pass\n", tmp_path, timeout_s=1.0)
    took = time.monotonic() - t0
    assert res.timed_out and not res.ok and "timed out after 1 s" in res.error
    assert 0.9 <= took < 5
    # the sandbox is still usable afterwards
    assert sandbox.run("print('next')", tmp_path).stdout == "next\n"


def test_processes_started_by_a_cell_die_with_it(sandbox, tmp_path):
    code = (
        "import subprocess, time\n"
        "p = subprocess.Popen(['sleep', '300'], start_new_session=True)\n"
        "q = subprocess.Popen(['sleep', '300'])\n"
        "print(p.pid, q.pid, flush=True)\n"
        "time.sleep(30)\n"
    )
    res = sandbox.run(code, tmp_path, timeout_s=1.0)
    assert res.timed_out
    _, q_pid = map(int, (tmp_path / ".cells" / "cell.out").read_text().split())
    if sandbox.isolated:
        # in its own PID namespace nothing outlives a cell: the next one sees only the
        # sandbox's init (PID 1) and itself
        out = sandbox.run(
            "import os; print(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))",
            tmp_path,
        )
        pids = json.loads(out.stdout)
        assert len(pids) == 2 and pids[0] == 1
    else:  # without namespaces the cell's process group is killed
        time.sleep(0.2)
        assert not _alive(q_pid)


def test_memory_bomb_is_stopped(sandbox, tmp_path):
    code = "blocks = []\nwhile True:\n    blocks.append(bytearray(64 * 1024 * 1024))\n"
    t0 = time.monotonic()
    res = sandbox.run(code, tmp_path, memory_mb=512, timeout_s=30)
    assert not res.ok and "memory limit of 512 MiB" in res.error
    assert time.monotonic() - t0 < 10
    assert res.max_rss_kb < 600 * 1024


def test_cpu_limit(sandbox, tmp_path):
    res = sandbox.run("while True:\n    pass\n", tmp_path, cpu_s=1, timeout_s=30)
    assert not res.ok and not res.timed_out and "CPU limit of 1 s" in res.error


def test_environment_holds_no_secrets(sandbox, tmp_path):
    code = (
        "import json, os\n"
        "env = dict(os.environ)\n"
        "seen = []\n"
        "for pid in os.listdir('/proc'):\n"
        "    try:\n"
        "        seen.append(open(f'/proc/{pid}/environ', 'rb').read().decode(errors='replace'))\n"
        "    except OSError:\n"
        "        pass\n"
        "print(json.dumps({'env': env, 'proc': seen}))\n"
    )
    res = sandbox.run(code, tmp_path)
    assert res.ok, res.error
    env = json.loads(res.stdout)["env"]
    assert not [k for k in env if any(w in k for w in ("KEY", "SECRET", "TOKEN", "PASSWORD"))]
    assert not {"QUERYLAB_POSTGRES_URL", "QUERYLAB_MONGO_URI", "OPENAI_BASE_URL"} & set(env)
    assert env["HOME"] == str(tmp_path.resolve())
    if sandbox.isolated:  # and no other process's environment (querylab's) is readable
        assert not any(v in res.stdout for v in SECRETS.values())


def test_network_is_cut_when_isolated(sandbox, tmp_path):
    if not sandbox.isolated:
        pytest.skip("Linux user namespaces are not available here")
    res = sandbox.run(
        "import socket\nsocket.create_connection(('127.0.0.1', 9), timeout=2)\n", tmp_path
    )
    assert not res.ok and "Network is unreachable" in res.error


def test_libraries_importable_and_errors_readable(sandbox, tmp_path):
    res = sandbox.run(
        "import pandas as pd, polars as pl, pyarrow as pa\n"
        "print(pd.DataFrame({'a': [1, 2]}).a.sum(), pl.DataFrame({'a': [1, 2, 3]}).height,"
        " pa.table({'a': [1]}).num_rows)\n",
        tmp_path,
    )
    assert res.ok and res.stdout.split() == ["3", "3", "1"]
    res = sandbox.run("x = 1\ny = x / 0\n", tmp_path, name="call_9")
    assert "ZeroDivisionError" in res.error and 'File "call_9.py", line 2' in res.error
    assert sandbox.run("import sys; sys.exit(3)", tmp_path).error.startswith("python exited with code 3")


# ---- through the ToolBox ------------------------------------------------------------------


@pytest.fixture
def toolbox(stocks_manifest, settings, tmp_path, sandbox):
    dbs = open_databases(stocks_manifest, settings)
    return ToolBox(dbs, tmp_path / "work", sandbox=sandbox, python_timeout_s=2, max_content_chars=2000)


def test_earlier_query_result_is_a_variable(toolbox):
    q = toolbox.call("query_db", {"db": "listings", "query": "SELECT listing FROM listings ORDER BY 1"},
                     "call_abc-1")
    assert q.success and json.loads(q.content)["variable"] == "var_call_abc_1"
    code = "import pandas as pd\nprint(len(var_call_abc_1), pd.DataFrame(var_call_abc_1).columns[0])"
    out = toolbox.call("execute_python", {"code": code}, "call_2")
    assert out.success, out.error
    assert json.loads(out.content)["stdout"].split() == [str(len(q.value)), "listing"]
    # and the output of a cell is a variable for the next one
    out = toolbox.call("execute_python", {"code": "print(var_call_2.split()[1])"}, "call_3")
    assert json.loads(out.content)["stdout"] == "listing\n"
    assert variable_name("functions.query_db:0") == "var_functions_query_db_0"


def test_large_output_saved_with_a_preview(toolbox):
    out = toolbox.call("execute_python", {"code": "for i in range(50000): print(i)"}, "call_big")
    shown = json.loads(out.content)
    assert out.success and shown["truncated"] and shown["saved_to"] == "results/call_big.stdout.txt"
    assert len(out.content) <= 2000 and shown["stdout"].startswith("0\n1\n2\n")
    saved = toolbox.workdir / shown["saved_to"]
    assert saved.read_text().splitlines()[-1] == "49999"
    # the agent can read the saved file from a later cell
    nxt = toolbox.call("execute_python",
                       {"code": f"print(len(open('{shown['saved_to']}').read().split()))"}, "c2")
    assert json.loads(nxt.content)["stdout"] == "50000\n"


def test_sandbox_failures_are_tool_errors(toolbox):
    out = toolbox.call("execute_python", {"code": "while True: pass"}, "loop")
    assert not out.success and "timed out" in json.loads(out.content)["error"]
    out = toolbox.call("execute_python", {"code": 42}, "bad")
    assert not out.success and "code must be a string" in out.error
    toolbox.deadline = time.monotonic() - 1
    out = toolbox.call("execute_python", {"code": "print(1)"}, "late")
    assert not out.success and "wall time" in out.error
