"""A real PostgreSQL (with pgvector) for the tests: the server named by ``DOSSIER_DATABASE_URL``, or a
throwaway one started from the ``pgserver`` wheel (PostgreSQL 16 + pgvector, unix socket only).

The tests connect as an ordinary role (``dossier_test``: no superuser, no BYPASSRLS) that owns the
databases it uses, as an application would; row-level security binds such a role, not a superuser.
Each test database is a copy of a template that already holds the ``vector`` extension (creating it
needs a superuser).

As root (CI containers, this machine) PostgreSQL refuses to run; pgserver then creates a system user
``pgserver`` (``useradd``) and runs the server as that user, opening up the permissions of the data
directory's parents so that user can reach it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote, urlencode

import psycopg
from psycopg.conninfo import conninfo_to_dict

APP_ROLE = "dossier_test"
APP_PASSWORD = "dossier-test"
TEMPLATE = "dossier_test_template"


def url_of(params: dict[str, str]) -> str:
    """A ``postgresql://`` URL from libpq connection parameters (a socket directory goes in ``?host=``)."""
    params = {k: str(v) for k, v in params.items() if v is not None}
    user = quote(params.pop("user", ""), safe="")
    password = params.pop("password", None)
    auth = f"{user}:{quote(password, safe='')}@" if password else (f"{user}@" if user else "")
    host = params.pop("host", "")
    port = params.pop("port", "")
    dbname = quote(params.pop("dbname", ""), safe="")
    netloc = ""
    if host.startswith("/"):
        params = {"host": host, **({"port": port} if port else {}), **params}
    elif host:
        netloc = host + (f":{port}" if port else "")
    query = f"?{urlencode(params)}" if params else ""
    return f"postgresql://{auth}{netloc}/{dbname}{query}"


class TestServer:
    """Creates and drops the databases of one test session on one server."""

    __test__ = False  # not a test class

    def __init__(self, admin_url: str, stop: object | None = None, workdir: Path | None = None) -> None:
        self.admin_url = admin_url
        self._stop = stop
        self._workdir = workdir
        self._admin = psycopg.connect(admin_url, autocommit=True)
        params = conninfo_to_dict(admin_url)
        self._app_params = {**params, "user": APP_ROLE, "password": APP_PASSWORD}
        if not self._admin.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [APP_ROLE]).fetchone():
            self._admin.execute(f"CREATE ROLE {APP_ROLE} LOGIN PASSWORD '{APP_PASSWORD}' NOSUPERUSER NOBYPASSRLS")
        self._admin.execute(f"DROP DATABASE IF EXISTS {TEMPLATE} WITH (FORCE)")
        self._admin.execute(f"CREATE DATABASE {TEMPLATE} OWNER {APP_ROLE}")
        with psycopg.connect(url_of({**params, "dbname": TEMPLATE}), autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        self._created: list[str] = []

    def url(self, database: str) -> str:
        return url_of({**self._app_params, "dbname": database})

    def admin_url_of(self, database: str) -> str:
        return url_of({**conninfo_to_dict(self.admin_url), "dbname": database})

    def create_database(self, template: str = TEMPLATE) -> str:
        """A new empty database (or a copy of ``template``, which must have no open connection); its URL."""
        name = f"dossier_test_{uuid.uuid4().hex[:12]}"
        self._admin.execute(f"CREATE DATABASE {name} TEMPLATE {template} OWNER {APP_ROLE}")
        self._created.append(name)
        return self.url(name)

    def drop_database(self, url: str) -> None:
        name = conninfo_to_dict(url)["dbname"]
        self._admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        if name in self._created:
            self._created.remove(name)

    @contextmanager
    def outage(self, url: str) -> Iterator[None]:
        """The database of ``url`` refuses every connection (its open ones are ended) until the block ends:
        for the application, the server is down."""
        name = conninfo_to_dict(url)["dbname"]
        self._admin.execute(f"ALTER DATABASE {name} ALLOW_CONNECTIONS false")
        self._admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", [name])
        try:
            yield
        finally:
            self._admin.execute(f"ALTER DATABASE {name} ALLOW_CONNECTIONS true")

    def close(self) -> None:
        for name in list(self._created):
            self._admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        self._admin.execute(f"DROP DATABASE IF EXISTS {TEMPLATE} WITH (FORCE)")
        self._admin.close()
        if self._stop is not None:
            self._stop.cleanup()  # type: ignore[attr-defined]
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)


def start() -> TestServer:
    """Use ``DOSSIER_DATABASE_URL`` (a role that may create roles and databases), or start a pgserver.

    The throwaway server's data directory is a fresh directory under the system temp dir, not under
    pytest's ``tmp_path`` tree: pytest makes that tree private (0700) again while the tests run, and the
    server's own user (when running as root) would then lose its way to the data directory.
    """
    given = os.environ.get("DOSSIER_DATABASE_URL", "")
    if given.startswith(("postgresql://", "postgres://")):
        return TestServer(given)
    with warnings.catch_warnings():  # pgserver's platformdirs warns when XDG_RUNTIME_DIR is unset
        warnings.simplefilter("ignore")
        import pgserver

    workdir = Path(tempfile.mkdtemp(prefix="dossier-pg-"))
    server = pgserver.get_server(workdir / "pgdata", cleanup_mode="delete")
    admin_url = server.get_uri()
    with psycopg.connect(admin_url, autocommit=True) as conn:
        # a throwaway server: durability off; HNSW builds want memory (DESIGN.md section 5)
        for setting, value in (("maintenance_work_mem", "1GB"), ("fsync", "off"), ("synchronous_commit", "off"),
                               ("full_page_writes", "off")):  # fmt: skip
            conn.execute(f"ALTER SYSTEM SET {setting} = '{value}'")
        conn.execute("SELECT pg_reload_conf()")
    return TestServer(admin_url, stop=server, workdir=workdir)
