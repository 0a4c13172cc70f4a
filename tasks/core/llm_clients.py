"""HTTP clients of model endpoints on one TLS context per process.

:func:`ssl_context` builds the certificate-verifying TLS context once per process (per
``SSL_CERT_FILE`` / ``SSL_CERT_DIR``): building one loads the CA bundle, ~25-35 ms of CPU,
which every ``openai.OpenAI()`` otherwise pays again (the trials stage builds a model client
per batch, all while the run's first trials wait to start). It is httpx's own default context
(the same verification as ``verify=True``). :func:`openai_client` is ``openai.OpenAI`` on it.
"""

from __future__ import annotations

import functools
import ssl
import threading

import openai

from tasks.core.settings import env_get


@functools.lru_cache(maxsize=8)
def _context_for(cert_file: str | None, cert_dir: str | None) -> ssl.SSLContext:
    import httpx2  # openai's HTTP library

    return httpx2.create_ssl_context()


_BUILDING = threading.Lock()


def ssl_context() -> ssl.SSLContext:
    """httpx's default certificate-verifying TLS context (``SSL_CERT_FILE`` / ``SSL_CERT_DIR``
    honoured as httpx honours them), built once per process and per value of those two
    variables; shared by every client (an ``ssl.SSLContext`` is safe to share). Built under a
    lock: the batches of a trials stage start side by side and each makes a client, and
    without it every one of them built its own context on the first call (``lru_cache`` does
    not hold concurrent callers of a missing entry)."""
    with _BUILDING:
        return _context_for(env_get("SSL_CERT_FILE"), env_get("SSL_CERT_DIR"))


def warm_up() -> None:
    """Do now what this process's first model client would otherwise wait for: the TLS context
    (:func:`ssl_context`: loading the CA bundle, ~25-45 ms) and the HTTP transport's lazy
    imports (a throwaway client, closed at once; it opens no connection). The trials stage
    runs it in the background as it starts (:func:`tasks.trials.stage.warm_up_stage`), so its
    first batches find both ready. Raises what building the context raises (a bad
    ``SSL_CERT_FILE``: the first real client reports it again)."""
    openai.DefaultHttpxClient(verify=ssl_context()).close()


def openai_client(base_url: str | None, api_key: str | None, timeout: float) -> openai.OpenAI:
    """An ``openai.OpenAI`` client of ``base_url`` (no SDK retries: querylab retries itself;
    ``timeout`` seconds per request unless a request says otherwise) on :func:`ssl_context`,
    with the SDK's default connection limits and redirects."""
    return openai.OpenAI(
        base_url=base_url, api_key=api_key, max_retries=0, timeout=timeout,
        http_client=openai.DefaultHttpxClient(verify=ssl_context()),
    )
