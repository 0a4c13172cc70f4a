"""The execute_python sandbox (tasks/sandbox/session.py) and the ToolBox around it: sessions and their
work directory, limits, a stripped environment, variables from earlier tool calls, large
outputs saved to files, detection and the refusal policy, the validator primitive.

The hostile payloads (answer-key walks, escapes, bombs) are in tests/test_sandbox_isolation.py.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

import pytest

from tasks.db.engines import open_databases
from tasks.core.llm import AgentConfigError
from tasks.sandbox.session import (
    REQUIRED_MECHANISMS,
    Isolation,
    Sandbox,
    SandboxError,
    SandboxUnavailable,
    run_validator,
)
from tasks.agents.tools import ToolBox, variable_name
from tests.helpers import register_model

pytestmark = pytest.mark.integration  # sandboxed execute_python processes


SECRETS = {
    "OPENAI_API_KEY": "sk-sandbox-SECRET-1",
    "QUERYLAB_OPENAI_API_KEY": "sk-sandbox-SECRET-2",
    "AWS_SECRET_ACCESS_KEY": "aws-sandbox-SECRET-3",
    "QUERYLAB_POSTGRES_URL": "postgresql://u:pw-SECRET-4@h/db",
}


#: Prints the PIDs a cell sees besides its own and the session's (PID 1): should be [].
OTHERS = ("import os\nprint(sorted(int(p) for p in os.listdir('/proc')\n"
          "             if p.isdigit() and int(p) not in (1, os.getpid())))")


@pytest.fixture(scope="module")
def sandbox():
    # started with the secrets in our environment, so the test proves they are stripped
    old = {k: os.environ.get(k) for k in SECRETS}
    os.environ.update(SECRETS)
    sb = Sandbox()
    try:
        sb.open_session().close()  # the zygote starts now, with the secrets still set
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    yield sb
    sb.close()


@pytest.fixture
def session(sandbox):
    with sandbox.open_session(disk_mb=64) as s:
        yield s


def test_this_machine_isolates_cells(sandbox):
    # the team machine provides every mechanism; a machine that does not is refused (below)
    iso = sandbox.isolation()
    assert iso.ok, iso.describe()
    assert set(REQUIRED_MECHANISMS) <= {k for k, v in iso.mechanisms.items() if v}
    assert sandbox.isolated and iso.describe()["missing"] == []


def test_infinite_loop_is_killed_at_the_timeout(session):
    t0 = time.monotonic()
    res = session.run("while True:\n    pass\n", timeout_s=1.0)
    took = time.monotonic() - t0
    assert res.timed_out and not res.ok and "timed out after 1 s" in res.error
    assert 0.9 <= took < 5
    # the session is still usable afterwards
    assert session.run("print('next')").stdout == "next\n"


def test_processes_started_by_a_cell_die_with_it(session):
    code = (
        "import subprocess, time\n"
        "p = subprocess.Popen(['sleep', '300'], start_new_session=True)\n"
        "print(p.pid, flush=True)\n"
        "time.sleep(30)\n"
    )
    res = session.run(code, timeout_s=1.0)
    assert res.timed_out and res.stdout.strip().isdigit()
    # the cell is PID 1 of its own PID namespace: nothing outlives it
    out = session.run(OTHERS)
    assert json.loads(out.stdout) == []


def test_memory_bomb_is_stopped(session):
    code = "blocks = []\nwhile True:\n    blocks.append(bytearray(64 * 1024 * 1024))\n"
    t0 = time.monotonic()
    res = session.run(code, memory_mb=512, timeout_s=30)
    assert not res.ok and "memory limit of 512 MiB" in res.error
    assert time.monotonic() - t0 < 10
    assert res.max_rss_kb < 600 * 1024


def test_cpu_limit(session):
    res = session.run("while True:\n    pass\n", cpu_s=1, timeout_s=30)
    assert not res.ok and not res.timed_out and "CPU limit of 1 s" in res.error


def test_environment_holds_no_secrets(session):
    code = (
        "import json, os\n"
        "seen = []\n"
        "for pid in os.listdir('/proc'):\n"
        "    try:\n"
        "        seen.append(open(f'/proc/{pid}/environ', 'rb').read().decode(errors='replace'))\n"
        "    except OSError:\n"
        "        pass\n"
        "print(json.dumps({'env': dict(os.environ), 'proc': seen}))\n"
    )
    res = session.run(code)
    assert res.ok, res.error
    env = json.loads(res.stdout)["env"]
    assert not [k for k in env if any(w in k for w in ("KEY", "SECRET", "TOKEN", "PASSWORD"))]
    assert not {"QUERYLAB_POSTGRES_URL", "QUERYLAB_MONGO_URI", "OPENAI_BASE_URL"} & set(env)
    assert env["HOME"] == "/home/sandbox" == env["PWD"] and env["TMPDIR"] == "/tmp"
    assert not any(v in res.stdout for v in SECRETS.values())


def test_network_is_cut(session):
    res = session.run("import socket\nsocket.create_connection(('127.0.0.1', 9), timeout=2)\n")
    assert not res.ok and "Network is unreachable" in res.error


def test_libraries_importable_and_errors_readable(session):
    res = session.run(
        "import pandas as pd, polars as pl, pyarrow as pa, numpy as np\n"
        "print(pd.DataFrame({'a': [1, 2]}).a.sum(), pl.DataFrame({'a': [1, 2, 3]}).height,"
        " pa.table({'a': [1]}).num_rows, int(np.arange(3).sum()))\n",
    )
    assert res.ok, res.error
    assert res.stdout.split() == ["3", "3", "1", "3"]
    res = session.run("x = 1\ny = x / 0\n", name="call_9")
    assert "ZeroDivisionError" in res.error and 'File "call_9.py", line 2' in res.error
    assert session.run("import sys; sys.exit(3)").error.startswith("python exited with code 3")
    assert session.run("exit(0)").ok


def test_work_directory_persists_and_files_go_through_the_session(session):
    session.put_file("data/in.json", b'{"a": 41}')
    res = session.run(
        "import json, os\n"
        "d = json.load(open('data/in.json'))\n"
        "open('out.txt', 'w').write(str(d['a'] + 1))\n"
        "os.makedirs('sub', exist_ok=True); open('/tmp/t', 'w').write('tmp')\n"
    )
    assert res.ok, res.error
    nxt = session.run("import os\nprint(open('out.txt').read(), open('/tmp/t').read(), "
                      "sorted(os.listdir('.')))")
    assert nxt.stdout.split()[:2] == ["42", "tmp"] and "'sub'" in nxt.stdout
    assert session.get_file("out.txt") == b"42"
    session.rename("out.txt", "moved/out.txt")
    assert session.get_file("moved/out.txt") == b"42"
    with pytest.raises(SandboxError, match="out.txt"):
        session.get_file("out.txt")
    for bad in ("../x", "/etc/passwd", "a/../../b", "", "a//b"):
        with pytest.raises(SandboxError, match="bad work-directory path"):
            session.put_file(bad, b"x")


def test_planted_symlinks_are_never_followed(session):
    # the cell controls its work directory: the harness's file operations must not follow it
    res = session.run("import os; os.symlink('/etc', 'vars'); os.symlink('/etc/passwd', 'pw')")
    assert res.ok, res.error
    with pytest.raises(SandboxError):
        session.put_file("vars/var_x.json", b"[]")
    with pytest.raises(SandboxError, match="not a regular file|Too many levels"):
        session.get_file("pw")
    session.put_file("pw", b"replaced")  # replaces the link, never writes through it
    assert session.get_file("pw") == b"replaced"


def test_sessions_are_concurrent_and_separate(sandbox):
    sessions = [sandbox.open_session(disk_mb=16) for _ in range(4)]
    out: dict[int, str] = {}

    def work(i, s):
        s.put_file("me.txt", str(i).encode())
        r = s.run("import os, time; time.sleep(0.5); print(open('me.txt').read(), "
                  "sorted(os.listdir('.')))")
        out[i] = r.stdout

    t0 = time.monotonic()
    threads = [threading.Thread(target=work, args=(i, s)) for i, s in enumerate(sessions)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    took = time.monotonic() - t0
    for s in sessions:
        s.close()
    assert {i: o.split()[0] for i, o in out.items()} == {i: str(i) for i in range(4)}
    assert all("['me.txt']" in o for o in out.values())  # nothing of another trial
    assert took < 1.9  # four 0.5 s cells ran in parallel
    with pytest.raises(SandboxError, match="closed"):
        sessions[0].run("print(1)")


def test_legacy_run_on_a_host_directory(sandbox, tmp_path):
    # tasks.datasets.dab_import's current call: a one-shot cell in a host directory
    (tmp_path / "in.txt").write_text("hello")
    res = sandbox.run("print(open('in.txt').read())", tmp_path, name="legacy")
    assert res.ok and res.stdout == "hello\n"
    assert (tmp_path / ".cells" / "legacy.out").read_text() == "hello\n"
    res = sandbox.run(OTHERS, tmp_path)
    assert json.loads(res.stdout) == []


# ---- detection and the refusal policy -------------------------------------------------------


def test_isolation_names_what_is_missing():
    iso = Isolation({m: True for m in REQUIRED_MECHANISMS} | {"cgroup_pids": False,
                                                              "filesystem_view": False},
                    {"filesystem_view": "mount: Operation not permitted"})
    assert not iso.ok and iso.missing == ["filesystem_view", "cgroup_pids"]
    msg = str(iso.error())
    assert "a private file-system view" in msg and "process-count limit" in msg
    assert "Operation not permitted" in msg and "\n" not in msg
    assert isinstance(iso.error(), SandboxUnavailable)


@pytest.fixture
def no_isolation(monkeypatch):
    iso = Isolation({m: m != "cgroup_memory" for m in REQUIRED_MECHANISMS})
    monkeypatch.setattr(Sandbox, "isolation", lambda self: iso)
    return iso


def test_llm_agents_refuse_without_isolation(no_isolation, monkeypatch, tmp_path):
    from tasks.trials.stage import check_agents, check_sandbox

    register_model("http://127.0.0.1:9/v1", tmp_path, monkeypatch.setenv, name="m",
                   prices="{input: 1, output: 1}", context_window=1000)
    with pytest.raises(AgentConfigError, match="missing a cgroup memory limit.*--unsafe-sandbox"):
        check_agents(["oracle", "openai:m"])
    assert check_sandbox(["oracle", "replay:x.json"]) is None  # they run their own code
    desc = check_agents(["openai:m"], options={"unsafe_sandbox": True})
    assert desc[0]["sandbox"]["unsafe_sandbox"] and desc[0]["sandbox"]["missing"] == [
        "cgroup_memory"]
    assert desc[0]["options"]["unsafe_sandbox"] is True


def test_a_plugin_kind_is_untrusted_its_cells_need_the_sealed_sandbox(no_isolation):
    """A kind from outside the repository is not the harness's own code: like a model, its
    ``execute_python`` cells run only sealed (before, only ``openai``/``local`` were refused)."""
    import tests.fakes.toy_agent  # noqa: F401 - registers agent kind "toy"
    from tasks.trials.stage import check_sandbox

    with pytest.raises(AgentConfigError, match="missing a cgroup memory limit.*--unsafe-sandbox"):
        check_sandbox(["oracle", "toy:x"])
    assert check_sandbox(["toy:x"], {"unsafe_sandbox": True})["unsafe_sandbox"] is True


def test_cli_run_refuses_in_one_line(no_isolation, capsys, monkeypatch):
    from querylab.cli import main

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-used")  # refused before any request

    assert main(["run", "--agent", "openai:gpt-4o-mini", "--dataset", "stocks"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "cgroup memory limit" in err and "--unsafe-sandbox" in err


def test_unsafe_cli_run_is_recorded_and_reported(no_isolation, prefect_harness, settings,
                                                 monkeypatch, tmp_path, capsys):
    from querylab.cli import main
    from tasks.core import storage
    from tests.fakes.openai_server import ScriptedOpenAIServer, tool_calls

    def responder(body, index):
        return tool_calls(("execute_python", {"code": "print('hi')"})) if not any(
            m["role"] == "tool" for m in body["messages"]) else tool_calls(
            ("return_answer", {"answer": "Facebook"}))

    with ScriptedOpenAIServer(responder) as srv:
        register_model(srv.base_url, tmp_path, monkeypatch.setenv, name="unsafe-m",
                       prices="{input: 1, output: 1}")
        status = main(["run", "--agent", "openai:unsafe-m", "--dataset", "stocks", "--trials", "1",
                       "--run-id", "unsafe-test", "--unsafe-sandbox"])
    out = capsys.readouterr().out
    assert status in (0, 1), out  # the scripted answers are wrong for most queries
    record = storage.read_json(storage.join(settings.artifacts, "runs", "unsafe-test", "run.json"))
    assert json.dumps(record).count('"unsafe_sandbox": true') >= 1
    agents = storage.read_json(storage.join(settings.artifacts, "runs", "unsafe-test", "trials",
                                            "agents.json"))
    assert agents[0]["sandbox"]["unsafe_sandbox"] and agents[0]["sandbox"]["missing"]
    report = next(line.split()[-1] for line in out.splitlines() if line.startswith("report:"))
    assert "UNSAFE SANDBOX" in Path(report).read_text()


def test_unsafe_run_is_in_the_report_notes(tmp_path):
    from tasks.core import storage
    from tasks.sandbox.session import sandbox_notes

    root = str(tmp_path)
    storage.write_json(storage.join(root, "runs", "r1", "trials", "agents.json"), [
        {"agent": "oracle", "kind": "oracle"},
        {"agent": "openai:m", "kind": "openai",
         "sandbox": {"unsafe_sandbox": True, "missing": ["cgroup_pids"]}},
    ])
    notes = sandbox_notes(root, "r1")
    assert len(notes) == 1 and "UNSAFE SANDBOX" in notes[0] and "cgroup_pids" in notes[0]
    assert sandbox_notes(root, "no-such-run") == []


def test_required_session_refuses_when_a_mechanism_is_missing(sandbox, monkeypatch):
    # a session that did not set up a required mechanism is closed, never used
    real = type(sandbox.open_session(disk_mb=16))
    monkeypatch.setattr(real, "isolated", property(lambda self: False))
    with pytest.raises(SandboxUnavailable):
        sandbox.open_session(require_isolation=True)


# ---- through the ToolBox ------------------------------------------------------------------


@pytest.fixture
def toolbox(stocks_manifest, settings, tmp_path, sandbox):
    dbs = open_databases(stocks_manifest, settings)
    box = ToolBox(dbs, tmp_path / "work", sandbox=sandbox, python_timeout_s=2,
                  max_content_chars=2000, require_isolation=True)
    yield box
    box.close()


def test_earlier_query_result_is_a_variable(toolbox):
    q = toolbox.call("query_db", {"db": "listings", "query": "SELECT listing FROM listings ORDER BY 1"},
                     "call_abc-1")
    assert q.success and json.loads(q.content)["variable"] == "var_call_abc_1"
    assert toolbox.session is None  # opened at the first cell, with the stored variables
    code = "import pandas as pd\nprint(len(var_call_abc_1), pd.DataFrame(var_call_abc_1).columns[0])"
    out = toolbox.call("execute_python", {"code": code}, "call_2")
    assert out.success, out.error
    assert toolbox.session.isolated
    assert json.loads(out.content)["stdout"].split() == [str(len(q.value)), "listing"]
    # the output of a cell and later query results are variables for the next one
    toolbox.call("query_db", {"db": "listings", "query": "SELECT 7 AS n"}, "call_q2")
    out = toolbox.call("execute_python", {"code": "print(var_call_2.split()[1], var_call_q2)"},
                       "call_3")
    assert json.loads(out.content)["stdout"] == "listing [{'n': 7}]\n"
    assert variable_name("functions.query_db:0") == "var_functions_query_db_0"
    assert json.loads(toolbox.session.get_file("vars/var_call_q2.json")) == [{"n": 7}]


def test_a_broken_variable_file_is_named_and_skipped(toolbox):
    """A cell that plants a non-JSON ``vars/var_x.json`` (QA12 minor 6) does not break later
    cells: the file is skipped with a warning naming it, the other variables still load."""
    toolbox.call("query_db", {"db": "listings", "query": "SELECT 7 AS n"}, "call_q")
    out = toolbox.call("execute_python",
                       {"code": "open('vars/var_bad.json', 'w').write('{not json')"}, "call_1")
    assert out.success, out.error
    out = toolbox.call("execute_python", {"code": "print(var_call_q)"}, "call_2")
    shown = json.loads(out.content)
    assert out.success and shown["stdout"] == "[{'n': 7}]\n"
    assert "vars/var_bad.json not loaded" in shown["stderr"]


def test_large_output_saved_with_a_preview(toolbox):
    out = toolbox.call("execute_python", {"code": "for i in range(50000): print(i)"}, "call_big")
    shown = json.loads(out.content)
    assert out.success and shown["truncated"] and shown["saved_to"] == "results/call_big.stdout.txt"
    assert len(out.content) <= 2000 and shown["stdout"].startswith("0\n1\n2\n")
    saved = toolbox.session.get_file(shown["saved_to"]).decode()
    assert saved.splitlines()[-1] == "49999"
    # the agent can read the saved file from a later cell
    nxt = toolbox.call("execute_python",
                       {"code": f"print(len(open('{shown['saved_to']}').read().split()))"}, "c2")
    assert json.loads(nxt.content)["stdout"] == "50000\n"


def test_sandbox_failures_are_tool_errors(toolbox):
    out = toolbox.call("execute_python", {"code": "while True: pass"}, "loop")
    assert not out.success and "timed out" in json.loads(out.content)["error"]
    out = toolbox.call("execute_python", {"code": 42}, "bad")
    assert not out.success and "code must be a string" in out.error
    long_id = "x" * 300  # a long call id names no file
    out = toolbox.call("execute_python", {"code": "print(1)"}, long_id)
    assert out.success and len(json.loads(out.content)["variable"]) <= 200
    toolbox.deadline = time.monotonic() - 1
    out = toolbox.call("execute_python", {"code": "print(1)"}, "late")
    assert not out.success and "wall time" in out.error


def test_closing_the_toolbox_ends_the_session(toolbox):
    assert toolbox.call("execute_python", {"code": "open('f', 'w').write('1')"}, "c1").success
    session = toolbox.session
    toolbox.close()
    assert not session.alive and toolbox.session is None
    # a new session starts empty: trials never share a work directory
    out = toolbox.call("execute_python", {"code": "import os; print(os.listdir('.'))"}, "c2")
    assert json.loads(out.content)["stdout"].strip() == "['vars']"


# ---- the validator primitive (DAB validate.py) ----------------------------------------------

REPO = Path(__file__).resolve().parents[1]
VALIDATE = f"""\
from pathlib import Path
import os

