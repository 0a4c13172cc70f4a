"""Least privilege on PostgreSQL: agents log in as a SELECT-only role per dataset database.

querylab itself connects as the server's administrator (the embedded server's ``postgres``
superuser, or the role in ``QUERYLAB_POSTGRES_URL``) to create and load databases. Agents never
do: :func:`ensure_agent_role` creates, for each dataset database ``ql_<dataset>_<db>_<hash>``,
a login role ``<database>_ro`` and :func:`agent_dsn` connects as it. The engine enforces:

- role attributes: ``LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT NOREPLICATION
  NOBYPASSRLS``, no membership in any role (so no ``pg_read_server_files``,
  ``pg_signal_backend``, ``pg_monitor``, ...), role settings ``default_transaction_read_only
  = on``, ``track_activities = off`` (other trials' statements never show in
  ``pg_stat_activity``) and ``temp_file_limit = 1GB``;
- databases: ``CONNECT`` on its own database only — ``PUBLIC`` loses ``CONNECT`` and
  ``TEMPORARY`` on every querylab database (on the embedded server, which querylab owns, on
  every database: ``postgres``, ``template1``, ...); on an external server other databases
  that ``PUBLIC`` may still connect to are named in a warning;
- inside its database: ``USAGE`` on schema ``public`` and ``SELECT`` on its tables and views,
  nothing else (``PUBLIC`` loses ``CREATE``/``USAGE`` on ``public``); and ``PUBLIC`` loses
  ``EXECUTE`` on the built-in functions that reach outside the query: ``pg_terminate_backend``,
  ``pg_cancel_backend`` (a role may signal its own other sessions, i.e. other trials),
  ``set_config``, the advisory locks, ``pg_notify`` and the activity functions.

Passwords: each role's password is an HMAC of its name under a random key in
``<QUERYLAB_HOME>/secrets/postgres-roles.key`` (``0600`` in a ``0700`` directory); it is sent to
the server only as a SCRAM-SHA-256 verifier (so no statement log can hold it) and never
written to an artifact or log. The embedded server requires it (``scram-sha-256`` in
``pg_hba.conf``, see :func:`tasks.db.databases.embedded_postgres_url`).

Role and grant statements serialise on an advisory lock, so concurrent processes may call
this at once. Raises ``psycopg.Error`` when the server refuses (e.g. an external
administrator without ``CREATEROLE``).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import os
import secrets
import threading
from pathlib import Path

log = logging.getLogger("querylab.pg_roles")

#: Built-in functions PUBLIC may execute by default that an agent must not: signalling other
#: sessions, changing settings, session-level locks, notifications, other sessions' activity.
REVOKED_FUNCTIONS = (
    "pg_terminate_backend", "pg_cancel_backend", "set_config",
    "pg_advisory_lock", "pg_advisory_lock_shared", "pg_try_advisory_lock",
    "pg_try_advisory_lock_shared", "pg_advisory_xact_lock", "pg_advisory_xact_lock_shared",
    "pg_try_advisory_xact_lock", "pg_try_advisory_xact_lock_shared", "pg_advisory_unlock",
    "pg_advisory_unlock_shared", "pg_advisory_unlock_all", "pg_notify",
    "pg_stat_get_activity", "pg_stat_get_backend_activity", "pg_stat_get_backend_pid",
    "pg_stat_get_backend_userid", "pg_stat_get_backend_client_addr",
    "pg_blocking_pids", "pg_safe_snapshot_blocking_pids",
)
#: Catalog views PUBLIC may read by default that show other sessions.
REVOKED_VIEWS = ("pg_stat_activity", "pg_stat_ssl", "pg_stat_gssapi", "pg_locks")
#: Role settings every agent role gets (superuser-only ones are skipped, with a warning,
#: when the administrator is not a superuser).
ROLE_SETTINGS = {"default_transaction_read_only": "on", "track_activities": "off",
                 "temp_file_limit": "1GB"}
#: Advisory lock key (any constant) serialising role and grant changes across processes.
_LOCK_KEY = 0x71_6C_72_6F  # "qlro"
_KEY_FILE = "postgres-roles.key"

_done: set[tuple[str, str]] = set()
_done_lock = threading.Lock()


def role_name(dbname: str) -> str:
    """The agent role of database ``dbname``: ``<dbname>_ro``, or ``qlro_<hash>`` when that
    would pass PostgreSQL's 63-byte identifier limit."""
    name = f"{dbname}_ro"
    if len(name.encode()) <= 63:
        return name
    return "qlro_" + hashlib.sha256(dbname.encode()).hexdigest()[:24]


