"""Shared set-up of the benchmarks that drive agent trials through the scripted OpenAI server.

Used by ``bench/harness_overhead.py``, ``bench/latency_bound.py`` and ``bench/trial_memory.py``:

- :func:`bench_env` points every querylab / Prefect directory at a fresh temporary directory;
- :func:`build_stocks` builds and loads the ``stocks`` dataset there;
- :func:`start_server` starts the scripted OpenAI-compatible server
  (``tests/fakes/openai_server.py``) in its own process, answering every model call after
  ``latency`` seconds (HTTP/1.1, connections kept alive as the OpenAI API keeps them) with the
  fixed 5-step trajectory ``list_db``, ``query_db`` on SQLite,
  ``query_db`` on DuckDB, ``execute_python`` over both results (in the sealed sandbox),
  ``return_answer``; :func:`stop_server` stops it and returns the most chat-completion requests
  it answered at once;
- :func:`write_models` writes a models table naming that server ``bench``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SERVER = r"""
import sys
from tests.fakes.openai_server import ScriptedOpenAIServer, delay, tool_calls

LATENCY = float(sys.argv[1])

def ids(body):
    return [tc["id"] for m in body["messages"] if m["role"] == "assistant"
            for tc in m.get("tool_calls") or []]

def responder(body, index):
    done = ids(body)
    n = len(done)
    if n == 0:
        step = tool_calls(("list_db", {}))
    elif n == 1:
        step = tool_calls(("query_db", {"db": "listings", "query":
            "SELECT listing, company FROM listings WHERE listing LIKE 'NASDAQ:%'"}))
    elif n == 2:
        step = tool_calls(("query_db", {"db": "market", "query":
            "SELECT avg(volume) AS v FROM fb WHERE year(date) = 2012"}))
    elif n == 3:
        a, b = ("var_" + done[1], "var_" + done[2])
        step = tool_calls(("execute_python", {"code": f"print(len({a}), {b}[0]['v'] > 0)"}))
    else:
        step = tool_calls(("return_answer", {"answer": "Facebook"}),
                          usage={"prompt_tokens": 900, "completion_tokens": 20,
                                 "cached_tokens": 512})
    return delay(LATENCY, step) if LATENCY > 0 else step

srv = ScriptedOpenAIServer(responder, keep_alive=True).start()
print(srv.base_url, flush=True)
sys.stdin.read()
print(srv.max_in_flight, flush=True)
srv.stop()
"""


def bench_env(prefix: str) -> Path:
    """A fresh temporary directory (returned) holding ``QUERYLAB_HOME``,
    ``QUERYLAB_ARTIFACTS``, ``QUERYLAB_WORK_DIR`` and ``PREFECT_HOME``, all set in
    ``os.environ``; quiet Prefect logging, no telemetry, the thread-pool task runner."""
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    os.environ.update(
        {
            "QUERYLAB_HOME": str(tmp / "home"),
            "QUERYLAB_ARTIFACTS": str(tmp / "artifacts"),
            "QUERYLAB_WORK_DIR": str(tmp / "work"),
            "PREFECT_HOME": str(tmp / "prefect"),
            "DO_NOT_TRACK": "1",
            "PREFECT_LOGGING_LEVEL": "WARNING",
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        }
    )
    os.environ.pop("QUERYLAB_TASK_RUNNER", None)
    return tmp


def build_stocks(settings) -> tuple[str, dict]:
    """Build the ``stocks`` dataset under ``settings.artifacts`` and load its databases;
    returns (manifest URI, manifest)."""
    from tasks.core import storage
    from tasks.datasets.build import build_dataset_artifacts
    from tasks.db.engines import ensure_loaded
    from tasks.datasets.spec import spec_path

    uri = build_dataset_artifacts.fn(str(spec_path("stocks")), settings.artifacts)
    manifest = storage.read_json(uri)
    for db in manifest["databases"]:
        ensure_loaded(manifest, db, settings)
    return uri, manifest


def start_server(latency: float = 0.0) -> tuple[subprocess.Popen, str]:
    """Start the scripted server (its own process) answering each call after ``latency``
    seconds; returns (process, base URL)."""
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(latency)], cwd=ROOT,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    return proc, proc.stdout.readline().strip()


def stop_server(proc: subprocess.Popen) -> str:
    """Stop a :func:`start_server` process; returns the most requests it answered at once
    (as text; empty when the server died)."""
    proc.stdin.close()
    peak = proc.stdout.readline().strip()
    proc.wait(10)
    return peak


def write_models(tmp: Path, base_url: str) -> None:
    """A models table under ``tmp`` naming the server at ``base_url`` ``bench`` (agent
    ``openai:bench``), set as ``QUERYLAB_MODELS``."""
    models = tmp / "models.yaml"
    models.write_text(
        "models:\n  - {name: bench, base_url: '" + base_url + "', "
        "prices: {input: 0.15, cached_input: 0.075, output: 0.6}, context_window: 128000}\n"
    )
    os.environ["QUERYLAB_MODELS"] = str(models)
