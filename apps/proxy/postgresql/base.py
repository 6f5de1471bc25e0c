"""The proxy process' PostgreSQL backend: Django's, whose connection pool checks a connection
it lends without a round trip when the connection's socket is quiet.

Django's pool (SYNTH_PROXY_DB_POOL_SIZE, in the proxy's process only) checks each connection
as it lends it with an empty query: a round trip to the server per database phase, two per
model call (stage, settle), a few percent of the proxy's interpreter and the server's CPU.
What that check exists for, a connection the server has ended (a restart, a terminated
backend, an idle timeout), leaves the socket readable: the server's FATAL error and the end
of the stream arrive unasked. An idle connection in good order has nothing to read. So the
check polls the socket without waiting and pays the round trip only for a socket with
something to read (which fails for an ended connection, and the pool lends another) or a
connection psycopg already knows is closed. A peer that vanished without closing (a dropped
network path) is seen by neither at once: the round trip would wait for its timeout too.

    ENGINE = "apps.proxy.postgresql"    (set by synth_project.settings for the proxy's pool)
"""

from __future__ import annotations

import select
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db.backends.base.base import NO_DB_ALIAS
from django.db.backends.postgresql import base


def connection_check(conn: Any) -> None:
    """The pool's check of a connection it is about to lend: a round trip only if the socket
    has something to read or the connection is known closed; raises if that fails."""
    from psycopg_pool import ConnectionPool

    if not conn.closed and not conn.broken:
        # poll, not select: a process serving hundreds of streams holds descriptors above
        # select's limit (1024), where select raises for every connection.
        poller = select.poll()
        poller.register(conn.fileno(), select.POLLIN)
        if not poller.poll(0):
            return
    ConnectionPool.check_connection(conn)


class DatabaseWrapper(base.DatabaseWrapper):
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
