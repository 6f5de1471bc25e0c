"""The proxy's per-call lookups, cached in the process: who a secret is, and the route table.

Every call authenticates its caller and resolves its route. Read from the database each
time, that was two of a call's four database phases (each with its thread hop); served from
here, a call reads neither unless its entry is stale.

Freshness, not a lifetime, decides whether a cached answer is used: every entry carries the
time its data was last read or confirmed (`valid_as_of`, the start of that read), and it is
served only while that is at most SYNTH_PROXY_LOOKUP_CHECK_SECONDS old. A stale credential
is confirmed again with every other stale one in one query by primary key (still there, not
revoked, the same expiry), so a revocation takes effect within that interval however it was written (the
service, the admin, a bulk update) and with any database, SQLite included: no broker or
notification channel is needed, and the cost is one small query per interval per process
while calls keep coming. An operator's token is not confirmed that way (its role and its
token may change in several tables): it is read again once stale. The route table is small
and read whole once stale. Expiry is checked on every use, from the cached row.

A process serving calls keeps its callers' entries from going stale at all: the phase that
settles each call, once its answer is out, also confirms ahead (`lookups_confirm_ahead`) the
entries in use (served within CALLER_ACTIVE_SECONDS) that are past half the interval, and
re-reads the route table past half of it, at most once per half interval and never waiting
for another thread's confirmation. A caller in use is then always found fresh, and its calls
authenticate and resolve with no database phase of their own. "In use" is a window, not
"served since the last confirmation": an agent calls its model every second or few (a slow
sampler, a long tool run), far less often than the interval, and confirming only the entries
served since their last confirmation left every such call to find its entry stale. The bound
is unchanged: an entry is still served only while its last confirmation is within the
interval, judged at the moment the call asked (a confirmation that began after the call
arrived is valid for it, however long the query and the thread hop behind it took).

An attempt's first call need not read its caller either. Attempt credentials are minted as
their attempts start, seconds before the harness in the sandbox makes its first call; a
proxy process looks for those minted since its last look every half interval, on a timer
of its own (`lookups_keep_fresh`: a read newest first along the primary key, whose ids are
time-ordered), and caches those in force as in use for MINTED_ACTIVE_SECONDS, so they are
confirmed ahead with the others until their first call and, once served, after it. Without
it every attempt's first call was a miss: a database phase before its first byte, and when
a fleet's sessions opened together, one batch of loads after another (the opening calls'
wait to authenticate was p50 142-153 ms at 200 sessions). A credential minted before a
process's first look (within MINTED_ACTIVE_SECONDS) is looked for too; one missed
(committed later than the overlap allows, or past the bound of one look) is read on its
first call, as before. Revocation is unchanged: a cached entry is served only while its
last read or confirmation is within the interval.

Failures are not cached: an unknown or revoked secret reads the database every time, which
is also where its exact refusal comes from (apps.proxy.credentials).

`caller_cached` and `routes_cached` touch no database and are called on the event loop;
`caller_load` and `routes_load` read it and run in a database phase (apps.proxy.db).
"""

from __future__ import annotations

import functools
import logging
import math
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, cast

from cachetools import TTLCache
from django.conf import settings
from django.db import connection
from django.utils import timezone

from apps.accounts.models import ModelCredential
from apps.accounts.services import token_hash
from apps.core.bulk import bound_cursor
from apps.core.ids import PrefixedIdField, id_floor
from apps.proxy.credentials import Caller, attempt_caller, caller_authenticate, credential_callers_authenticate
from apps.proxy.errors import AuthenticationFailed
from apps.proxy.models import ModelRoute
from synth_common.fresh_cache import FreshCache

logger = logging.getLogger(__name__)