def _key(home: Path) -> bytes:
    from tasks.core.fsperm import private_dir

    d = private_dir(Path(home) / "secrets")
    f = d / _KEY_FILE
    try:
        return bytes.fromhex(f.read_text().strip())
    except (OSError, ValueError):
        pass
    key = secrets.token_bytes(32)
    tmp = d / f".{_KEY_FILE}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(key.hex())
    try:
        os.link(tmp, f)  # first writer wins; a concurrent one reads the winner's key
    except FileExistsError:
        pass
    finally:
        tmp.unlink(missing_ok=True)
    return bytes.fromhex(f.read_text().strip())


def role_password(home: Path, role: str) -> str:
    """The password of ``role``: HMAC-SHA-256 of the role name under this home's key (hex)."""
    return hmac.new(_key(home), role.encode(), hashlib.sha256).hexdigest()


def scram_verifier(password: str, salt: bytes | None = None, iterations: int = 4096) -> str:
    """The SCRAM-SHA-256 verifier PostgreSQL stores for ``password`` (RFC 7677 / the format
    of ``pg_authid.rolpassword``)."""
    salt = salt or secrets.token_bytes(16)
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    stored_key = hashlib.sha256(client_key).digest()
    server_key = hmac.new(salted, b"Server Key", hashlib.sha256).digest()
    b64 = lambda b: base64.b64encode(b).decode()  # noqa: E731
    return f"SCRAM-SHA-256${iterations}:{b64(salt)}${b64(stored_key)}:{b64(server_key)}"


