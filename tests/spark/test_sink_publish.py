"""The directory sink publishes committed batches only: a plain ``spark.read`` (or pandas) read of the sink
counts each result once, and the files of a batch that never committed are never visible as results.

Spark calls ``foreachBatch(N)`` before it commits batch N, so the sink writes ``_pending/batch-N`` and renames
it into ``batch-N`` once N is known committed (see :mod:`spark_runtime.sink`). An interrupted batch (a drain that
stopped mid-batch, whose children redo it) is simulated by calling the shard's own writer for batch N + 1 after
its query stopped at N: the files are exactly what ``foreachBatch`` leaves before a commit that never comes.
"""

from __future__ import annotations

import pytest

from spark_runtime.produce import generate_events

from .conftest import Reference, wait_caught_up

pytestmark = pytest.mark.spark

SHARD = "orders-0-16"


def plain_read(spark, sink, fmt: str, *, recursive: bool = False) -> list[dict]:
    """Spark's own reader over the whole sink directory, as any user would point it there."""
    reader = spark.read.option("recursiveFileLookup", "true") if recursive else spark.read
    df = reader.json(str(sink)) if fmt == "jsonl" else reader.parquet(str(sink))
    return [r.asDict() for r in df.select("key", "result", "batch").collect()]


def results_frame(spark, rows: list[tuple[str, int]]):
    """A frame shaped like the aggregation's output, as ``foreachBatch`` receives it."""
    return spark.createDataFrame([(k, 0, v) for k, v in rows], "key string, key_group int, result long")


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_writer_publishes_only_committed_batches(fmt, tmp_path, shard_spark):
    import pandas as pd

    from spark_runtime.layout import SinkPaths
    from spark_runtime.results import read_sink
    from spark_runtime.sink import DirectorySinkWriter

    sink = tmp_path / "out"
    paths = SinkPaths.of(sink, SHARD)
    writer = DirectorySinkWriter(paths, fmt, SHARD)

    writer(results_frame(shard_spark, [("a", 1), ("b", 1)]), 0)
    assert not list(paths.results_dir.glob("batch-*")), "batch 0 is not committed yet: nothing visible"
    assert paths.pending_file(0, fmt).is_file()
    writer(results_frame(shard_spark, [("a", 2)]), 1)  # Spark committed 0 before it ran 1
    assert paths.batch_file(0, fmt).is_file() and not paths.pending_file(0, fmt).exists()
    # Batch 2 is written (which publishes 1), then the shard stops before Spark commits it (a drain's stop).
    writer(results_frame(shard_spark, [("a", 1000), ("c", 1000)]), 2)
    assert paths.batch_file(1, fmt).is_file()
    assert writer.publish_committed(1) == []
    assert {p.name for p in paths.results_dir.iterdir()} == {f"batch-0.{fmt}", f"batch-1.{fmt}", "_pending"}
    assert not list(paths.pending_dir.iterdir()), "the interrupted batch's file is gone, not published"
    assert writer.publish_committed(1) == [], "idempotent"

    def key(r):
        return r["key"], r["batch"]

    expected = [{"key": "a", "result": 1, "batch": 0}, {"key": "a", "result": 2, "batch": 1}]
    expected.append({"key": "b", "result": 1, "batch": 0})

    assert sorted(plain_read(shard_spark, sink, fmt), key=key) == expected
    assert sorted(plain_read(shard_spark, sink, fmt, recursive=True), key=key) == expected
    assert sorted(({k: r[k] for k in ("key", "result", "batch")} for r in read_sink(sink)), key=key) == expected
    if fmt == "parquet":  # pandas (pyarrow datasets) over the directory skips "_pending" as well
        # partitioning=None: every record carries its "shard" column, which pyarrow would not merge with the
        # "shard=<name>" directory's dictionary-typed partition column of the same name.
        frame = pd.read_parquet(sink, columns=["key", "result", "batch"], partitioning=None)
        assert sorted(frame.to_dict("records"), key=key) == expected

    # A replay of uncommitted batch 2 (a restart from the recovery log) rewrites it pending; committing it
    # publishes exactly that content.
    writer(results_frame(shard_spark, [("a", 1000), ("c", 1000)]), 2)
    assert writer.publish_committed(2) == [2]
    assert len(plain_read(shard_spark, sink, fmt)) == 5


def test_shard_output_read_plainly_equals_the_project_reader(make_task, shard_spark):
    """A real shard, several micro-batches: while running, the sink shows every committed batch and only those
    (an idle shard's last one too: published within a poll of its commit), and the project's reader agrees;
    stopped at batch N with batch N + 1 written but never committed (what a split's drain leaves when it has to
    stop mid-batch), the plain read and the project's reader agree with the reference, and no file of batch N + 1
    remains."""
    from spark_runtime.checkpoint import last_committed_batch
    from spark_runtime.results import read_sink
    from spark_runtime.shard import ShardRunner

    env = make_task(conf={"spark.taskshard.maxBytesPerTrigger": "3000"})  # a few small batches
    ref = Reference("count")
    events = list(generate_events(200, 20, seed=21))
    env.produce(events)
    ref.add_all(events)
    runner = ShardRunner(env.config(0, 16), shard_spark)
    runner.start()
    wait_caught_up(env, [runner])
    paths = runner.sink.paths
    committed = last_committed_batch(runner.paths.checkpoint)
    assert committed >= 1, "several micro-batches"
    visible = {int(r["batch"]) for r in plain_read(shard_spark, env.sink, "jsonl")}
    assert visible and max(visible) == committed, "a running shard shows every committed batch, and only those"
    assert latest_per_key(plain_read(shard_spark, env.sink, "jsonl")) == ref.results, (
        "an idle shard's last batch is visible to a plain read (published within a poll of its commit)"
    )
    assert env.results() == ref.results, "the project's reader also sees the committed, unpublished batch"

    # The query stops at batch N; batch N + 1 was written by foreachBatch but never committed.
    runner.query.stop()
    n = last_committed_batch(runner.paths.checkpoint)
    runner.sink(results_frame(shard_spark, [(k, 10**6) for k in ref.results]), n + 1)
    assert paths.pending_file(n + 1, "jsonl", runner.fence.epoch).is_file(), "in its writer epoch's directory"
    assert max(int(r["batch"]) for r in plain_read(shard_spark, env.sink, "jsonl")) <= n
    summary = runner.drain()
    assert summary["batchId"] == n
    assert not paths.pending_file(n + 1, "jsonl", runner.fence.epoch).exists()
    assert not paths.batch_file(n + 1, "jsonl").exists()
    assert not list(paths.pending_dir.glob("**/batch-*")), "a drained shard leaves nothing pending"

    plain = plain_read(shard_spark, env.sink, "jsonl")
    published = {int(f.stem.split("-")[1]) for f in paths.results_dir.glob("batch-*.jsonl")}
    assert {int(r["batch"]) for r in plain} == published and max(published) <= n
    assert len(plain) == len(read_sink(env.sink)), "each published record counted once"
    assert latest_per_key(plain) == env.results() == ref.results


def latest_per_key(records) -> dict:
    """One shard's output read plainly: a key's latest result is the one of its highest batch."""
    latest: dict[str, tuple[int, int]] = {}
    for r in records:
        if r["key"] not in latest or r["batch"] > latest[r["key"]][0]:
            latest[r["key"]] = (r["batch"], r["result"])
    return {k: v for k, (_, v) in latest.items()}
