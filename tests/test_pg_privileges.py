"""PostgreSQL least privilege and closed state directories.

Agents reach PostgreSQL as a SELECT-only login role per dataset database (tasks/db/pg_roles.py):
the engine refuses everything else even when the parser check is bypassed. The same roles are
made on an "external" server (``QUERYLAB_POSTGRES_URL``; here the embedded server addressed by
URL). querylab's home and artifact root are closed to other OS users, so the database server's
own user cannot read answers even as a superuser would (``pg_read_file``).
"""

from __future__ import annotations

import logging
import os
import stat
import uuid
from pathlib import Path

import psycopg
import pyarrow as pa
import pytest

from tasks.core import storage
from tasks.db.databases import PostgresDatabase, QueryError, load_postgres, postgres_database_dsn
from tasks.db.engines import _physical_name, open_databases
from tasks.core.fsperm import secure_state
from tasks.db.pg_roles import agent_dsn, ensure_agent_role, role_name, role_password


@pytest.fixture(scope="module")
def agent_pg(movies_manifest, settings):
    return open_databases(movies_manifest, settings)["boxoffice"]


def _one(db, sql):
    return db.query(sql).rows[0]


def test_agent_role_has_no_privilege_beyond_select(agent_pg):
    row = _one(agent_pg, "SELECT rolsuper, rolcreaterole, rolcreatedb, rolreplication, rolbypassrls, "
                         "rolinherit FROM pg_roles WHERE rolname = current_user")
    assert row == dict.fromkeys(row, False)
    assert _one(agent_pg, "SELECT count(*) AS n FROM pg_auth_members m JOIN pg_roles r "
                          "ON r.oid = m.member WHERE r.rolname = current_user") == {"n": 0}
    checks = _one(agent_pg, """SELECT
        has_database_privilege(current_user, current_database(), 'CREATE') AS db_create,
        has_database_privilege(current_user, current_database(), 'TEMP') AS db_temp,
        has_schema_privilege(current_user, 'public', 'CREATE') AS schema_create,
        has_database_privilege(current_user, 'postgres', 'CONNECT') AS postgres_connect,
        has_database_privilege(current_user, 'template1', 'CONNECT') AS template_connect,
        pg_has_role(current_user, 'pg_read_server_files', 'USAGE') AS read_files,
        pg_has_role(current_user, 'pg_signal_backend', 'USAGE') AS signal,
        pg_has_role(current_user, 'pg_monitor', 'USAGE') AS monitor""")
    assert checks == dict.fromkeys(checks, False)
    others = agent_pg.query("SELECT datname FROM pg_database WHERE datallowconn AND "
                            "datname <> current_database() AND "
                            "has_database_privilege(current_user, oid, 'CONNECT')").rows
    assert others == []  # no other database: not postgres, not another dataset's
    assert _one(agent_pg, "SELECT current_setting('default_transaction_read_only') AS ro") == {"ro": "on"}


ENGINE_REFUSES = [
    ('SELECT U&"pg\\005fread\\005ffile"(\'/etc/hostname\')', "permission denied"),
    ('SELECT U&"pg\\005fls\\005fdir"(\'/\')', "permission denied"),
    ('SELECT U&"pg\\005fterminate\\005fbackend"(pg_backend_pid())', "permission denied"),
    ("SELECT pg_cancel_backend(pg_backend_pid())", "permission denied"),
    ("SELECT set_config('statement_timeout', '0', false)", "permission denied"),
    ("SELECT pg_advisory_lock(1)", "permission denied"),
    ("SELECT lo_import('/etc/passwd')", "permission denied"),
    ("COPY (SELECT 1) TO PROGRAM 'id'", "permission denied"),
    ("COPY revenue FROM '/etc/passwd'", "permission denied to COPY from a file"),
    ("SET ROLE postgres", "permission denied"),
    ("CREATE TABLE x (a int)", "read-only transaction"),
    ("CREATE EXTENSION dblink", "read-only transaction"),
    ("SELECT * FROM pg_stat_activity", "permission denied"),
    ("SELECT pg_stat_get_backend_activity(1)", "permission denied"),
    ("SELECT * FROM querylab_meta.loaded", "permission denied"),
]


@pytest.mark.parametrize(("sql", "message"), ENGINE_REFUSES, ids=[s[:40] for s, _ in ENGINE_REFUSES])
def test_engine_refuses_without_the_parser(agent_pg, sql, message):
    with pytest.raises(QueryError, match=message):
        agent_pg._execute(sql, 10)


