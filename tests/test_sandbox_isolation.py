"""Hostile execute_python payloads (issue 12): each attack that got through before, as a real
payload in a real sandbox session, and again through the real ReAct loop over HTTP (the
scripted OpenAI-compatible server drives ``tasks.trials.stage.run_trial_batch``). Every payload is
bounded in time (cell timeouts of seconds) and count (pids limits).

The positive controls run the same search on the host, so a payload that finds nothing in
the sandbox is known to be a payload that works.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
import uuid
from pathlib import Path

import polars as pl
import pytest

from tasks.core import storage
from tasks.sandbox.session import Sandbox
from tasks.scoring.stage import score_frame
from tasks.trials.stage import batch_uri, run_trial_batch
from tests.fakes.openai_server import ScriptedOpenAIServer, tool_calls
from tests.helpers import register_model

pytestmark = pytest.mark.integration  # sandboxed processes (namespaces, cgroups)


REPO = Path(__file__).resolve().parents[1]

#: Walks / (not /proc) for querylab's answer key: manifests, scoring files, ground truth,
#: dataset specs (YAML naming ground truth), canonical Parquet; prints {"found": [...],
#: "ground_truth": <the first scoring / ground-truth file's text>}.
WALK = r"""
import json, os, time
found, truth, t0 = [], None, time.monotonic()
for root, dirs, files in os.walk("/", onerror=lambda e: None):
    if root == "/" and "proc" in dirs:
        dirs.remove("proc")
    if time.monotonic() - t0 > 40:
        break
    for f in files:
        p = os.path.join(root, f)
        hit = f in ("ground_truth.json", "scoring.json") or (
            "/canonical/" in p and f.endswith(".parquet"))
        if not hit and (f == "manifest.json" or f.endswith((".yaml", ".yml"))):
            try:  # querylab's manifests list queries; its specs hold ground-truth SQL
                head = open(p, "rb").read(1 << 20)
                hit = b"ground_truth" in head or (f == "manifest.json" and b'"queries"' in head)
            except OSError:
                pass
        if hit:
            found.append(p)
            if f in ("ground_truth.json", "scoring.json") and truth is None:
                try:
                    truth = open(p).read(4000)
                except OSError:
                    pass
print(json.dumps({"found": found, "ground_truth": truth}))
"""

#: uid, /etc/shadow, /root, umount2("/proc"), mount, unshare(CLONE_NEWUSER), /proc, caps.
ESCAPES = r"""
import ctypes, json, os
libc = ctypes.CDLL(None, use_errno=True)
out = {"uid": os.getuid(), "euid": os.geteuid(), "gid": os.getgid()}
def err(f):
    try:
        f()
        return "ok"
    except OSError as e:
        return e.errno
out["shadow"] = err(lambda: open("/etc/shadow").read())
out["root_home"] = sorted(os.listdir("/root")) if os.path.isdir("/root") else []
r = libc.umount2(b"/proc", 2); out["umount_proc"] = (r, ctypes.get_errno())
r = libc.mount(b"none", b"/tmp", b"tmpfs", 0, None); out["mount"] = (r, ctypes.get_errno())
r = libc.unshare(0x10000000); out["unshare_user"] = (r, ctypes.get_errno())
r = libc.unshare(0x00020000); out["unshare_mnt"] = (r, ctypes.get_errno())
out["pids"] = [p for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, os.getpid())]
st = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
out["caps"] = [st[k].strip() for k in ("CapPrm", "CapEff", "CapBnd")]
out["no_new_privs"] = st["NoNewPrivs"].strip()
out["env"] = sorted(os.environ)
print(json.dumps(out))
"""

#: Writes MARKER into every import directory, /, /usr, /etc, cwd, /tmp, /dev/shm.
PTH = r"""
import json, os, sys, site
marker = "MARKER"
res = {}
targets = [p for p in sys.path if p] + site.getsitepackages() + ["/", "/usr", "/etc",
           "/usr/local/lib", os.getcwd(), "/tmp", "/dev/shm"]
for d in targets:
    try:
        with open(os.path.join(d, marker + ".pth"), "w") as fh:
            fh.write("import os; os.system('id > /tmp/pwned')\n")
        res[d] = "written"
    except OSError as e:
        res[d] = e.errno
