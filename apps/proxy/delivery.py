"""What became of one sampled call's answer: recorded once, for the JSON and the streaming paths.

    sampling --stage()------> staged --delivered()--> delivered
    sampling --fail()-------> failed     (recorded as a call without an answer)
    sampling --stage() fails> failed     (nothing recorded: an answer goes out only once staged)
    sampling, staging or staged --abandon()--> abandoned (the client went away)

The interaction row is staged before the answer's last byte can reach the client (so
before message_stop, before the JSON body) and settled after it was sent or when the
client left. Delivered, failed and abandoned are final; `abandon()` in a final state does
nothing, so a path calls it whenever it stops without having finished. Each transition
changes the state before it awaits its write, so a cancellation during that write is not
taken for a second outcome.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from apps.proxy import calls, capture, lookups
from apps.proxy.db import PhaseBatches, db_phase
from apps.proxy.models import Delivery, Interaction

logger = logging.getLogger(__name__)

SAMPLING = "sampling"
STAGING = "staging"
STAGED = "staged"
DELIVERED = "delivered"
FAILED = "failed"
ABANDONED = "abandoned"
FINAL = (DELIVERED, FAILED, ABANDONED)


class CallDelivery:
    """The delivery state of one call whose sampling has begun (see the module docstring)."""

    def __init__(self, *, prepared: calls.Prepared) -> None:
        self.prepared = prepared
        self.state = SAMPLING
        self.interaction_id: str | None = None
        # The row as staged: settling it need not read it back.
        self._staged: Interaction | None = None
        self._staging: asyncio.Future[Any] | None = None

    def _leave(self, expected: str, to: str) -> None:
        if self.state != expected:
            raise RuntimeError(f"delivery of {self.prepared.ctx.request_id}: {self.state} -> {to}")
        self.state = to

    async def stage(self, *, completion: calls.Completion, total_ms: float) -> str:
        """Stage the sampled answer; returns the interaction id. A failed write leaves the
        delivery failed and raises: no answer may go out without its record."""
        rec = calls.capture_record(prepared=self.prepared, completion=completion, total_ms=total_ms)
        self._leave(SAMPLING, STAGING)
        # Shielded: a disconnect during the write must not leave a row we do not know of
        # (abandon() waits for the write and settles the row).
        self._staging = asyncio.ensure_future(db_phase(capture.interaction_stage)(rec=rec))
        try:
            interaction = await asyncio.shield(self._staging)
        except Exception:
            self.state = FAILED
            raise
        self.interaction_id, self._staged = interaction.id, interaction
        self.state = STAGED
        return interaction.id

    async def fail(self, *, error: str) -> None:
        """Sampling failed: record the call without an answer."""
        self._leave(SAMPLING, FAILED)
        await _record_unanswered(self.prepared, delivery=Delivery.FAILED, error=error)

    async def delivered(self) -> None:
        """The server has sent the whole answer (the stream's message_stop)."""
        self._leave(STAGED, DELIVERED)
        assert self.interaction_id is not None  # set with the state staged
        await _settle_shielded(interaction_id=self.interaction_id, delivery=Delivery.DELIVERED, staged=self._staged)

    def delivered_sync(self) -> None:
        """`delivered` for the JSON response's close() (synchronous, called once the last
        byte is sent); idempotent, as close() may be called more than once."""
        if self.state != STAGED:
            return
        assert self.interaction_id is not None  # set with the state staged
        self.state = DELIVERED
        _settle(interaction_id=self.interaction_id, delivery=Delivery.DELIVERED, staged=self._staged)

    async def abandon(self) -> None:
        """The client went away before the answer was delivered (a no-op once final)."""
        if self.state in FINAL:
            return
        was, self.state = self.state, ABANDONED
        if was == STAGING and self._staging is not None:
            try:
                self._staged = await self._staging
                self.interaction_id = self._staged.id
            except Exception:  # noqa: BLE001 - the write failed: record the call below
                self.interaction_id = None
        if self.interaction_id is not None:
            await _settle_shielded(
                interaction_id=self.interaction_id,
                delivery=Delivery.CLIENT_DISCONNECTED,
                error="client disconnected",
                staged=self._staged,
            )
        else:
            await _record_unanswered(self.prepared, delivery=Delivery.CLIENT_DISCONNECTED, error="client disconnected")


def _settle(*, interaction_id: str, delivery: str, error: str = "", staged: Interaction | None = None) -> None:
    """Settle the interaction; then, in the same phase, its answer being out, keep the
    process's cached callers and routes fresh (apps.proxy.lookups), so the next calls
    authenticate without a phase of their own."""
    capture.interaction_settle(interaction_id=interaction_id, delivery=delivery, error=error, staged=staged)
    lookups.lookups_confirm_ahead()


def _settle_many(*, settlements: list[capture.Settlement]) -> None:
    """`_settle` for the settles that gathered while the last write ran (see `_SETTLES`)."""
    capture.interactions_settle(settlements=settlements)
    lookups.lookups_confirm_ahead()


async def _settles_phase(settlements: list[capture.Settlement]) -> dict[capture.Settlement, None]:
    await db_phase(_settle_many)(settlements=settlements)
    return dict.fromkeys(settlements)


# The settles of one event loop, written together: one write runs at a time, and the calls
# whose answers went out while it ran are settled by the next, in one database phase and
# one UPDATE per outcome (apps.proxy.capture.interactions_settle). Each call's settle was a
# phase of its own before: a thread hop, a claim and a look at the cached callers per call,
# queued for the process's few database slots behind the other calls' authentication and
# staging. A settle begins once the answer's last event is out; the response still ends
# only when its row is settled, as before, and may now wait for the write running ahead of
# its own (one phase, against one per call before).
#
# The write is the batch's own task, which cancelling a response's task cannot stop. A
# client that closes the connection as soon as it has the protocol's last event (Codex
# returns on response.completed without reading to the end of the stream) gets the
# response's task cancelled while its settle waits; were the write that task's, it would
# never start and the row would stay pending, so the attempt's last call would be
# unsettled when the learner reads it.
_SETTLES = PhaseBatches(run=_settles_phase)


async def _settle_shielded(
    *, interaction_id: str, delivery: str, error: str = "", staged: Interaction | None = None
) -> None:
    """Settle with the other calls of this event loop (`_SETTLES`), in a write that
    cancelling the response's task cannot stop."""
    settlement = capture.Settlement(interaction_id=interaction_id, delivery=delivery, error=error, staged=staged)
    await asyncio.shield(_SETTLES.join(settlement))


async def _record_unanswered(prepared: calls.Prepared, *, delivery: str, error: str) -> None:
    """Record a call that produced no delivered answer (failed or abandoned)."""
    try:
        rec = calls.capture_record(prepared=prepared, completion=None, error=error)
        interaction = await db_phase(capture.interaction_stage)(rec=rec)
        await db_phase(capture.interaction_settle)(
            interaction_id=interaction.id, delivery=delivery, error=error, staged=interaction
        )
    except Exception:  # noqa: BLE001 - never turn a recording failure into a second error
        logger.exception("could not record an unfinished call %s", prepared.ctx.request_id)
