"""A standby child's rehearsal: run the restore plan once on a tiny synthetic snapshot, so that the real restore
finds a warm JVM.

A split child's pod starts while its parent is still draining (the operator creates children at the drain
request). Until the parent's drain summary exists the child must not process anything, but it can pay the
costs every first micro-batch pays in a fresh JVM: class loading and JIT of Spark's streaming and aggregation
code, code generation for this plan's shape, the RocksDB state store's native library, Python worker start-up
for the seed reader (and the ``applyInPandasWithState`` function), and the sink's ``foreachBatch`` callback.
Measured on 2 cores: a cold child's first batch takes 13-20 s from query start, a rehearsed one's 4-6 s.

The rehearsal is the child's own plan (:func:`spark_runtime.pipeline.build_output_frame`, the same processor,
key-group range and seed mode) over:

- a synthetic seed: one key group (the range's first) holding one state row (key ``rehearsal``, values null
  or zero), written with pyarrow in the snapshot layout;
- an empty journal (events are never invented: no user processor code runs on made-up input; with no
  events the Python function only installs the seed state);
- a directory sink, checkpoint and dead-letter directory, all under a scratch directory that is removed after.

It runs one ``availableNow`` batch. It never touches the shard's storage, source or sink, and its failure is
logged and ignored: a rehearsal only saves time. It is cut short (the query stopped) as soon as ``should_stop()``
says so, typically because the parent has drained: the child then restores at once, with whatever the
rehearsal warmed so far, rather than finishing a rehearsal first.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from spark_runtime.config import ShardConfig
from spark_runtime.layout import SinkPaths
from spark_runtime.pipeline import Plan, build_output_frame
from spark_runtime.protocol import DRAIN_MARKER
from spark_runtime.snapshot.layout import key_group_dir
from spark_runtime.sources import SourceContext
from spark_runtime.sources.journal import JournalSource, partition_file
from spark_runtime.storage import location

__all__ = ["REHEARSAL_KEY", "rehearse", "write_synthetic_snapshot"]

log = logging.getLogger("taskshard.shard")

REHEARSAL_KEY = "rehearsal"
TIMEOUT_SECONDS = 300.0


def write_synthetic_snapshot(state_dir: Path, plan: Plan, key_group: int) -> Path:
    """One Parquet file ``<state_dir>/key_group=<key_group>/part-0.parquet`` with one state row for
    :data:`REHEARSAL_KEY` in the snapshot schema of ``plan`` (builtin value 0, Python state columns null)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from spark_runtime.records import arrow_type

    columns: dict[str, Any] = {"key": pa.array([REHEARSAL_KEY], pa.string())}
    for name, ddl in plan.state_columns:
        typ = arrow_type(ddl)
        columns[name] = pa.array([0], typ) if plan.kind == "builtin" else pa.nulls(1, typ)
    directory = key_group_dir(state_dir, key_group)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "part-0.parquet"
    pq.write_table(pa.table(columns), path)
    return path


def rehearse(
    spark: Any,
    config: ShardConfig,
    plan: Plan,
    scratch: Path | None = None,
    should_stop: Callable[[], bool] = lambda: False,
) -> float | None:
    """Run the rehearsal (see the module docstring); return its seconds, or None when it failed (logged) or was
    cut short by ``should_stop`` (polled every 0.2 s)."""
    t0 = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix=f"taskshard-rehearsal-{config.shard}-", dir=scratch))
    query = None
    try:
        query = _start_rehearsal(spark, config, plan, root)
        deadline = time.monotonic() + TIMEOUT_SECONDS
        while not query.awaitTermination(0.2):
            if should_stop():
                query.stop()
                log.info("standby: rehearsal cut short after %.1fs (the parent has drained)", time.monotonic() - t0)
                return None
            if time.monotonic() > deadline:
                raise TimeoutError(f"no batch within {TIMEOUT_SECONDS:.0f}s")
        if query.exception() is not None:
            raise RuntimeError(str(query.exception()).splitlines()[0][:300])
        seconds = time.monotonic() - t0
        log.info("standby: rehearsed the restore plan in %.1fs (the JVM is warm)", seconds)
        return seconds
    except Exception as exc:  # noqa: BLE001 - a rehearsal only saves time; the real restore reports real errors
        log.warning("standby: the rehearsal failed (%s); the restore runs cold", str(exc).splitlines()[0][:300])
        return None
    finally:
        if query is not None and query.isActive:
            try:
                query.stop()
            except Exception:  # noqa: BLE001
                pass
        shutil.rmtree(root, ignore_errors=True)


def _start_rehearsal(spark: Any, config: ShardConfig, plan: Plan, root: Path) -> Any:
    """The rehearsal's query under ``root``: an empty one-partition journal, a synthetic snapshot of the first key
    group as the seed, the shard's own plan, a directory sink; one batch (``availableNow``)."""
    journal = root / "journal"
    journal.mkdir()
    (journal / partition_file(0)).touch()
    state = root / "seed"
    write_synthetic_snapshot(state, plan, config.key_groups.start)
    source = JournalSource(str(journal), 1)
    ctx = SourceContext(
        shard=config.shard,
        max_key_groups=config.max_key_groups,
        range_start=config.key_groups.start,
        range_end=config.key_groups.end,
        record_spec=plan.record_spec,
        dead_letter_dir=root / "dead-letters",
        drain_marker=location(str(root / DRAIN_MARKER)),
    )
    events = source.stream(spark, ctx)
    seed = {
        "slices": [(location(str(state)), config.key_groups.start, config.key_groups.end)],
        "report_dir": location(str(root / "restore")),
    }
    out = build_output_frame(spark, config, plan, events, seed)
    from spark_runtime.sink import DirectorySinkWriter

    sink = DirectorySinkWriter(SinkPaths.of(str(root / "sink"), config.shard), "jsonl", config.shard)
    return (
        out.writeStream.outputMode("update")
        .queryName(f"taskshard-rehearsal-{config.shard}")
        .option("checkpointLocation", str(root / "checkpoint"))
        .foreachBatch(sink)
        .trigger(availableNow=True)
        .start()
    )