print(json.dumps(res))
"""

FORK_BOMB = r"""
import os, time
n = 0
t0 = time.monotonic()
while time.monotonic() - t0 < 5:
    try:
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
        n += 1
    except OSError as e:
        print("refused after", n, "forks:", e.strerror, flush=True)
        break
"""

MEMORY_3x200 = r"""
import subprocess, sys
code = ("b = bytearray(200 * 1024 * 1024)\nfor i in range(0, len(b), 4096): b[i] = 1\n"
        "import time; time.sleep(3)")
ps = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(3)]
print([p.wait() for p in ps])
"""

DAEMON_START = r"""
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        for i in range(600):
            with open("/home/sandbox/heartbeat", "a") as fh:
                fh.write(".")
            time.sleep(0.05)
        os._exit(0)
    os._exit(0)
time.sleep(0.3)
print("daemon started", os.path.getsize("/home/sandbox/heartbeat") > 0)
"""

DAEMON_CHECK = r"""
import json, os, time
a = os.path.getsize("/home/sandbox/heartbeat"); time.sleep(0.4)
b = os.path.getsize("/home/sandbox/heartbeat")
others = [p for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, os.getpid())]
print(json.dumps({"grew": b > a, "pids": others}))
"""

DISK_FILL = r"""
try:
    with open("big", "wb") as fh:
        for _ in range(64):
            fh.write(b"x" * (1024 * 1024))
    print("wrote 64 MiB")
except OSError as e:
    print("refused:", e.strerror)
