"""What one micro-batch writes: the shard query's ``foreachBatch`` (:meth:`BatchOutput.write`).

1. The fault hook (:mod:`spark_runtime.faults`), the fence check, then the source's guard: a mapping that no
   longer holds stops the shard before anything of the batch is written or committed.
2. A Python processor with event time: the batch's late records to ``late-b<batch>.jsonl``
   (:mod:`spark_runtime.late`; a replay rewrites the same file, counted once).
3. The results to the sink by the hand-over's emission rule (:class:`~spark_runtime.protocol.Emission`): into
   nothing while a child catches up; in the batch that reaches the parent's final positions only what its records
   at or after them produced; else everything. Whatever the rule keeps, the batch's stateful plan runs in full
   (:func:`run_in_full`): Spark commits a state store only in a task that executed it, yet records the batch in
   its commit log all the same.
4. A builtin window: the batch's late records (after its output: Spark's count of dropped rows is complete then).
5. The fence check again, right before Spark commits the batch.

A problem the guard or a fence check raises is kept in :attr:`BatchOutput.stop_problem`: the query fails on it,
and the runner raises it instead of retrying (it is not transient).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from spark_runtime import faults
from spark_runtime.config import ConfigError
from spark_runtime.pipeline import results_past_fence
from spark_runtime.problems import EnvironmentProblem
from spark_runtime.protocol import Emission
from spark_runtime.sources import GuardsBatches, ReadsRanges
from spark_runtime.windows import WindowLateFinder

if TYPE_CHECKING:
    from spark_runtime.shard_state import RunState, ShardIO

__all__ = ["BatchOutput", "run_in_full"]

GUARD_INTERVAL_SECONDS = 10.0
"""How often a guarding source (:class:`~spark_runtime.sources.GuardsBatches`) is asked whether its mapping still
holds while no batch runs (Kafka ``assign`` never sees an added partition, so no batch would notice)."""


@contextmanager
def run_in_full(df: Any) -> Iterator[Any]:
    """``df`` (a batch's result DataFrame) executed in full into nothing, cached; yields the cached frame to filter
    and write, and drops the cache after the block. Every stateful partition of the batch commits its state store
    here, however little of ``df`` the block keeps: a semi join with an empty local relation, say, which the
    optimizer replaces with an empty relation that never runs the stateful side (Spark would then record the batch
    as committed without its state, and every later start would fail to load it)."""
    cached = df.persist()
    try:
        cached.write.format("noop").mode("overwrite").save()
        yield cached
    finally:
        cached.unpersist()


class BatchOutput:
    """The ``foreachBatch`` of one shard's query, over its I/O and run state: ``emission(batch)`` is the hand-over's
    rule for the batch, ``positions_at(batch)`` the committed positions, ``session()`` the SparkSession; the query
    is found by ``query_name`` while it is still starting."""

    def __init__(
        self,
        io: ShardIO,
        run: RunState,
        emission: Callable[[int], Emission],
        positions_at: Callable[[int], dict[str, Any]],
        session: Callable[[], Any],
        query_name: str,
    ) -> None:
        self.io = io
        self.run = run
        self.emission = emission
        self.positions_at = positions_at
        self.session = session
        self.query_name = query_name
        self.stop_problem: EnvironmentProblem | None = None
        """Set when the source's guard or a fence check stopped a batch (e.g. ``PartitionCountChanged``)."""
        self.window_late: WindowLateFinder | None = None
        """A builtin window's late-record finder, made at its first batch (the stream's context exists then)."""
        self._fail_batch = faults.fail_batch()
        self._guarded_at = time.monotonic()

    def write(self, df: Any, batch_id: int) -> None:
        """``foreachBatch`` (see the module docstring)."""
        batch_id = int(batch_id)
        if self._fail_batch is not None and batch_id == self._fail_batch:
            raise RuntimeError(f"fault injection: batch {batch_id} fails ({faults.FAIL_BATCH_ENV})")
        source, plan = self.io.source, self.run.plan
        with self._stopping_on_problem():
            self.io.fence.check(f"batch {batch_id}'s output")
            faults.pause_in_batch(batch_id)  # fencing tests only (spark_runtime.faults)
            if isinstance(source, GuardsBatches):
                source.before_batch(self.run.spark, batch_id)
        cached = None
        if plan.kind == "python" and plan.event_time is not None:
            cached = df.persist()  # the stateful operator runs once for the late records and the results
            df = self._write_late(cached, batch_id)
        try:
            self._emit(df, batch_id)
        finally:
            if cached is not None:
                cached.unpersist()
        if plan.window is not None:
            self._write_window_late(batch_id)
        with self._stopping_on_problem():
            self.io.fence.check(f"Spark commits batch {batch_id}")

    def guard_idle(self, next_batch: int) -> None:
        """Every :data:`GUARD_INTERVAL_SECONDS` while no batch runs: the source's guard, as before ``next_batch``.
        Raises (and keeps) the problem when its mapping no longer holds."""
        source = self.io.source
        if not isinstance(source, GuardsBatches) or time.monotonic() - self._guarded_at < GUARD_INTERVAL_SECONDS:
            return
        self._guarded_at = time.monotonic()
        with self._stopping_on_problem():
            source.before_batch(self.run.spark, next_batch)

    @contextmanager
    def _stopping_on_problem(self) -> Iterator[None]:
        """Keep an :class:`EnvironmentProblem` raised in the block in :attr:`stop_problem`, and let it through."""
        try:
            yield
        except EnvironmentProblem as problem:
            self.stop_problem = problem
            raise

    def _write_late(self, df: Any, batch_id: int) -> Any:
        """The batch's late records (rows with ``_late``, :mod:`spark_runtime.engine.stateful`) written; returns
        the result rows."""
        from pyspark.sql import functions as F

        from spark_runtime.engine.step import LATE

        letters = [r[0] for r in df.where(F.col(LATE).isNotNull()).select(LATE).collect()]
        self._write_late_letters(batch_id, letters)
        return df.where(F.col(LATE).isNull()).drop(LATE)

    def _write_late_letters(self, batch_id: int, letters: list[Any]) -> None:
        if letters and self.io.late_letters is not None:
            self.io.fence.check(f"batch {batch_id}'s late records")
            self.io.late_letters.write(batch_id, letters)

    def _emit(self, df: Any, batch_id: int) -> None:
        """The batch's results to the sink by the emission rule."""
        emission = self.emission(batch_id)
        if emission == Emission.NONE:
            # Catching up: the parent emitted this input (spark_runtime.handover). The batch still runs to the
            # end (Spark commits the state stores only of a DataFrame executed in full), into nothing.
            df.write.format("noop").mode("overwrite").save()
            return
        if emission == Emission.FROM_FENCE and self.run.plan.kind == "builtin":
            with run_in_full(df) as executed:
                self.io.sink(self._results_past_fence(executed, batch_id), batch_id)
            return
        self.io.sink(df, batch_id)

    def _results_past_fence(self, df: Any, batch_id: int) -> Any:
        """A builtin aggregation's results of the batch that reaches its parent's final positions, kept for the
        keys with a record at or after them (the batch's range read again; a Python processor's held records
        produce no output in the first place: :func:`spark_runtime.engine.step.split_held`)."""
        source, context = self.io.source, self.run.source_context
        assert context is not None and isinstance(source, ReadsRanges)
        start, end = self.positions_at(batch_id - 1), self.positions_at(batch_id)
        records = source.read_range(self.session(), context, start, end)
        boundary = self.run.restore.boundary if self.run.restore is not None else None
        return results_past_fence(self.io.config, df, records, boundary)

    def _write_window_late(self, batch_id: int) -> None:
        """A builtin window batch's late records (before the commit, so a replay rewrites the same file)."""
        if self.window_late is None:
            source, context = self.io.source, self.run.source_context
            assert context is not None
            if not isinstance(source, ReadsRanges):  # journal and Kafka both can
                raise ConfigError([f"processor.window: the {source.kind} source cannot read a batch's range again"])
            self.window_late = WindowLateFinder(self.io.config, self.run.plan, source, context, self.positions_at)
        spark = self.run.spark
        query = self.run.query or next(q for q in spark.streams.active if q.name == self.query_name)
        self._write_late_letters(batch_id, self.window_late.letters(spark, query, batch_id))
