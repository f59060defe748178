"""The directory sink's publish-on-commit without Spark: which pending files a stop publishes or drops, and what
the project's reader reads (published batches, plus pending ones the recovery log says are committed)."""

from __future__ import annotations

import json

import pytest

from spark_runtime.layout import SinkPaths, parse_batch_file_name, write_json_atomic
from spark_runtime.results import final_results, read_sink
from spark_runtime.sink import DirectorySinkWriter

pytestmark = pytest.mark.unit

SHARD = "t-0-16"


def write_pending(paths: SinkPaths, batch: int, rows: dict[str, int]) -> None:
    path = paths.pending_file(batch, "jsonl")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "".join(
            json.dumps({"key": k, "key_group": 0, "shard": paths.shard, "result": v, "batch": batch}) + "\n"
            for k, v in rows.items()
        )
    )


def test_batch_file_names(tmp_path):
    paths = SinkPaths.of(tmp_path, SHARD)
    assert paths.pending_file(3, "parquet") == tmp_path / f"shard={SHARD}" / "_pending" / "batch-3.parquet"
    assert parse_batch_file_name("batch-12.jsonl") == (12, "jsonl")
    for other in (".batch-3-ab12cd34", ".batch-3.jsonl.tmp-1-ab", "batch-x.jsonl", "batch-3.csv", "_pending"):
        assert parse_batch_file_name(other) is None


def test_publish_committed_publishes_up_to_the_commit_and_drops_later_batches(tmp_path):
    paths = SinkPaths.of(tmp_path, SHARD)
    writer = DirectorySinkWriter(paths, "jsonl", SHARD)
    assert writer.publish_committed(5) == [], "nothing written yet"
    for batch in (0, 1, 2):
        write_pending(paths, batch, {"a": batch})
    (paths.pending_dir / ".batch-2-0123abcd").mkdir()  # Spark's temporary output of a killed write
    (paths.pending_dir / ".batch-2.jsonl.tmp-7-0123abcd").write_text("torn")

    assert writer.publish_committed(1) == [0, 1]
    assert sorted(p.name for p in paths.results_dir.glob("batch-*")) == ["batch-0.jsonl", "batch-1.jsonl"]
    assert list(paths.pending_dir.iterdir()) == [], "batch 2 never committed: dropped; temporaries removed"
    assert writer.publish_committed(1) == [], "idempotent"
    assert sorted(r["batch"] for r in read_sink(tmp_path)) == [0, 1]


def test_reader_adds_committed_pending_batches_only(tmp_path):
    sink, storage = tmp_path / "out", tmp_path / "state"
    paths = SinkPaths.of(sink, SHARD)
    writer = DirectorySinkWriter(paths, "jsonl", SHARD)
    write_pending(paths, 0, {"a": 1, "b": 1})
    writer.publish_committed(0)
    write_pending(paths, 1, {"a": 2})  # committed, not yet published (the shard's next batch has not started)
    write_pending(paths, 2, {"a": 99})  # written, not committed
    shard_dir = storage / "t" / "shards" / SHARD
    write_json_atomic(shard_dir / "lineage.json", {"parent": None, "keyGroups": {"start": 0, "end": 16}})
    for batch in (0, 1):
        (shard_dir / "checkpoint" / "commits").mkdir(parents=True, exist_ok=True)
        (shard_dir / "checkpoint" / "commits" / str(batch)).write_text("v1\n{}\n")

    assert sorted(r["batch"] for r in read_sink(sink)) == [0, 0], "a plain read: published batches only"
    assert sorted(r["batch"] for r in read_sink(sink, {SHARD: 1})) == [0, 0, 1]
    assert final_results(sink, storage, "t") == {"a": 2, "b": 1}
    lineage = {SHARD: {"parent": None, "drainedBatch": None}}
    assert final_results(sink, lineage=lineage) == {"a": 1, "b": 1}, "without the recovery log: published only"
    writer.publish_committed(1)
    assert final_results(sink, storage, "t") == {"a": 2, "b": 1}, "publishing changes nothing for the reader"


def test_a_fenced_writers_publish_never_touches_the_current_writers_pending_batches(tmp_path):
    """A runtime paused across its replacement's start wakes up in foreachBatch(N) and publishes below N: its own
    epoch's files only. The replacement's committed-but-pending batch N (and its in-flight N + 1) survive, and the
    replacement adopts what the stale one left of earlier batches."""
    paths = SinkPaths.of(tmp_path, SHARD)
    stale = DirectorySinkWriter(paths, "jsonl", SHARD, epoch=1)
    current = DirectorySinkWriter(paths, "jsonl", SHARD, epoch=2)
    write_pending(paths, 3, {"a": 3})  # an older runtime's layout, right in _pending/
    for batch in (4, 5):  # the stale runtime's attempts: 4 committed, 5 never
        path = paths.pending_file(batch, "jsonl", 1)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(
            json.dumps({"key": "a", "key_group": 0, "shard": SHARD, "result": batch, "batch": batch}) + "\n"
        )
    for batch in (5, 6):  # the replacement replayed 5 and committed it; 6 is being written
        path = paths.pending_file(batch, "jsonl", 2)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(
            json.dumps({"key": "b", "key_group": 0, "shard": SHARD, "result": batch, "batch": batch}) + "\n"
        )

    assert stale.publish_committed(4) == [3, 4], "the stale runtime publishes batches up to its own commit"
    assert paths.pending_file(5, "jsonl", 2).exists() and paths.pending_file(6, "jsonl", 2).exists(), (
        "a later epoch's pending batches are not the stale runtime's to drop"
    )
    assert current.publish_committed(5) == [5]
    assert not paths.epoch_pending_dir(1).exists(), "the earlier epoch's directory adopted and removed"
    assert sorted(r["batch"] for r in read_sink(tmp_path)) == [3, 4, 5]
    assert not paths.pending_file(6, "jsonl", 2).exists(), "its own uncommitted batch: dropped (rewritten next)"