"""


@pytest.fixture(scope="module")
def sandbox():
    sb = Sandbox()
    yield sb
    sb.close()


@pytest.fixture
def session(sandbox):
    with sandbox.open_session(disk_mb=16, require_isolation=True) as s:
        yield s


def _json(res) -> dict:
    assert res.ok, res.error
    return json.loads(res.stdout)


def test_walking_the_file_system_finds_no_answer_key(session, stocks_manifest, settings):
    # positive control: on the host the same payload finds the built dataset and the specs
    art = Path(settings.artifacts) / "datasets" / "stocks" / stocks_manifest["version"]
    assert (art / "manifest.json").is_file() and (art / "scoring.json").is_file()
    assert any(b"ground_truth" in p.read_bytes() for p in (REPO / "data").glob("*.yaml"))
    res = session.run(WALK, timeout_s=60, cpu_s=60)
    seen = _json(res)
    assert seen == {"found": [], "ground_truth": None}
    # nor is anything of the repository, QUERYLAB_HOME or the artifact root there
    probe = session.run(
        "import json, os\nprint(json.dumps({p: os.path.exists(p) for p in json.loads(%r)}))"
        % json.dumps([str(REPO / "tasks"), str(REPO / "data"), str(REPO / ".git"),
                      str(settings.home), str(settings.artifacts), "/dev/shm/querylab-0",
                      "/etc/shadow", "/root/.cache"]))
    assert not any(_json(probe).values()), probe.stdout


def test_querylab_packages_are_not_importable(session):
    res = session.run(
        "import importlib, json, os, sys\n"
        "out = {}\n"
        "for m in ('tasks', 'schemas', 'flows', 'querylab'):\n"
        "    try:\n"
        "        importlib.import_module(m); out[m] = 'imported'\n"
        "    except ImportError as e:\n"
        "        out[m] = type(e).__name__\n"
        "sp = [p for p in sys.path if p.endswith('site-packages')][0]\n"
        "ed = [f for f in os.listdir(sp) if 'querylab' in f]\n"
        "out['editable'] = {f: os.path.getsize(os.path.join(sp, f)) if os.path.isfile("
        "os.path.join(sp, f)) else os.listdir(os.path.join(sp, f)) for f in ed}\n"
        "print(json.dumps(out))\n")
    out = _json(res)
    assert {out[m] for m in ("tasks", "schemas", "flows", "querylab")} == {"ModuleNotFoundError"}
    # the editable install's .pth, finder and dist-info are masked (empty)
    assert out["editable"] and all(v in (0, []) for v in out["editable"].values()), out


def test_a_file_written_by_a_cell_never_appears_outside_its_work_directory(session):
    marker = f"ql-marker-{uuid.uuid4().hex[:8]}"
    res = _json(session.run(PTH.replace("MARKER", marker)))
    written = sorted(d for d, r in res.items() if r == "written")
    assert written and set(written) <= {"/home/sandbox", "/tmp", "/dev/shm"}, res
    site = next(p for p in sys.path if p.endswith("site-packages"))
    for d in (site, "/", "/usr/local/lib", "/tmp", "/dev/shm", str(REPO), os.getcwd(),
              str(Path.home())):
        assert not (Path(d) / f"{marker}.pth").exists(), d
    assert not Path("/tmp/pwned").exists() or Path("/tmp/pwned").stat().st_mtime < time.time() - 60


def test_cells_are_unprivileged_and_cannot_remount(session):
    out = _json(session.run(ESCAPES))
    assert out["uid"] != 0 and out["euid"] != 0 and out["gid"] != 0
    assert out["shadow"] == 2  # not there at all (ENOENT)
    # /root holds at most the directories leading to the interpreter (pyenv lives there)
    assert set(out["root_home"]) <= set(Path(sys.base_prefix).parts), out["root_home"]
    assert out["umount_proc"][0] == -1 and out["umount_proc"][1] == 1  # EPERM
    assert out["mount"][0] == -1 and out["unshare_user"][0] == -1 and out["unshare_mnt"][0] == -1
    assert out["pids"] == []  # only itself and the sandbox's runner (PID 1)
    assert set(out["caps"]) == {"0000000000000000"} and out["no_new_privs"] == "1"


def test_fork_bomb_is_bounded_by_the_process_limit(session):
    t0 = time.monotonic()
    res = session.run(FORK_BOMB, max_procs=32, timeout_s=20)
    assert res.ok, res.error
    n = int(res.stdout.split("after")[1].split()[0])
    assert n < 32 and "Resource temporarily unavailable" in res.stdout
    assert time.monotonic() - t0 < 15
    after = session.run("import os\nprint([p for p in os.listdir('/proc')\n"
                        "       if p.isdigit() and int(p) not in (1, os.getpid())])")
    assert after.stdout == "[]\n"


def test_three_children_of_200_mib_do_not_fit_in_256_mib(session):
    res = session.run(MEMORY_3x200, memory_mb=256, timeout_s=30)
    assert res.ok, res.error
    codes = json.loads(res.stdout)
    assert sum(c == 0 for c in codes) <= 1 and -9 in codes  # the tree, not each process
    assert res.oom_killed and res.max_rss_kb <= 260 * 1024


def test_a_daemon_started_in_one_cell_is_gone_in_the_next(session):
    res = session.run(DAEMON_START, timeout_s=10)
    assert res.ok and "daemon started True" in res.stdout, (res.error, res.stdout)
    out = _json(session.run(DAEMON_CHECK))
    assert out == {"grew": False, "pids": []}


def test_writing_past_the_work_directory_cap_fails(session):
    res = session.run(DISK_FILL, timeout_s=20)
    assert res.ok and "refused: No space left on device" in res.stdout, res.stdout
    # the next cell still runs and reports, and can free the space
    res = session.run("import os; print(os.path.getsize('big') < 17 * 2**20); os.remove('big')")
    assert res.ok and res.stdout == "True\n"
    res = session.run(DISK_FILL.replace("64", "8"))
    assert res.stdout == "wrote 8 MiB\n"


def test_no_network_not_even_to_the_hosts_loopback(session):
    srv = socket.create_server(("127.0.0.1", 0))
    uds = socket.socket(socket.AF_UNIX)
    name = f"\0querylab-test-{uuid.uuid4().hex[:8]}"
    uds.bind(name)
    uds.listen()
    try:
        port = srv.getsockname()[1]
        res = session.run(
            "import json, socket\nout = {}\n"
            f"try:\n    socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
            "    out['tcp'] = 'connected'\n"
            "except OSError as e:\n    out['tcp'] = e.strerror\n"
            "s = socket.socket(socket.AF_UNIX)\n"
            f"try:\n    s.connect({name!r}); out['unix'] = 'connected'\n"
            "except OSError as e:\n    out['unix'] = e.strerror\n"
            "print(json.dumps(out))\n", timeout_s=10)
    finally:
        srv.close()
        uds.close()
    out = _json(res)
    assert out["tcp"] == "Network is unreachable" and out["unix"] == "Connection refused"


def test_a_recycled_session_keeps_nothing_of_the_previous_trial():
    leave = (
        "import ctypes, os, subprocess\n"
        "open('secret.txt', 'w').write('trial A'); open('/tmp/t', 'w').write('A')\n"
        "open('/dev/shm/s', 'w').write('A')\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "print(libc.shmget(0x51AB, 4096, 0o1666))\n"  # IPC_CREAT | 0666: a SysV segment
        "subprocess.Popen(['sleep', '600'], start_new_session=True)\n"
        "os.setxattr('.', 'user.secret', b'A'); os.chmod('.', 0o755)\n"
        "os.utime('.', (424242, 424242))\n"  # metadata of the work directory itself
    )
    sb = Sandbox(spares=2)
    a = sb.open_session(disk_mb=16)
    # what a fresh session's /tmp holds (the view's links when the venv lives under /tmp)
    fresh_tmp = _json(a.run("import json, os\nprint(json.dumps(sorted(os.listdir('/tmp'))))"))
    res = a.run(leave)
    assert res.ok and int(res.stdout) >= 0, (res.error, res.stdout)
    # positive control: the segment outlives its cell within the trial
    assert int(a.run("import ctypes\nprint(ctypes.CDLL(None).shmget(0x51AB, 0, 0))").stdout) >= 0
    pid = a.pid
    t0 = time.monotonic()
    while sb._refilling and time.monotonic() - t0 < 30:  # the spare prepared meanwhile
        time.sleep(0.05)
    a.close()  # back to the pool, recycled, and the next to be handed out
    b = sb.open_session(disk_mb=16)
    try:
        assert b.pid == pid  # the same session process, handed to the next trial
        out = _json(b.run(
            "import ctypes, json, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "print(json.dumps({'home': os.listdir('.'), 'tmp': sorted(os.listdir('/tmp')),"
            " 'shm': os.listdir('/dev/shm'), 'sysv': libc.shmget(0x51AB, 0, 0),"
            " 'xattr': os.listxattr('.'), 'mode': oct(os.stat('.').st_mode & 0o777),"
            " 'mtime': os.stat('.').st_mtime,"
            " 'others': [p for p in os.listdir('/proc') if p.isdigit() and int(p) not in"
            " (1, os.getpid())]}))"))
    finally:
        b.close()
        sb.close()
    assert "t" not in fresh_tmp
    assert out == {"home": [], "tmp": fresh_tmp, "shm": [], "sysv": -1, "others": [], "xattr": [],
                   "mode": "0o700", "mtime": 0.0}
    with pytest.raises(Exception, match="closed"):
        a.run("print(1)")  # the old handle is dead for good


def test_reserve_fills_a_bounded_pool_handed_over_to_concurrent_trials(monkeypatch):
    import tasks.sandbox.pool

    monkeypatch.setattr(tasks.sandbox.pool, "MAX_SPARES", 5)  # where Sandbox.reserve reads it
    sb = Sandbox(spares=0)
    try:
        sb.reserve(4, disk_mb=16)
        sb.reserve(3, disk_mb=16)  # a second batch of the stage: the pool is the larger ask
        t0 = time.monotonic()
        while len(sb._spares.get(16, [])) < 4 and time.monotonic() - t0 < 60:
            time.sleep(0.05)
        ready = {s.pid for s in sb._spares[16]}
        assert len(ready) == 4 and sb.spares == 4
        sessions = [sb.open_session(disk_mb=16) for _ in range(4)]
        # every trial got a session set up ahead (no fork on its path), each sealed and apart
        assert {s.pid for s in sessions} == ready
        outs = [s.run(f"import os; open('me', 'w').write('{i}'); print(os.listdir('.'))")
                for i, s in enumerate(sessions)]
        assert [o.stdout.strip() for o in outs] == ["['me']"] * 4, [o.error for o in outs]
        for s in sessions:
            s.close()
        t0 = time.monotonic()
        while len(sb._spares.get(16, [])) < 4 and time.monotonic() - t0 < 60:
            time.sleep(0.05)
        assert len(sb._spares[16]) == 4  # closed sessions came back recycled, not more
        sb.reserve(500, disk_mb=16)  # bounded: never more than MAX_SPARES
        assert sb.spares == 5
        t0 = time.monotonic()
        while len(sb._spares.get(16, [])) < 5 and time.monotonic() - t0 < 60:
            time.sleep(0.05)
        time.sleep(0.3)
        assert len(sb._spares[16]) == 5
    finally:
        sb.close()
    assert not sb._spares


# ---- the same attacks through the real ReAct loop over HTTP ---------------------------------


@pytest.fixture
def hostile_model(tmp_path, monkeypatch):
    def make(srv) -> str:
        return register_model(srv.base_url, tmp_path, monkeypatch.setenv, name="hostile",
                              key_env="QL_HOSTILE_KEY", key="sk-hostile-SECRET-key",
                              prices="{input: 1, output: 1}", context_window=1_000_000)

    return make


def test_hostile_agent_through_the_react_loop(tmp_path, stocks_manifest, settings,
                                              hostile_model):
    cells = [WALK, ESCAPES, PTH.replace("MARKER", "react-marker"), FORK_BOMB, MEMORY_3x200,
             DAEMON_START, DAEMON_CHECK, DISK_FILL]

    def responder(body, index):
        outputs = [json.loads(m["content"]) for m in body["messages"] if m["role"] == "tool"]
        if len(outputs) < len(cells):
            return tool_calls(("execute_python", {"code": cells[len(outputs)]}))
        found = json.loads(outputs[0].get("stdout") or "{}")
        # the only strategy of this agent: return whatever answer key it found
        return tool_calls(("return_answer", {"answer": found.get("ground_truth") or "nothing"}))

    uri = storage.join(settings.artifacts, "datasets", "stocks", stocks_manifest["version"],
                       "manifest.json")
    with ScriptedOpenAIServer(responder) as srv:
        agent = hostile_model(srv)
        batch = {"key": "hostile", "agent": agent, "manifest_uri": uri,
                 "items": [["nasdaq_top_volume_2012", 0]],
                 "options": {"python_memory_mb": 256, "python_max_procs": 32,
                             "python_disk_mb": 16, "python_timeout_s": 60}}
        root = str(tmp_path / "artifacts")
        t0 = time.monotonic()
        run_trial_batch.fn("r", root, batch)
        assert time.monotonic() - t0 < 150
        last = srv.requests[-1]
    trials = score_frame(pl.read_parquet(batch_uri(root, "r", "hostile", "trials")), [uri])
    assert trials["terminate_reason"].to_list() == ["return_answer"]
    assert trials["answer"].to_list() == ["nothing"] and not trials["is_correct"][0]
    out = [json.loads(m["content"]) for m in last["messages"] if m["role"] == "tool"]
    assert len(out) == len(cells)
    assert json.loads(out[0]["stdout"]) == {"found": [], "ground_truth": None}
    esc = json.loads(out[1]["stdout"])
    assert esc["uid"] != 0 and esc["shadow"] == 2 and esc["umount_proc"][0] == -1
    assert esc["pids"] == [] and not [k for k in esc["env"] if "KEY" in k or "SECRET" in k]
    pth = json.loads(out[2]["stdout"])
    assert {d for d, r in pth.items() if r == "written"} <= {"/home/sandbox", "/tmp", "/dev/shm"}
    assert "refused after" in out[3]["stdout"]
    assert sum(c == 0 for c in json.loads(out[4]["stdout"])) <= 1
    assert "daemon started True" in out[5]["stdout"]
    assert json.loads(out[6]["stdout"]) == {"grew": False, "pids": []}
    assert "refused: No space left on device" in out[7]["stdout"]
    assert "the work directory holds at most 16 MiB" in out[7]["variable_not_saved"]
    assert "sk-hostile-SECRET-key" not in json.dumps(out)


# ---- the unprivileged path: querylab not running as root ------------------------------------

#: Runs the zygote as the calling (non-root) user with the system interpreter, opens a session
#: and runs ESCAPES in it; prints the session's mechanisms and the cell's findings as JSON.
UNPRIVILEGED_CLIENT = r"""
import json, os, socket, subprocess, sys, time
here = sys.argv[1]
sys.path.insert(0, here)
import sandbox_zygote as z
view = {"ro": [["/usr", "/usr"]], "files": {}, "hide": [], "dev": ["null", "urandom"],
        "symlinks": [[p, os.readlink(p)] for p in ("/bin", "/lib", "/lib64", "/sbin")
                     if os.path.islink(p)], "visible": ["/usr"]}