def validate(llm_output: str):
    truth = (Path(__file__).parent / "ground_truth.csv").read_text().strip()
    for p in ("{REPO}/tasks", "{REPO}/data", "{REPO}/README.md", "/etc/shadow", "HOSTDIR"):
        if os.path.exists(p):
            return False, "saw " + p
    return llm_output.strip() == truth, "expected " + truth
"""


def test_validator_sees_only_its_folder(tmp_path, sandbox):
    q = tmp_path / "query1"
    q.mkdir(mode=0o700)  # not readable by the sandbox uid: the primitive copies it
    (q / "validate.py").write_text(VALIDATE.replace("HOSTDIR", str(q)))
    (q / "ground_truth.csv").write_text("42\n")
    assert run_validator(q, "42", sandbox=sandbox, require_isolation=True) == (True, "expected 42")
    assert run_validator(q, "41", sandbox=sandbox) == (False, "expected 42")
    assert run_validator(q, None, sandbox=sandbox) == (False, "no answer")
    (q / "validate.py").write_text("def validate(a):\n    open('/task/x', 'w')\n")
    ok, why = run_validator(q, "42", sandbox=sandbox)
    assert not ok and "Read-only file system" in why
    (q / "validate.py").write_text("def validate(a):\n    while True: pass\n")
    t0 = time.monotonic()
    ok, why = run_validator(q, "42", timeout_s=1, sandbox=sandbox)
    assert not ok and "timed out" in why and time.monotonic() - t0 < 10


def test_validator_imports_given_libraries(tmp_path, sandbox):
    lib = tmp_path / "dab" / "common_scaffold" / "validate"
    lib.mkdir(parents=True)
    (lib.parent / "__init__.py").write_text("")
    (lib / "__init__.py").write_text("")
    (lib / "fuzzy.py").write_text("def same(a, b):\n    return a.lower() == b.lower()\n")
    q = tmp_path / "dab" / "query2"
    q.mkdir()
    (q / "validate.py").write_text(
        "from common_scaffold.validate.fuzzy import same\n"
        "def validate(a):\n    return same(a, 'Hopper'), 'fuzzy'\n")
    assert run_validator(q, "HOPPER", libraries=[lib.parent], sandbox=sandbox) == (True, "fuzzy")
    ok, why = run_validator(q, "HOPPER", sandbox=sandbox)  # without the library
    assert not ok and "No module named 'common_scaffold'" in why
    assert Path(q / "validate.py").exists()


# ---- failures of the sandbox's own processes ------------------------------------------------


def test_a_dead_zygote_is_restarted_and_running_sessions_go_on():
    import signal

    sb = Sandbox(spares=0)
    try:
        s1 = sb.open_session(disk_mb=16)
        s1.put_file("keep.txt", b"still here")
        os.kill(sb._proc.pid, signal.SIGKILL)
        sb._proc.wait(10)
        assert s1.run("print(open('keep.txt').read())").stdout == "still here\n"
        s2 = sb.open_session(disk_mb=16)  # a new zygote
        assert s2.run("print(2)").stdout == "2\n" and s2.isolated
        s1.close()
        s2.close()
    finally:
        sb.close()


def test_a_killed_session_is_an_error_and_the_toolbox_reopens(toolbox):
    import signal

    toolbox.call("query_db", {"db": "listings", "query": "SELECT 1 AS one"}, "q1")
    assert toolbox.call("execute_python", {"code": "print(var_q1)"}, "c1").success
    signal.pidfd_send_signal(toolbox.session._pidfd, signal.SIGKILL)
    out = toolbox.call("execute_python", {"code": "print(var_q1)"}, "c2")
    assert not out.success and "work directory is lost" in out.error
    # the next call gets a new session with the stored variables
    out = toolbox.call("execute_python", {"code": "print(var_q1, var_c1)"}, "c3")
    assert out.success and json.loads(out.content)["stdout"] == "[{'one': 1}] [{'one': 1}]\n\n"


def test_a_deep_work_tree_is_emptied_without_recursion(tmp_path):
    """A cell's 3,000-level directory tree (QA12 minor 2) is removed when its session is
    recycled: no RecursionError, never following a symlink out of the work directory."""
    from tasks.sandbox.zygote.files import _NOFOLLOW_DIR, _empty_dir

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("x")
    work = tmp_path / "work"
    work.mkdir()
    fd = os.open(work, _NOFOLLOW_DIR)
    try:
        cur = os.open(".", _NOFOLLOW_DIR, dir_fd=fd)
        for i in range(3000):  # deeper than any path the kernel resolves in one go
            os.mkdir("d", dir_fd=cur)
            with open(os.open("f", os.O_WRONLY | os.O_CREAT, dir_fd=cur), "w") as f:
                f.write(str(i))
            nxt = os.open("d", _NOFOLLOW_DIR, dir_fd=cur)
            os.close(cur)
            cur = nxt
        os.symlink(str(outside), "out", dir_fd=cur)
        os.close(cur)
        (work / ".wiped-1").write_text("a cell's file named like the wiper's")
        _empty_dir(fd)
        assert os.listdir(work) == []
        assert (outside / "keep.txt").read_text() == "x"
    finally:
        os.close(fd)


def test_the_probe_says_why_each_missing_cgroup_limit_is_missing(tmp_path):
    """M3: with the cgroup hierarchies read-only (a private mount namespace), `python -m
    tasks.sandbox.session` names each missing limit and why (its notes were empty)."""
    import shutil
    import subprocess

    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and unshare to make the cgroups read-only privately")
    script = tmp_path / "nocg.sh"
    script.write_text("for c in memory pids cpu cpuacct; do\n"
                      "  [ -d /sys/fs/cgroup/$c ] && mount -o remount,bind,ro /sys/fs/cgroup/$c\n"
                      "done\nexec \"$@\"\n")
    res = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", str(script),
                          sys.executable, "-m", "tasks.sandbox.session"],
                         capture_output=True, text=True, timeout=180,
                         cwd=Path(__file__).resolve().parents[1])
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout)
    if not out["missing"]:
        pytest.skip("this machine's cgroups could not be made read-only")
    assert not out["isolated"]
    for m in out["missing"]:
        assert m.startswith("cgroup_"), out
        assert "read-only" in out["notes"][m], out["notes"]