# Callers kept at most, and for at most this long since they were read in full (a bound on
# memory and on how long a cached row's other fields may lag, not on revocation).
CALLER_ENTRIES = 8192
CALLER_TTL_SECONDS = 300.0
# An entry served within this long is kept confirmed ahead: one query by primary key per half
# interval per process covers every caller in use, however seldom each one calls.
CALLER_ACTIVE_SECONDS = 60.0
# Credentials confirmed per query (SQLite bounds a statement's parameters).
CONFIRM_BATCH = 500
# A look for credentials minted lately reads back this far before the previous look began: a
# row whose id was made before another's may commit after it (ids are made in Python, before
# the INSERT), and the minting hosts' clocks may differ a little from this one's.
MINTED_OVERLAP_SECONDS = 5.0
# Credentials cached by one look, at most (the newest): a mass of them minted at once must
# not evict the callers in use.
MINTED_MOST = CALLER_ENTRIES // 4
MINTED_PAGE = 64  # credentials read per query of a look, newest first
# A credential cached by a look counts as in use (confirmed ahead) this long, not for
# CALLER_ACTIVE_SECONDS, and is dropped then unless it has been served: every process
# caches every credential minted, and only the one its attempt's calls reach serves it, so
# each process confirms four times a second what the whole fleet minted in this window
# (1,400 ids: 10 ms of the process's CPU, 15 ms in all, per confirmation). Its attempt's
# first call comes seconds after the mint (the sandbox and the harness start); one that
# comes later reads its caller then, as before.
MINTED_ACTIVE_SECONDS = 10.0


def _fresh(valid_as_of: float, *, now: float | None = None) -> bool:
    at = time.monotonic() if now is None else now
    return at - valid_as_of <= settings.SYNTH_PROXY_LOOKUP_CHECK_SECONDS


@dataclass
class _Entry:
    caller: Caller
    valid_as_of: float
    used_at: float  # when it was last read or served (monotonic): in use, worth confirming ahead
    # False for a credential cached ahead of its first call here (minted_cache): in use for
    # MINTED_ACTIVE_SECONDS only, then dropped unless it has been served.
    served: bool = True


def _in_use(entry: _Entry, *, now: float) -> bool:
    return now - entry.used_at <= (CALLER_ACTIVE_SECONDS if entry.served else MINTED_ACTIVE_SECONDS)