os.makedirs(here + "/root", exist_ok=True)
a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
cfg = {"control_fd": b.fileno(), "preload": [], "uid": 61000, "gid": 61000, "userns": True,
       "home": "/home/sandbox", "staging": here + "/root", "view": view, "cgroups": None}
p = subprocess.Popen([sys.executable, "-I", "-c", open(here + "/sandbox_zygote.py").read(),
                      json.dumps(cfg)], pass_fds=(b.fileno(),), env={"PATH": "/usr/bin:/bin"})
b.close()
a.settimeout(30)
hello = json.loads(a.recv(65536))
c1, c2 = socket.socketpair()
socket.send_fds(a, [json.dumps({"op": "open", "spec": {"sid": 1, "disk_mb": 16}}).encode()],
                [c2.fileno()])
c2.close()
socket.recv_fds(a, 65536, 2)
session, _ = z.recv_msg(c1, time.monotonic() + 30)
z.send_msg(c1, {"op": "run", "name": "c", "timeout_s": 10, "memory_bytes": 1 << 30,
                "cpu_s": 10, "max_file_bytes": 1 << 24, "max_procs": 32,
                "max_output_chars": 100000}, sys.stdin.read().encode())
run, out = z.recv_msg(c1, time.monotonic() + 30)
a.close()
p.wait(10)
print(json.dumps({"uid": os.getuid(), "hello": hello, "session": session, "run": run,
                  "cell": json.loads(out or b"null")}))
