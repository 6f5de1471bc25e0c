"""The PostgreSQL backend of every process: Django's, whose check of a kept connection makes
no round trip when the connection's socket is quiet.

Django checks a kept connection (CONN_HEALTH_CHECKS, `is_usable`) before its first use in a
request, a worker's task or one of the proxy's database phases, so that one the server ended
(a restart, a terminated backend, an idle timeout) is replaced instead of failing it. Its
check sends a query: a round trip per request, task or phase, a few percent of the caller's
interpreter and the server's CPU. A connection the server ended leaves the socket readable:
the server's FATAL error and the end of the stream arrive unasked. An idle connection in good
order has nothing to read. So the check polls the socket without waiting and pays the round
trip only for a socket with something to read (which fails for an ended connection, and it is
replaced) or a connection psycopg already knows is closed. A peer that vanished without
closing (a dropped network path) is not seen at once: the round trip would wait for its
timeout too.

    ENGINE = "apps.core.postgresql"    (set by synth_project.settings for PostgreSQL)
"""

from __future__ import annotations

import select
from typing import Any

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


class DatabaseWrapper(base.DatabaseWrapper):
    def is_usable(self) -> bool:
        """Django's check of a kept connection (the health check before its first use in a
        request, task or proxy phase, and after an error): the query only for a socket with
        something to read or a connection known closed."""
        if self.connection is not None and socket_quiet(self.connection):
            return True
        return super().is_usable()
