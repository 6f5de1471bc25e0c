"""Status machines: a record's allowed moves, each applied as a claim.

A move is one conditional UPDATE, ``filter(pk=..., status__in=<allowed from>).update(status=to,
...)``. One row updated means this caller made the move; none means the record was not in a
status the move may start from: someone else got there first, or the move is not allowed
from where the record is. Callers never read a status and then write another: the database
decides, so two concurrent claims of the same move cannot both win.

Each app wraps its tables in one transition function per record (``run_transition``,
``trial_transition``, ``update_transition``, ...) that writes the move's event in the same
transaction; those functions are the only writers of a status.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from django.db import connection, models, transaction

from apps.core.bulk import row_claim, rows_claim


class TransitionNotAllowed(ValueError):
    """A move no row of the table allows (a programming error, not a lost race)."""


class TransitionTable:
    """``moves`` maps each from-status to the statuses it may move to."""

    def __init__(self, *, model: type[models.Model], moves: Mapping[str, Iterable[str]], field: str = "status") -> None:
        self.model = model
        self.field = field
        self.moves = {str(source): frozenset(str(t) for t in targets) for source, targets in moves.items()}
        sources: dict[str, set[str]] = {}
        for source, targets in self.moves.items():
            for target in targets:
                sources.setdefault(target, set()).add(source)
        self._sources = {target: frozenset(s) for target, s in sources.items()}

    def allows(self, *, source: str, to: str) -> bool:
        return to in self.moves.get(source, frozenset())

    def sources_of(self, *, to: str, source: Iterable[str] | None = None) -> frozenset[str]:
        """The statuses a move to ``to`` may start from, narrowed to ``source`` if given."""
        allowed = self._sources.get(str(to), frozenset())
        if source is not None:
            narrowed = frozenset(str(s) for s in source)
            if narrowed - allowed:
                raise TransitionNotAllowed(
                    f"{self.model.__name__}.{self.field}: {sorted(narrowed - allowed)} may not move to {to!r}"
                )
            allowed = narrowed
        if not allowed:
            raise TransitionNotAllowed(f"{self.model.__name__}.{self.field}: nothing moves to {to!r}")
        return allowed

    def claim(
        self,
        *,
        pk: Any,
        to: str,
        source: Iterable[str] | None = None,
        values: Mapping[str, Any] | None = None,
        where: Mapping[str, Any] | None = None,
        instance: models.Model | None = None,
    ) -> bool:
        """Move one row; True if this call moved it. ``where`` adds conditions (e.g. a
        holder); ``instance``, if given, is updated in memory to match."""
        sources = self.sources_of(to=to, source=source)
        changes = {self.field: to, **(values or {})}
        # One prepared statement on PostgreSQL (apps.core.bulk.row_claim); else the ORM's update.
        rows = row_claim(
            model=self.model, pk=pk, field=self.field, sources=sources, where=dict(where or {}), changes=changes
        )
        if rows is None:
            filters = {"pk": pk, f"{self.field}__in": sources, **(where or {})}
            rows = self.model._default_manager.filter(**filters).update(**changes)
        moved = rows == 1
        if moved and instance is not None:
            _reflect(instance=instance, changes=changes)
        return moved

    def claim_many(
        self,
        *,
        pks: Iterable[Any],
        to: str,
        source: Iterable[str] | None = None,
        values: Mapping[str, Any] | None = None,
    ) -> int:
        """Move many rows with one UPDATE; returns how many moved. To know which ones,
        lock the rows first (``select_for_update``) in the same transaction."""
        sources = self.sources_of(to=to, source=source)
        return self.model._default_manager.filter(pk__in=list(pks), **{f"{self.field}__in": sources}).update(
            **{self.field: to, **(values or {})}
        )

    def claim_each(
        self,
        *,
        pks: Iterable[Any],
        to: str,
        source: Iterable[str] | None = None,
        values: Mapping[str, Any] | None = None,
    ) -> list[Any]:
        """Move many rows with one UPDATE; returns the keys of those this call moved (each
        row moved once, by whichever claim got there first). On PostgreSQL one prepared
        ``UPDATE ... RETURNING`` (apps.core.bulk.rows_claim); else the rows that may move
        are locked and read, then moved, in one transaction, or, on a database without row
        locks (SQLite), claimed one by one (each claim's row count says whether it moved)."""
        sources = self.sources_of(to=to, source=source)
        keys = list(dict.fromkeys(pks))
        if not keys:
            return []
        changes = {self.field: to, **(values or {})}
        moved = rows_claim(model=self.model, pks=keys, field=self.field, sources=sources, changes=changes)
        if moved is not None:
            return moved
        if not connection.features.has_select_for_update:
            return [key for key in keys if self.claim(pk=key, to=to, source=sources, values=values)]
        with transaction.atomic():
            rows = self.model._default_manager.select_for_update().filter(pk__in=keys, **{f"{self.field}__in": sources})
            moved = list(rows.values_list("pk", flat=True))
            self.model._default_manager.filter(pk__in=moved).update(**changes)
        return moved


def _reflect(*, instance: models.Model, changes: Mapping[str, Any]) -> None:
    computed = []
    for name, value in changes.items():
        if hasattr(value, "resolve_expression"):  # F(), Coalesce(): the database computed it
            computed.append(name)
        else:
            setattr(instance, name, value)
    if computed:
        instance.refresh_from_db(fields=computed)