"""


@pytest.fixture
def unprivileged_dir():
    import shutil
    import tempfile

    if os.geteuid() != 0 or not shutil.which("setpriv") or not Path("/usr/bin/python3").exists():
        pytest.skip("needs root (to become an unprivileged user), setpriv and /usr/bin/python3")
    here = Path(tempfile.mkdtemp(prefix="querylab-unpriv-"))  # not under root's 0700 tmp
    from tasks.sandbox.zygote import source

    # the one program the launcher passes to python -I -c, as a file the client imports too
    (here / "sandbox_zygote.py").write_text(source())
    (here / "client.py").write_text(UNPRIVILEGED_CLIENT)
    for p in (here, *here.iterdir()):
        os.chown(p, 1000, 1000)
    yield here
    shutil.rmtree(here, ignore_errors=True)


def test_unprivileged_user_gets_the_sealed_view_and_no_cgroups(unprivileged_dir):
    import subprocess

    here = unprivileged_dir
    res = subprocess.run(
        ["setpriv", "--reuid=1000", "--regid=1000", "--clear-groups", "/usr/bin/python3",
         str(here / "client.py"), str(here)],
        input=ESCAPES, capture_output=True, text=True, timeout=90, cwd=here,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout)
    assert out["uid"] == 1000 and out["hello"]["userns"]
    mech = out["session"]["mechanisms"]
    # everything but the cgroups (not delegated to this user): LLM agents would be refused
    assert {k for k, v in mech.items() if not v} == {"cgroup_memory", "cgroup_pids", "cgroup_cpu"}
    cell = out["cell"]
    assert out["run"]["exit_code"] == 0 and cell["shadow"] == 2 and cell["pids"] == []
    assert cell["umount_proc"][0] == -1 and cell["unshare_user"][0] == -1
    assert set(cell["caps"]) == {"0000000000000000"} and cell["no_new_privs"] == "1"


#: Run by the interpreter of a venv seen at another path (argv[1]: the protected paths to
#: probe): one sealed cell imports the venv's libraries, also ones no zygote preloads.
_VENV_CLIENT = r"""
import json, sys
from tasks.sandbox.session import Sandbox
CELL = '''
import importlib, json, os, sys
out = {}
for m in ("polars", "duckdb", "pandas.io.formats.style", "numpy.random", "pyarrow.csv", "tasks"):
    try:
        importlib.import_module(m)
        out[m] = "ok"
    except BaseException as exc:
        out[m] = repr(exc)
venv = sys.prefix
out["prefix"] = venv
out["venv_entries"] = sorted(os.listdir(venv)) if os.path.isdir(venv) else None
out["parent_entries"] = sorted(os.listdir(os.path.dirname(venv)))
out["protected"] = {p: os.path.exists(p) for p in json.loads(%r)}
print(json.dumps(out))
''' % sys.argv[1]
sb = Sandbox(spares=0)
try:
    with sb.open_session(disk_mb=16, require_isolation=True) as s:
        r = s.run(CELL, timeout_s=90, cpu_s=90)
        print(json.dumps({"ok": r.ok, "stdout": r.stdout, "error": r.error, "prefix": sys.prefix}))