def agent_dsn(server_url: str, dbname: str, home: Path) -> str:
    """A key=value DSN that logs in to ``dbname`` as its agent role (see
    :func:`ensure_agent_role`, which must have run for this database)."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    role = role_name(dbname)
    params = conninfo_to_dict(server_url)
    params.update(dbname=dbname, user=role, password=role_password(home, role))
    return make_conninfo(**params)


def _try(conn, statement, what: str, problems: list[str]) -> None:
    """Run ``statement`` in a savepoint; a refused one is recorded in ``problems``."""
    import psycopg

    try:
        with conn.transaction():
            conn.execute(statement)
    except psycopg.errors.InsufficientPrivilege as exc:
        problems.append(f"{what}: {exc.diag.message_primary}")


def ensure_agent_role(server_url: str, dbname: str, home: Path, embedded: bool,
                      force: bool = False) -> str:
    """Create or update the agent role of ``dbname`` and its privileges (module docstring);
    returns the role name. Done once per process and database unless ``force`` (call it again
    after the database's tables were re-created: grants go with the tables). ``embedded``: the
    server is querylab's own (its other databases are closed to ``PUBLIC`` too)."""
    import psycopg
    from psycopg import sql
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    role = role_name(dbname)
    key = (server_url, dbname)
    with _done_lock:
        if key in _done and not force:
            return role
    verifier = scram_verifier(role_password(home, role))
    ident, db_ident = sql.Identifier(role), sql.Identifier(dbname)
    problems: list[str] = []
    with psycopg.connect(server_url, autocommit=False) as conn:
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
        superuser = conn.execute(
            "SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()[0]
        exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone()
        attrs = sql.SQL("LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT NOREPLICATION "
                        "NOBYPASSRLS PASSWORD {}").format(sql.Literal(verifier))
        verb = "ALTER ROLE {} WITH " if exists else "CREATE ROLE {} WITH "
        conn.execute(sql.SQL(verb).format(ident) + attrs)
        for (member_of,) in conn.execute(
                "SELECT r.rolname FROM pg_auth_members m JOIN pg_roles r ON r.oid = m.roleid "
                "JOIN pg_roles u ON u.oid = m.member WHERE u.rolname = %s", (role,)).fetchall():
            conn.execute(sql.SQL("REVOKE {} FROM {}").format(sql.Identifier(member_of), ident))
        for name, value in ROLE_SETTINGS.items():
            stmt = sql.SQL("ALTER ROLE {} SET {} = {}").format(
                ident, sql.Identifier(name), sql.Literal(value))
            if superuser:
                conn.execute(stmt)
            else:
                _try(conn, stmt, f"role setting {name}", problems)
        conn.execute(sql.SQL("REVOKE ALL ON DATABASE {} FROM PUBLIC").format(db_ident))
        conn.execute(sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(db_ident, ident))
        others = [r[0] for r in conn.execute(
            "SELECT datname FROM pg_database WHERE datallowconn AND datname <> %s "
            "AND has_database_privilege('public', oid, 'CONNECT')", (dbname,)).fetchall()]
        for other in others:
            if embedded or other.startswith("ql_"):
                _try(conn, sql.SQL("REVOKE CONNECT, TEMPORARY ON DATABASE {} FROM PUBLIC").format(
                    sql.Identifier(other)), f"database {other}", problems)
        conn.commit()
        reachable = [r[0] for r in conn.execute(
            "SELECT datname FROM pg_database WHERE datallowconn AND datname <> %s "
            "AND has_database_privilege(%s, oid, 'CONNECT')", (dbname, role)).fetchall()]
        conn.rollback()
    params = conninfo_to_dict(server_url)
    params["dbname"] = dbname
    with psycopg.connect(make_conninfo(**params), autocommit=False) as conn:
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
        conn.execute("REVOKE ALL ON SCHEMA public FROM PUBLIC")
        conn.execute(sql.SQL("GRANT USAGE ON SCHEMA public TO {}").format(ident))
        conn.execute(sql.SQL("GRANT SELECT ON ALL TABLES IN SCHEMA public TO {}").format(ident))
        for (schema,) in conn.execute(
                "SELECT nspname FROM pg_namespace WHERE nspname NOT IN ('public', "
                "'pg_catalog', 'information_schema') AND nspname NOT LIKE 'pg\\_%'").fetchall():
            _try(conn, sql.SQL("REVOKE ALL ON SCHEMA {} FROM PUBLIC").format(
                sql.Identifier(schema)), f"schema {schema}", problems)
        for (fn,) in conn.execute(
                "SELECT p.oid::regprocedure::text FROM pg_proc p WHERE p.proname = ANY(%s) "
                "AND p.pronamespace = 'pg_catalog'::regnamespace", (list(REVOKED_FUNCTIONS),)
        ).fetchall():
            _try(conn, sql.SQL("REVOKE EXECUTE ON FUNCTION {} FROM PUBLIC").format(sql.SQL(fn)),
                 f"function {fn}", problems)
        for view in REVOKED_VIEWS:
            _try(conn, sql.SQL("REVOKE SELECT ON pg_catalog.{} FROM PUBLIC").format(
                sql.Identifier(view)), f"view {view}", problems)
        conn.commit()
    if problems:
        log.warning("PostgreSQL agent role %s: the administrator could not %d privilege "
                    "change(s); agents keep them: %s", role, len(problems), "; ".join(problems))
    if reachable:
        log.warning("PostgreSQL agent role %s can still connect to database(s) %s through "
                    "PUBLIC; revoke it (REVOKE CONNECT ON DATABASE <name> FROM PUBLIC)",
                    role, ", ".join(reachable))
    with _done_lock:
        _done.add(key)
    return role


def forget() -> None:
    """Forget which roles this process set up (tests)."""
    with _done_lock:
        _done.clear()