class CallerCache:
    """Authenticated callers by the SHA-256 of their secret (the secret itself is not kept)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._confirming = threading.Lock()  # held across the confirming query, never with _lock
        self._entries: TTLCache[str, _Entry] = TTLCache(maxsize=CALLER_ENTRIES, ttl=CALLER_TTL_SECONDS)
        self._ahead_at = -math.inf  # when the last confirmation ahead began (monotonic)
        self._minted_looked_at: datetime | None = None  # when the last look for minted credentials began

    def cached(self, *, secret: str | None, asked_at: float | None = None) -> Caller | None:
        """The caller for `secret` if it is cached, fresh (at `asked_at`, by default now) and
        not expired; else None."""
        if not secret:
            return None
        key = token_hash(secret)
        now = time.monotonic()
        with self._lock:  # held for a dictionary read only: never across a query
            entry = self._entries.get(key)
        if entry is None or not _fresh(entry.valid_as_of, now=now if asked_at is None else asked_at):
            return None
        cred = entry.caller.credential
        if cred is not None and cred.expires_at <= timezone.now():
            return None
        entry.used_at, entry.served = now, True
        return entry.caller

    def load(self, *, secret: str | None) -> Caller:
        """The caller for `secret` (or 401/403), confirming stale entries first. Reads the
        database: call it in a database phase."""
        asked_at = time.monotonic()
        if secret:
            self._confirm_stale()
            # Fresh as of when the call asked: a confirmation that began after that is as good
            # as a read of its own, even if the query (or the wait for another thread's) ran
            # past the interval on a loaded machine.
            caller = self.cached(secret=secret, asked_at=asked_at)
            if caller is not None:
                return caller
        started = time.monotonic()
        caller = caller_authenticate(secret=secret)
        assert secret  # caller_authenticate refused an empty one
        with self._lock:
            self._entries[token_hash(secret)] = _Entry(caller=caller, valid_as_of=started, used_at=started)
        return caller

    def load_many(self, *, secrets: Sequence[str]) -> dict[str, Caller | AuthenticationFailed]:
        """The callers of several model-credential secrets (those refused: their error), the
        ones not fresh read in one query and cached as `load` does. Reads the database: call
        it in a database phase."""
        asked_at = time.monotonic()
        self._confirm_stale()
        out: dict[str, Caller | AuthenticationFailed] = {}
        missing = []
        for secret in secrets:
            caller = self.cached(secret=secret, asked_at=asked_at)
            if caller is not None:
                out[secret] = caller
            else:
                missing.append(secret)
        for i in range(0, len(missing), CONFIRM_BATCH):  # SQLite bounds a statement's parameters
            started = time.monotonic()
            for secret, result in credential_callers_authenticate(secrets=missing[i : i + CONFIRM_BATCH]).items():
                if isinstance(result, Caller):
                    with self._lock:
                        self._entries[token_hash(secret)] = _Entry(caller=result, valid_as_of=started, used_at=started)
                out[secret] = result
        return out

    def _confirm_stale(self) -> None:
        """Confirm the stale credentials in one query (credentials_live; off PostgreSQL one
        per CONFIRM_BATCH); drop those revoked or gone, and stale operators (read again in
        full when next used). One thread at a time: the calls that find their entries stale
        while another confirms them wait for it and then find them fresh, rather than each
        confirming every stale entry again."""
        if not self._any_stale():
            return
        with self._confirming:
            self._confirm_locked(older_than=settings.SYNTH_PROXY_LOOKUP_CHECK_SECONDS, in_use_only=False)

    def confirm_ahead(self) -> None:
        """Confirm the entries in use (served within CALLER_ACTIVE_SECONDS) that are past half
        the check interval, before they go stale; at most once per half interval, and not at
        all while another thread confirms. Reads the database: call it in a database phase."""
        half = settings.SYNTH_PROXY_LOOKUP_CHECK_SECONDS / 2
        now = time.monotonic()
        if half <= 0 or now - self._ahead_at < half:
            return  # confirmed ahead lately: what is due now waits for the next half interval
        if not self._confirming.acquire(blocking=False):
            return
        try:
            if self._confirm_locked(older_than=half, in_use_only=True):
                self._ahead_at = now
        finally:
            self._confirming.release()

    def minted_cache(self) -> int:
        """Cache the credentials in force minted since the last look began (the first look:
        within MINTED_ACTIVE_SECONDS), less the overlap, that are not cached yet, as in use
        until their first call for MINTED_ACTIVE_SECONDS; returns how many. Reads the
        database: call it in a database phase."""
        looked_at, started = timezone.now(), time.monotonic()
        since = self._minted_looked_at or looked_at - timedelta(seconds=MINTED_ACTIVE_SECONDS)
        minted = credentials_minted(since=since - timedelta(seconds=MINTED_OVERLAP_SECONDS), most=MINTED_MOST)
        self._minted_looked_at = looked_at
        with self._lock:
            # One cached already is confirmed with the others, not read again.
            new = [cred_id for cred_id, key in minted if key not in self._entries]
        added = 0
        for i in range(0, len(new), CONFIRM_BATCH):  # SQLite bounds a statement's parameters
            rows = ModelCredential.objects.select_related("org").filter(
                id__in=new[i : i + CONFIRM_BATCH], revoked_at__isnull=True, expires_at__gt=timezone.now()
            )
            with self._lock:
                for cred in rows:
                    if cred.token_hash not in self._entries:
                        entry = _Entry(caller=attempt_caller(cred), valid_as_of=started, used_at=started, served=False)
                        self._entries[cred.token_hash] = entry
                        added += 1
        return added

    def _any_stale(self) -> bool:
        with self._lock:
            return any(not _fresh(e.valid_as_of) for e in self._entries.values())

    def _confirm_locked(self, *, older_than: float, in_use_only: bool) -> bool:
        """Confirm the entries read or confirmed more than `older_than` seconds ago (only
        those in use, if `in_use_only`); False if there were none to query. An operator's
        entry is not confirmed: dropped once stale, kept until then."""
        now = time.monotonic()
        with self._lock:
            due = []
            for key, e in list(self._entries.items()):
                if not e.served and not _in_use(e, now=now):
                    del self._entries[key]  # cached ahead for calls that did not come to this process
                elif now - e.valid_as_of > older_than and (not in_use_only or _in_use(e, now=now)):
                    due.append((key, e))
            for key, entry in due:
                if entry.caller.credential is None and not _fresh(entry.valid_as_of):
                    del self._entries[key]
        stale = [(key, e) for key, e in due if e.caller.credential is not None]
        if not stale:
            return False
        started = time.monotonic()
        ids = sorted({e.caller.credential.id for _, e in stale if e.caller.credential is not None})
        live = credentials_live(ids=ids)
        with self._lock:
            for key, entry in stale:
                if self._entries.get(key) is not entry:
                    continue  # replaced meanwhile by a fresher read
                cred = entry.caller.credential
                # A changed expiry is read again in full (the cached row is not patched).
                if cred is not None and cred.id in live and live[cred.id] == cred.expires_at:
                    entry.valid_as_of = max(entry.valid_as_of, started)
                else:
                    del self._entries[key]
        return True

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._ahead_at = -math.inf
            self._minted_looked_at = None


@functools.cache
def _live_statement() -> str:
    meta = ModelCredential._meta
    column = {f.name: connection.ops.quote_name(f.column) for f in meta.concrete_fields}
    return (
        f"SELECT {column['id']}, {column['expires_at']} FROM {connection.ops.quote_name(meta.db_table)} "
        f"WHERE {column['id']} = ANY(string_to_array(%s, ',')) AND {column['revoked_at']} IS NULL"
    )


def credentials_live(*, ids: Sequence[str]) -> dict[str, Any]:
    """id -> expires_at of the credentials of ``ids`` that exist and are not revoked.

    On PostgreSQL one prepared statement whose ids travel as one text parameter: the ORM's
    ``id__in`` prepares, binds and has PostgreSQL parse one parameter per id, 1.1 ms of the
    interpreter for 200 ids against 0.09 ms, and a proxy process confirms every caller it
    serves up to four times a second (a fleet's process serves hundreds). Ids never hold a
    comma (PrefixedIdField); one that did would be confirmed through the ORM."""
    if connection.vendor == "postgresql" and not any("," in i for i in ids):
        with bound_cursor(prepared=True) as cursor:
            cursor.execute(_live_statement(), [",".join(ids)])
            return dict(cursor.fetchall())
    live: dict[str, Any] = {}
    for i in range(0, len(ids), CONFIRM_BATCH):
        live.update(
            ModelCredential.objects.filter(id__in=ids[i : i + CONFIRM_BATCH], revoked_at__isnull=True).values_list(
                "id", "expires_at"
            )
        )
    return live


def credentials_minted(*, since: datetime, most: int) -> list[tuple[str, str]]:
    """(id, token hash) of the credentials minted at ``since`` or later that are neither
    revoked nor expired, newest first, at most ``most``.

    Read newest first along the primary key (new_id orders ids by the time they were made), a
    page at a time, until an id older than ``since``: an index scan backward from the table's
    end, whatever its size. A range condition (``id >= ...``) was read by a scan of the whole
    table whenever the planner judged the range a few percent of it: 6-8 ms of PostgreSQL per
    look on a bench database of 19,000 credentials, four looks a second per process."""
    floor = id_floor(cast(PrefixedIdField, ModelCredential._meta.pk).prefix, at=since.timestamp())
    now = timezone.now()
    out: list[tuple[str, str]] = []
    before: str | None = None
    while True:
        newest = ModelCredential.objects.order_by("-id")
        if before is not None:
            newest = newest.filter(id__lt=before)
        page = list(newest.values_list("id", "token_hash", "revoked_at", "expires_at")[:MINTED_PAGE])
        for cred_id, key, revoked_at, expires_at in page:
            if cred_id < floor or len(out) >= most:
                return out
            if revoked_at is None and expires_at > now:
                out.append((cred_id, key))
        if len(page) < MINTED_PAGE:
            return out
        before = page[-1][0]


class RouteCache:
    """Every model route, ordered by name, read whole once stale."""

    KEY = "routes"

    def __init__(self) -> None:
        self._current: FreshCache[str, tuple[ModelRoute, ...]] = FreshCache(
            maxsize=1, check_seconds=lambda: settings.SYNTH_PROXY_LOOKUP_CHECK_SECONDS
        )
        self._refreshing = threading.Lock()

    def cached(self) -> Sequence[ModelRoute] | None:
        return self._current.get(self.KEY)

    def load(self) -> Sequence[ModelRoute]:
        """The routes, read again if stale. Reads the database: call it in a database phase."""
        routes = self._current.read_through(self.KEY, read=lambda: tuple(ModelRoute.objects.all().order_by("name")))
        assert routes is not None  # a tuple, empty at worst
        return routes

    def refresh_ahead(self) -> None:
        """Read the table again once it is past half the check interval (not while another
        thread reads it ahead), so calls keep finding it fresh. Reads the database."""
        half = settings.SYNTH_PROXY_LOOKUP_CHECK_SECONDS / 2
        age = self._current.age(self.KEY)
        if half <= 0 or age is None or age <= half or not self._refreshing.acquire(blocking=False):
            return
        try:
            started = self._current.read_started()
            self._current.put(self.KEY, tuple(ModelRoute.objects.all().order_by("name")), read_started=started)
        finally:
            self._refreshing.release()

    def clear(self) -> None:
        self._current.clear()


callers = CallerCache()
routes = RouteCache()


def caller_cached(*, secret: str | None) -> Caller | None:
    return callers.cached(secret=secret)


def caller_load(*, secret: str | None) -> Caller:
    return callers.load(secret=secret)


def callers_load(*, secrets: Sequence[str]) -> dict[str, Caller | AuthenticationFailed]:
    return callers.load_many(secrets=secrets)


def routes_cached() -> Sequence[ModelRoute] | None:
    return routes.cached()


def routes_load() -> Sequence[ModelRoute]:
    return routes.load()


def lookups_confirm_ahead() -> None:
    """Keep the callers in use and the route table fresh (see the module docstring); run by
    the phase that settles a call. A failure is logged, never raised: the entries then go
    stale and are read as before."""
    try:
        callers.confirm_ahead()
        routes.refresh_ahead()
    except Exception:  # noqa: BLE001 - the settle it follows has already been written
        logger.warning("proxy lookups: confirming ahead failed", exc_info=True)


def lookups_keep_fresh() -> None:
    """The proxy process's timer phase, every half interval (apps.proxy.exchange.lookups_tend):
    cache the credentials minted lately, then confirm ahead as a settle does, so an idle
    process's callers do not go stale either; and read the route table when it is not fresh
    (a process's start), so that no call waits for it. A failure is logged, never raised."""
    try:
        callers.minted_cache()
        if routes.cached() is None:
            routes.load()
    except Exception:  # noqa: BLE001 - the calls read what they lack, as before
        logger.warning("proxy lookups: reading ahead failed", exc_info=True)
    lookups_confirm_ahead()


def lookups_clear() -> None:
    """Forget every cached caller and route (tests that rewrite rows in place)."""
    callers.clear()
    routes.clear()