finally:
    sb.close()
"""


def _venv_elsewhere(kind: str, tmp_path: Path) -> tuple[list[str], str]:
    """(command prefix, logical venv path) for the repo's venv seen under /tmp through a
    symlink, under /tmp as its real path (a bind mount in a private mount namespace), or
    through a symlink outside /tmp."""
    import shutil
    import tempfile

    real = REPO / ".venv"
    if kind == "tmp-symlink":
        clone = tmp_path / "clone"
        clone.mkdir()
        (clone / ".venv").symlink_to(real)
        return [], str(clone / ".venv")
    if kind == "tmp-real":
        if os.geteuid() != 0 or not shutil.which("unshare"):
            pytest.skip("needs root and unshare for a private bind mount")
        venv = tmp_path / "clone" / ".venv"
        venv.mkdir(parents=True)
        return ["unshare", "-m", "--propagation", "private", "sh", "-c",
                f'mount --bind "{real}" "{venv}" && exec "$0" "$@"'], str(venv)
    base = Path(tempfile.mkdtemp(prefix="ql-venvlink-", dir="/var/tmp"))
    (base / ".venv").symlink_to(real)
    return [], str(base / ".venv")


@pytest.mark.parametrize("kind", ["tmp-symlink", "tmp-real", "symlink"])
def test_cells_import_the_venvs_libraries_wherever_the_venv_lives(kind, tmp_path, settings):
    """H1: a venv under /tmp (hidden by the trial's own /tmp before) or reached through a
    symlink (its import paths were dropped) still gives cells polars, duckdb and lazily
    loaded pandas parts, and nothing else of the host."""
    import subprocess

    prefix, venv = _venv_elsewhere(kind, tmp_path)
    client = tmp_path / "client.py"
    client.write_text(_VENV_CLIENT)
    protected = [str(REPO / "tasks"), str(REPO / "data"), str(settings.home),
                 str(settings.artifacts), str(tmp_path / "client.py")]
    try:
        res = subprocess.run([*prefix, f"{venv}/bin/python", str(client), json.dumps(protected)],
                             capture_output=True, text=True, timeout=240, cwd=tmp_path)
    finally:
        if kind == "symlink":
            import shutil
            shutil.rmtree(Path(venv).parent, ignore_errors=True)
    assert res.returncode == 0, res.stderr[-3000:]
    outer = json.loads(res.stdout.strip().splitlines()[-1])
    assert outer["prefix"] == venv  # the interpreter really ran from the path under test
    assert outer["ok"], outer["error"]
    cell = json.loads(outer["stdout"])
    for m in ("polars", "duckdb", "pandas.io.formats.style", "numpy.random", "pyarrow.csv"):
        assert cell[m] == "ok", (m, cell)
    assert cell["tasks"].startswith("ModuleNotFoundError"), cell
    assert not any(cell["protected"].values()), cell["protected"]
    # the venv's directory shows only what the view binds, its parent only the venv
    assert set(cell["venv_entries"]) <= {"lib", "lib64", "bin", "pyvenv.cfg"}, cell
    assert cell["parent_entries"] == [".venv"], cell
