"""The PostgreSQL backend of every process: Django's, whose checks of a kept connection make
no round trip when the connection's socket is quiet.

Two checks exist for a connection the server has ended (a restart, a terminated backend, an
idle timeout): Django's health check of a persistent connection before its first use in a
request or a worker's task (CONN_HEALTH_CHECKS, `is_usable`), and the proxy's pool's check of
a connection it lends (SYNTH_PROXY_DB_POOL_SIZE). Both send a query: a round trip per request,
task or database phase, a few percent of the caller's interpreter and the server's CPU. A
connection the server ended leaves the socket readable: the server's FATAL error and the end
of the stream arrive unasked. An idle connection in good order has nothing to read. So both
checks poll the socket without waiting and pay the round trip only for a socket with
something to read (which fails for an ended connection, and it is replaced) or a connection
psycopg already knows is closed. A peer that vanished without closing (a dropped network
path) is seen by neither at once: the round trip would wait for its timeout too.

    ENGINE = "apps.core.postgresql"    (set by synth_project.settings for PostgreSQL)
"""

from __future__ import annotations

import select
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db.backends.base.base import NO_DB_ALIAS
from django.db.backends.postgresql import base


def socket_quiet(conn: Any) -> bool:
    """Whether a psycopg connection is open and its socket has nothing to read."""
    if conn.closed or conn.broken:
        return False
    # poll, not select: a process serving hundreds of streams holds descriptors above
    # select's limit (1024), where select raises for every connection.
    poller = select.poll()
    poller.register(conn.fileno(), select.POLLIN)
    return not poller.poll(0)


def connection_check(conn: Any) -> None:
    """The pool's check of a connection it is about to lend: a round trip only if the socket
    has something to read or the connection is known closed; raises if that fails."""
    from psycopg_pool import ConnectionPool

    if socket_quiet(conn):
        return
    ConnectionPool.check_connection(conn)


class DatabaseWrapper(base.DatabaseWrapper):
    def is_usable(self) -> bool:
        """Django's check of a kept connection (the health check before its first use in a
        request or task, and after an error): the query only for a socket with something to
        read or a connection known closed."""
        if self.connection is not None and socket_quiet(self.connection):
            return True
        return super().is_usable()

    @property
    def pool(self) -> Any:
        """Django's pool (django.db.backends.postgresql.base), built with connection_check
        instead of ConnectionPool.check_connection; the same options otherwise."""
        pool_options = self.settings_dict["OPTIONS"].get("pool")
        if self.alias == NO_DB_ALIAS or not pool_options:
            return None
        # Django's backend attributes below are not in the type stubs.
        pools: dict[str, Any] = self._connection_pools  # type: ignore[attr-defined]
        if self.alias not in pools:
            if self.settings_dict.get("CONN_MAX_AGE", 0) != 0:
                raise ImproperlyConfigured("Pooling doesn't support persistent connections.")
            from psycopg_pool import ConnectionPool

            connect_kwargs = self.get_connection_params()
            connect_kwargs["autocommit"] = True  # Django sets the connection's own mode later
            pool = ConnectionPool(
                kwargs=connect_kwargs,
                open=False,
                configure=self._configure_connection,  # type: ignore[attr-defined]
                check=connection_check if self.settings_dict["CONN_HEALTH_CHECKS"] else None,
                **({} if pool_options is True else pool_options),
            )
            # Of threads building it at once (it is not open yet), the first one's is kept.
            pools.setdefault(self.alias, pool)
        return pools[self.alias]
