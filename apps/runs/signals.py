"""What execution announces, for apps built on top of it.

Dependencies point one way (``runs`` never imports ``training``): training learns that a
train run is ready and that a sampling group has settled through these signals, sent after
the transaction that made them true has committed. Receivers must only enqueue work.
"""

from __future__ import annotations

from django.dispatch import Signal

# run_id: a queued train run was started; its learner must make the first batch.
train_run_started = Signal()
# run_id, group_id, step, kind: every attempt of the group has ended (assessed, failed, lost...).
group_settled = Signal()
# now, limit: the sweeper's tick (apps.runs.sweeper). Receivers re-drive their own app's
# stuck work (bounded by `limit` per kind), write why on each run they touch, and return
# {what: count} for the tick's log line.
sweep_tick = Signal()