def test_agent_cannot_signal_another_trials_session(agent_pg, movies_manifest, settings):
    """Every trial of a dataset uses the same role: one must not end another's session."""
    import threading

    other = {}

    def hold():
        db = open_databases(movies_manifest, settings)["boxoffice"]
        other["pid"] = db.query("SELECT pg_backend_pid() AS p").rows[0]["p"]

    t = threading.Thread(target=hold)
    t.start()
    t.join()
    with pytest.raises(QueryError, match="permission denied"):
        agent_pg._execute(f"SELECT pg_terminate_backend({other['pid']})", 10)


def test_role_needs_its_password_and_cannot_reach_other_databases(movies_manifest, settings, pg_server_url):
    name = _physical_name(movies_manifest, "boxoffice")
    good = agent_dsn(pg_server_url, name, Path(settings.home))
    with psycopg.connect(good) as conn:
        assert conn.execute("SELECT current_user").fetchone()[0] == role_name(name)
    for dsn in (good.replace(role_password(Path(settings.home), role_name(name)), "wrong"),
                good.replace(f"dbname={name}", "dbname=postgres")):
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(dsn).close()


def test_external_server_gets_the_same_restricted_roles(pg_server_url, tmp_path, caplog):
    """With QUERYLAB_POSTGRES_URL querylab creates the roles itself (here: the embedded
    server addressed by URL); the password lives only in the home's 0600 key file."""
    home = tmp_path / "home"
    name = f"ql_ext_{uuid.uuid4().hex[:8]}"
    dsn = postgres_database_dsn(pg_server_url, name, create=True)
    load_postgres(dsn, {"t": pa.table({"a": [1, 2, 3]})})
    with caplog.at_level(logging.DEBUG):
        role = ensure_agent_role(pg_server_url, name, home, embedded=False)
    db = PostgresDatabase("x", agent_dsn(pg_server_url, name, home))
    try:
        assert db.query("SELECT sum(a) AS s, current_user AS u FROM t").rows == [{"s": 6, "u": role}]
        with pytest.raises(QueryError, match="permission denied"):
            db._execute('SELECT U&"pg\\005fread\\005ffile"(\'/etc/hostname\')', 10)
        assert _one(db, "SELECT rolsuper FROM pg_roles WHERE rolname = current_user") == {"rolsuper": False}
    finally:
        db.close()
    key = home / "secrets" / "postgres-roles.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert stat.S_IMODE(key.parent.stat().st_mode) == 0o700
    password = role_password(home, role)
    assert password not in caplog.text
    with psycopg.connect(pg_server_url) as conn:  # the server stores a SCRAM verifier only
        stored = conn.execute("SELECT rolpassword FROM pg_authid WHERE rolname = %s", (role,)).fetchone()[0]
    assert stored.startswith("SCRAM-SHA-256$") and password not in stored


def test_no_secret_in_artifacts(movies_manifest, settings, agent_pg):
    name = _physical_name(movies_manifest, "boxoffice")
    password = role_password(Path(settings.home), role_name(name)).encode()
    for uri in storage.list_uris(settings.artifacts):
        assert password not in Path(uri).read_bytes(), uri


# ---- closed directories ------------------------------------------------------------------------------


def test_state_and_artifacts_are_closed_to_other_users(tmp_path):
    home, art = tmp_path / "home", tmp_path / "artifacts"
    (home / "build").mkdir(parents=True)
    (home / "cache.json").write_text("{}")
    (home / "build").chmod(0o755)
    art.mkdir()
    art.chmod(0o755)
    secure_state(home, str(art))
    mode = lambda p: stat.S_IMODE(p.stat().st_mode)  # noqa: E731
    assert mode(home) == 0o711 and mode(home / "build") == 0o700
    assert mode(home / "cache.json") == 0o600 and mode(art) == 0o700


def test_session_home_and_artifacts_are_closed(movies_manifest, stocks_manifest, settings, agent_pg):
    home = Path(settings.home)
    mode = lambda p: stat.S_IMODE(p.stat().st_mode)  # noqa: E731
    assert mode(home) == 0o711
    assert mode(home / "build") == 0o700 and mode(home / "secrets") == 0o700
    assert mode(Path(settings.artifacts)) == 0o700


@pytest.mark.skipif(os.geteuid() != 0, reason="the server runs as another OS user only as root")
def test_even_a_superuser_read_through_the_server_cannot_reach_answers(movies_manifest, settings, pg_server_url):
    """The server's OS user (embedded_postgres) cannot open artifacts or built databases, so
    not even the administrator's pg_read_file reaches the answer key."""
    manifest = storage.join(settings.artifacts, "datasets", "movies", movies_manifest["version"],
                            "manifest.json")
    targets = [manifest, str(next((Path(settings.home) / "build").rglob("*.sqlite"), manifest))]
    with psycopg.connect(pg_server_url, autocommit=True) as conn:
        for path in targets:
            with pytest.raises(psycopg.Error, match="Permission denied"):
                conn.execute("SELECT pg_read_file(%s)", (path,))
