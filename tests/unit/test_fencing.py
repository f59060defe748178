"""The writer fence (spark_runtime.fencing) and the exclusive create it rests on, on a local directory.

The same code on S3 (conditional puts against MinIO) is covered by tests/integration/test_kafka_s3_shards.py;
two real runtimes on one shard by tests/spark/test_fencing_runtimes.py.
"""

from __future__ import annotations

import threading

import pytest

from spark_runtime.fencing import WriterFence, WriterFenced
from spark_runtime.layout import ShardPaths
from spark_runtime.protocol import DrainSummary, SummaryEvent, WriterEpoch, epoch_name, parse_epoch_name
from spark_runtime.storage import location


def _paths(tmp_path):
    return ShardPaths.of(location(tmp_path), "orders", "orders-0-128")


def test_create_exclusive_writes_once_and_never_replaces(tmp_path):
    target = location(tmp_path / "a" / "summary.json")
    assert target.create_exclusive(b"first") is True
    assert target.create_exclusive(b"second") is False
    assert target.read_bytes() == b"first"
    assert [p.name for p in (tmp_path / "a").iterdir()] == ["summary.json"]  # no temporary file left behind


def test_of_many_concurrent_exclusive_creates_exactly_one_wins(tmp_path):
    target = location(tmp_path / "x.json")
    results: list[bool] = []
    barrier = threading.Barrier(12)

    def create(i: int) -> None:
        barrier.wait()
        results.append(target.create_exclusive(f"writer {i}".encode()))

    threads = [threading.Thread(target=create, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [False] * 11 + [True]
    assert target.read_text().startswith("writer ")


def test_epoch_names_sort_like_epochs_and_parse_back():
    assert epoch_name(7) == "000000000007.json"
    assert sorted([epoch_name(10), epoch_name(9), epoch_name(100)]) == [epoch_name(9), epoch_name(10), epoch_name(100)]
    assert parse_epoch_name(epoch_name(42)) == 42
    for other in (".000000000001.json.tmp-1-ab", "1.json", "000000000000.json", "00000000000x.json", "notes.txt"):
        assert parse_epoch_name(other) is None
    with pytest.raises(ValueError, match="start at 1"):
        epoch_name(0)


def test_each_start_claims_the_next_epoch_and_records_who(tmp_path, monkeypatch):
    monkeypatch.setenv("HOSTNAME", "orders-0-128-abcde")
    paths = _paths(tmp_path)
    first, second = WriterFence(paths), WriterFence(paths)
    assert first.claim() == 1
    assert first.claim() == 1  # idempotent within one runtime
    assert second.claim() == 2
    holder = WriterEpoch.from_json(paths.epoch(2).read_json())
    assert (holder.epoch, holder.shard, holder.pod) == (2, "orders-0-128", "orders-0-128-abcde")
    assert second.latest() == 2


def test_a_writer_is_fenced_once_a_later_epoch_exists_and_stays_fenced(tmp_path):
    paths = _paths(tmp_path)
    old = WriterFence(paths)
    old.claim()
    old.check("batch 3's output")  # alone: not fenced
    new = WriterFence(paths)
    new.claim()
    with pytest.raises(WriterFenced) as fenced:
        old.check("batch 4's output")
    assert fenced.value.reason == "WriterFenced"
    message = str(fenced.value)
    assert "epoch 1 was superseded by epoch 2" in message and "before batch 4's output" in message
    assert str(paths.epochs.uri()) in message
    new.check("batch 4's output")  # the newest writer goes on
    # Fenced for good, even if the successor's file were gone (a fenced writer never writes again).
    paths.epoch(2).unlink()
    with pytest.raises(WriterFenced):
        old.check("the drain summary")


def test_concurrent_claims_get_distinct_dense_epochs(tmp_path):
    paths = _paths(tmp_path)
    fences = [WriterFence(paths) for _ in range(10)]
    barrier = threading.Barrier(len(fences))

    def claim(fence: WriterFence) -> None:
        barrier.wait()
        fence.claim()

    threads = [threading.Thread(target=claim, args=(f,)) for f in fences]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(f.epoch for f in fences) == list(range(1, 11))
    newest = max(fences, key=lambda f: f.epoch or 0)
    newest.check("anything")
    for fence in fences:
        if fence is not newest:
            with pytest.raises(WriterFenced):
                fence.check("anything")


def test_an_unclaimed_fence_checks_nothing(tmp_path):
    paths = _paths(tmp_path)
    WriterFence(paths).claim()
    WriterFence(paths).check("a write of a part driven alone")  # no epoch held: nothing to protect


def test_the_drain_summary_carries_the_writer_epoch():
    summary = DrainSummary(SummaryEvent.DRAINED, "orders", "orders-0-128", 5, "/m.json", writer_epoch=3)
    data = summary.to_json()
    assert data["writerEpoch"] == 3
    assert DrainSummary.from_json(data).writer_epoch == 3
    assert "writerEpoch" not in DrainSummary(SummaryEvent.STOPPED, "orders", "s", 5, None).to_json()
