"""The state map: a running shard's state rows per key group, counted now and then, for ``spec.split.by: state``.

A split by load divides the shard's recent input rows in half; a split by state divides its state rows (keys held),
which is what each child restores and keeps in memory. The state map is counted, not estimated: the rows Spark's
State Data Source reads at the last committed batch, grouped by key group, exactly what a drain's export would
write for that batch (:func:`spark_runtime.snapshot.export.count_state_rows`).

When: with the load map on (``spark.taskshard.keyGroupMetrics: "true"``), at most every
``spark.taskshard.stateMapSeconds`` (:data:`~spark_runtime.live.DEFAULT_STATE_MAP_SECONDS` by default; ``0``: never),
and only when a batch was committed since the last count. The count runs in a daemon thread of the driver (the
query keeps running; the poll loop never waits for it), one count at a time, never while a split child is catching
up (its state is not its own yet) or after a drain was requested. Its result goes to the live metrics
(``taskshard_shard_key_group_state_rows`` per bucket of key groups and ``taskshard_shard_state_map_batch``), where
the operator reads it at its next scrape. A count that fails is logged and retried at the next interval: the
operator then refuses a ``by: state`` split for want of a state map, and says so; the shard is not affected.

Cost: one State Data Source read of the state at one batch (about what a drain's export reads, without the write).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spark_runtime.shard_state import RunState, ShardIO

__all__ = ["StateMapper"]

log = logging.getLogger("taskshard.state_map")


class StateMapper:
    """Counts the state map of one shard runtime (see the module docstring).

    ``count(batch_id)`` returns the state rows per key group of committed ``batch_id`` (the runner passes
    :func:`~spark_runtime.snapshot.export.count_state_rows` bound to its session and checkpoint); ``publish``
    receives ``(batch_id, rows per key group)`` (the metrics' ``set_state_map``). ``interval`` 0 disables it.
    ``clock`` (monotonic seconds) is injectable for tests."""

    def __init__(
        self,
        interval: float,
        count: Callable[[int], dict[int, int]],
        publish: Callable[[int, dict[int, int]], None],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.interval = float(interval)
        self._count = count
        self._publish = publish
        self._clock = clock
        self._started_at: float | None = None
        self._thread: threading.Thread | None = None
        self.counted_batch: int | None = None
        """The batch of the last published state map (None: none yet)."""
        self.failures = 0

    @property
    def enabled(self) -> bool:
        return self.interval > 0

    def due(self, committed: int) -> bool:
        """Whether a count of ``committed`` should start now: enabled, a batch committed and not counted yet, no
        count running, and the interval passed since the last one started."""
        if not self.enabled or committed < 0 or committed == self.counted_batch:
            return False
        if self._thread is not None and self._thread.is_alive():
            return False
        return self._started_at is None or self._clock() - self._started_at >= self.interval

    def tick(self, committed: int, *, allowed: bool = True) -> bool:
        """Called from the runner's poll loop: start a count of ``committed`` in the background when it is
        :meth:`due` and ``allowed`` (not catching up, no drain requested). True when one started."""
        if not allowed or not self.due(committed):
            return False
        self._started_at = self._clock()
        self._thread = threading.Thread(target=self._run, args=(committed,), name="taskshard-state-map", daemon=True)
        self._thread.start()
        return True

    def _run(self, batch_id: int) -> None:
        began = time.monotonic()
        try:
            rows = self._count(batch_id)
        except Exception as exc:  # noqa: BLE001 - a failed count leaves the shard alone (see the module docstring)
            self.failures += 1
            log.warning("state map of batch %d not counted (retried in %.0f s): %s", batch_id, self.interval, exc)
            return
        self._publish(batch_id, rows)
        self.counted_batch = batch_id
        log.info(
            "state map of batch %d: %d state rows in %d key groups (%.1f s)",
            batch_id,
            sum(rows.values()),
            len(rows),
            time.monotonic() - began,
        )

    def wait(self, timeout: float | None = None) -> None:
        """Wait for a running count to end (tests; the drain does not wait: the thread is a daemon)."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)

    @staticmethod
    def for_shard(io: ShardIO, state: RunState, session: Callable[[], Any]) -> StateMapper:
        """The mapper of one shard runtime: counts with its session, plan and checkpoint every
        ``io.state_map_seconds``, publishes to its metrics."""
        from spark_runtime.snapshot.export import count_state_rows

        def count(batch_id: int) -> dict[int, int]:
            return count_state_rows(session(), io.config, state.plan, io.paths.checkpoint, batch_id)

        return StateMapper(io.state_map_seconds, count, io.metrics.set_state_map)
