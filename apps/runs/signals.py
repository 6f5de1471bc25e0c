"""What execution announces, for apps built on top of it.

Dependencies point one way (``runs`` never imports ``training``): training learns that a
train run is ready and that a sampling group has settled through these signals, sent after
the transaction that made them true has committed. Receivers must only enqueue work.
"""

from __future__ import annotations

from django.dispatch import Signal

# run_id: a queued train run was started; its learner must make the first batch.
train_run_started = Signal()
# run_id, group_id, step: every attempt of the group has ended (assessed, failed, lost...).
group_settled = Signal()
