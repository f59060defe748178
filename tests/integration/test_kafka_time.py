"""Event time from the Kafka record timestamp, against the real broker and MinIO: a session-window Task (Kafka in
and out, state on S3) split while sessions are open and timers pending, exact against a plain-Python
sessionization; late records in the dead letters on S3 once, by the shard that owns their key. Twice: with the
Python session processor (timers), and with the builtin session-window count (Spark's native aggregation, whose
late records the runtime finds by reading a batch's Kafka offsets again)."""

from __future__ import annotations

import json
import random
import threading
import time

import pytest

from spark_runtime.keygroups import key_group
from tests.spark.time_processors import reference_sessions
from tests.spark.window_reference import reference_windows

from .test_kafka_s3_shards import MAX_KEY_GROUPS, Running, Setup

pytestmark = pytest.mark.integration

GAP_MS = 5_000


def timed_events(n: int, start: int, rng: random.Random) -> list[tuple[dict, int]]:
    """``(record, timestamp)`` pairs: 30 keys, times moving forward, out of order by less than the 1 s bound. The
    record's JSON has no time: the shard must take the Kafka timestamp."""
    out, t = [], start
    for _ in range(n):
        t += rng.randrange(0, 250)
        out.append(({"key": f"u{rng.randrange(30)}"}, t + rng.randrange(0, 900)))
    return out


def produce(broker, topic: str, pairs: list[tuple[dict, int]]) -> None:
    broker.produce(topic, [r for r, _ in pairs], timestamps=[t for _, t in pairs])


def key_in(start: int, end: int, prefix: str) -> str:
    return next(k for k in (f"{prefix}{i}" for i in range(1000)) if start <= key_group(k, MAX_KEY_GROUPS) < end)


PROCESSORS = {
    "python-sessions": {"python": "tests.spark.time_processors:SessionWindow", "parameters": {"gapSeconds": 5}},
    "builtin-session-count": {"builtin": "count", "window": {"type": "session", "gapSeconds": 5}},
}
FIELDS = {
    "python-sessions": ("start", "end", "count"),
    "builtin-session-count": ("window_start", "window_end", "result"),
}


def sessions(setup: Setup, kind: str) -> list[tuple]:
    """The closed sessions in the output topic, one per record id (a replayed batch writes its records again with
    the same ids: the Kafka sink is effectively once; a key's several sessions of one batch have ids of their own)."""
    by_id = {r.headers["taskshard-id"]: r.value for r in setup.output_records()}
    start, end, count = FIELDS[kind]
    return [(v["key"], v[start], v[end], v[count]) for v in by_id.values() if not v["key"].startswith("end")]


def expected_sessions(kind: str, events: list[tuple[dict, int]]) -> set[tuple]:
    if kind == "python-sessions":
        return reference_sessions([(r["key"], t) for r, t in events], GAP_MS)
    windows = reference_windows("session", "count", [(r["key"], t, 1) for r, t in events], gap_ms=GAP_MS)
    return {(k, s, e, n) for (k, s, e), n in windows.items()}


@pytest.mark.parametrize("kind", list(PROCESSORS))
def test_sessions_on_kafka_record_time_stay_exact_across_a_split(spark, kafka_broker, minio, tmp_path, kind):
    setup, rng = Setup(kafka_broker, minio, tmp_path, processor=PROCESSORS[kind]), random.Random(11)
    over = {
        "eventTime": {"kafkaTimestamp": True, "maxOutOfOrdernessSeconds": 1},
        # No cap on a batch's records: a capped batch may read one partition further in time than another, and the
        # shard's one watermark (the largest event time seen) would make the lagging partition's records late.
        "spark": {"triggerInterval": "500 milliseconds"},
    }
    # Record times within the broker's retention (older segments would be deleted) and not in the future.
    now = int(time.time() * 1000)
    events = timed_events(2400, now - 3_600_000, rng)
    late: list[tuple[dict, int]] = []
    produce(kafka_broker, setup.topic_in, events[:800])
    parent = Running(setup.config("kt-0-16", 0, 16, **over), spark)
    parent.wait_caught_up(kafka_broker.end_offsets(setup.topic_in))
    late += [({"key": f"u{i}"}, now - 7_200_000 + i) for i in range(6)]  # far behind the watermark: late
    produce(kafka_broker, setup.topic_in, late)
    # The split happens under load, with sessions open and their timers pending.
    producer = threading.Thread(target=produce, args=(kafka_broker, setup.topic_in, events[800:1600]))
    producer.start()
    summary = parent.finish()
    producer.join(60)
    manifest_watermark = json.loads(
        json.dumps(parent.runner.paths.manifest(summary["batchId"], parent.runner.fence.epoch).read_json())
    )["watermarkMs"]
    assert manifest_watermark > now - 3_600_000

    restore = {"parent": "kt-0-16", "manifest": summary["manifest"]}
    children = [
        Running(setup.config(n, a, b, restore, **over), spark) for n, a, b in (("kt-0-8", 0, 8), ("kt-8-16", 8, 16))
    ]
    ends = [({"key": key_in(0, 8, "end-a")}, now), ({"key": key_in(8, 16, "end-b")}, now)]
    produce(kafka_broker, setup.topic_in, events[1600:] + ends)
    end = kafka_broker.end_offsets(setup.topic_in)
    expected = expected_sessions(kind, events)
    for child in children:
        child.wait_caught_up(end)
        assert child.runner.plan.watermark_floor_ms == manifest_watermark
    children[0].wait_for(lambda: len(sessions(setup, kind)) >= len(expected), "every session closed")
    for child in children:
        child.finish()

    got = sessions(setup, kind)
    assert len(got) == len(set(got)), "a session was emitted twice"
    assert set(got) == expected
    # No local dead-letter directory (Kafka sink, S3 storage): each shard's late records are in its directory on S3.
    letters = []
    for runner in [parent.runner] + [c.runner for c in children]:
        assert runner.late_letters is not None and runner.late_letters.directory.uri().startswith("s3a://")
        for f in runner.late_letters.directory.iterdir() if runner.late_letters.directory.exists() else []:
            letters += [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    assert sorted(d["key"] for d in letters) == sorted(r["key"] for r, _ in late)
    assert all(d["reason"] == "late" for d in letters)
