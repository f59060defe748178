"""Time in the processor, without Spark: the timer index (slots, stale entries, exact re-registration), the
firing order in a batch, the contract of on_timer, the event-time spec's validation, the watermark floor a
snapshot manifest carries, and the watermark in the live status."""

from __future__ import annotations

import pandas as pd
import pytest

from spark_runtime.engine.api import Processor, ProcessorError, ProcessorFailed, processor_state_schema
from spark_runtime.engine.testing import GroupStore, ProcessorHarness
from spark_runtime.engine.timers import TimerIndex, slot_of

pytestmark = pytest.mark.unit


class MemoryTimers(GroupStore):
    def index(self) -> TimerIndex:
        return TimerIndex(self.timer_vars())


def test_timers_are_indexed_per_slot_and_taken_once():
    store = MemoryTimers()
    index = store.index()
    index.add(["a", "b", "c"], [12_000, 19_000, 30_500])
    assert store.registered == {10_000, 30_000} and store.due[10_000] == ["a", "b"]
    assert slot_of(19_999) == 10_000
    assert store.index().take(9_999) == []
    assert store.index().take(25_000) == ["a", "b"]
    assert store.registered == {30_000} and 10_000 not in store.due
    assert store.index().take(25_000) == []  # taken once
    store.index().add(["d", "e"], [41_000, 47_000], together=True)  # the not-yet-due rest of a slot: one entry
    assert store.registered == {30_000, 41_000} and store.due[41_000] == ["d", "e"]


class Pinger(Processor):
    """Sets a timer ``delay`` after each event's time; on_timer emits and re-arms once (``again``)."""

    timers = "event"
    state_schema = "armed bigint"
    result_type = "bigint"

    def process(self, events, state):
        last = events.groupby("key", sort=False)["event_time"].max()
        new = pd.DataFrame({"key": last.index, "armed": last.to_numpy(), "timer": last.to_numpy() + 1_000})
        return new, None

    def on_timer(self, timers, state):
        out = pd.DataFrame({"key": timers["key"], "result": timers["timer"]})
        again = state.assign(armed=state["armed"] + 1, timer=state["timer"])  # the same time: stays fired
        return again, out


def test_a_fired_timer_is_cleared_unless_set_later_and_fires_once():
    h = ProcessorHarness(Pinger(), event_time="ts")
    h.run([{"key": "k", "ts": 10_000}])
    assert h.state()["k"]["timer"] == 11_000
    assert h.run([{"key": "z", "ts": 12_500}]).empty  # the watermark of this batch is 10 s
    out = h.run([])  # watermark 12.5 s
    assert out[["key", "result"]].to_dict("records") == [{"key": "k", "result": 11_000}]
    assert h.state()["k"] == {"armed": 10_001, "timer": 0}
    assert h.run([{"key": "y", "ts": 20_000}]).empty  # runs at watermark 12.5 s
    assert h.run([])["key"].tolist() == ["z"]  # watermark 20 s: z's timer (13.5 s); k's never again


def test_a_timer_in_a_due_slot_but_after_the_watermark_waits_for_it():
    h = ProcessorHarness(Pinger(), event_time="ts", allowed_lateness_ms=1_000)
    h.run([{"key": "a", "ts": 50_000}])
    out = h.run([{"key": "b", "ts": 49_500}])  # watermark 50 s: b's timer (50.5 s, slot 50 s) is not due yet
    assert out.empty and h.late == []
    h.run([{"key": "c", "ts": 60_000}])
    out = h.run([{"key": "d", "ts": 58_000}])  # watermark 60 s: a and b fire before d's event is processed
    assert sorted(out["key"]) == ["a", "b"]


def test_on_timer_may_change_only_its_own_keys():
    class Stray(Pinger):
        def on_timer(self, timers, state):
            return state.assign(key="other"), None

    h = ProcessorHarness(Stray(), event_time="ts")
    h.run([{"key": "k", "ts": 10_000}])
    h.run([{"key": "z", "ts": 20_000}])
    with pytest.raises(ProcessorFailed, match=r"Stray.on_timer new_state has key 'other', which is not in timers"):
        h.run([])


def test_timer_declarations_are_checked():
    class NoHandler(Processor):
        timers = "event"
        state_schema = "n bigint"

    class Wrong(Pinger):
        timers = "wall"

    class Taken(Pinger):
        state_schema = "timer bigint"

    with pytest.raises(ProcessorError, match="needs an on_timer"):
        processor_state_schema(NoHandler())
    with pytest.raises(ProcessorError, match="'wall' must be one of event, processing"):
        processor_state_schema(Wrong())
    with pytest.raises(ProcessorError, match="column 'timer' is the timer's"):
        processor_state_schema(Taken())
    assert processor_state_schema(Pinger()).ddl().endswith("timer bigint default 0")


def shard_config(**extra):
    from spark_runtime.config import parse_config

    return parse_config(
        {
            "task": "t",
            "shard": "t-0-8",
            "maxKeyGroups": 8,
            "keyGroups": {"start": 0, "end": 8},
            "processor": {"python": "a.b:C"},
            "source": {"journal": {"path": "/j"}},
            "sink": {"directory": {"path": "/o"}},
            "storage": {"path": "/s"},
            **extra,
        }
    )


def test_event_time_needs_a_python_processor_and_one_clock():
    from spark_runtime.config import ConfigError

    et = {"field": "ts", "format": "epochSeconds", "maxOutOfOrdernessSeconds": 2.5, "allowedLatenessSeconds": 1}
    cfg = shard_config(eventTime=et)
    assert (cfg.event_time.delay_ms, cfg.event_time.lateness_ms) == (2_500, 1_000)
    assert cfg.event_time.millis_sql("ts") == "cast(round(`ts` * 1000) as bigint)"
    with pytest.raises(ConfigError, match="eventTime needs a Python processor"):
        shard_config(eventTime=et, processor={"builtin": "count"})
    with pytest.raises(ConfigError, match="maxOutOfOrdernessSeconds"):
        shard_config(eventTime={"field": "ts", "maxOutOfOrdernessSeconds": -1})
    kafka_only = {"kafka": {"bootstrapServers": "b:9092", "topic": "out"}}  # late records go to the storage then
    assert shard_config(eventTime=et, sink=kafka_only, storage={"s3": {"bucket": "state"}}).event_time is not None
    with pytest.raises(ConfigError, match="exactly one of field .* or kafkaTimestamp"):
        shard_config(eventTime={**et, "kafkaTimestamp": True})
    with pytest.raises(ConfigError, match="kafkaTimestamp needs source.kafka"):
        shard_config(eventTime={"kafkaTimestamp": True, "maxOutOfOrdernessSeconds": 1})
    kafka_in = {"kafka": {"bootstrapServers": "b:9092", "topic": "in"}}
    cfg = shard_config(eventTime={"kafkaTimestamp": True, "maxOutOfOrdernessSeconds": 1}, source=kafka_in)
    assert cfg.event_time.kafka_timestamp and cfg.event_time.field is None


def test_the_manifest_carries_the_final_watermark_never_below_the_floor(tmp_path):
    from types import SimpleNamespace

    from spark_runtime.snapshot.export import final_watermark_ms
    from spark_runtime.storage import location

    commits = tmp_path / "commits"
    commits.mkdir()
    (commits / "4").write_text('v1\n{"nextBatchWatermarkMs":7000}\n')
    plan = SimpleNamespace(event_time=object(), watermark_floor_ms=5_000)
    assert final_watermark_ms(plan, location(tmp_path), 4) == 7_000
    assert (
        final_watermark_ms(SimpleNamespace(event_time=object(), watermark_floor_ms=9_000), location(tmp_path), 4)
        == 9_000
    )
    assert final_watermark_ms(plan, location(tmp_path), -1) == 5_000  # drained before a first batch
    assert final_watermark_ms(SimpleNamespace(event_time=None, watermark_floor_ms=0), location(tmp_path), 4) is None


def test_the_watermark_and_late_records_reach_the_live_status():
    from spark_runtime.live import Metric, live_stats

    samples = [
        (Metric.LAST_BATCH, {}, 3.0),
        (Metric.WATERMARK, {}, 1_795_000_000.0),
        (f"{Metric.LATE_RECORDS}_total", {}, 4.0),
    ]
    status = live_stats(samples).to_status(observed_at="x")
    assert status["watermark"] == "2026-11-18T11:06:40Z" and status["lateRecords"] == 4
    assert "watermark" not in live_stats(samples[:1]).to_status(observed_at="x")


def test_late_letters_are_counted_once_across_replays_and_restarts(tmp_path):
    from spark_runtime.late import LateLetters
    from spark_runtime.sink import DeadLetterCounter
    from spark_runtime.storage import location

    where = location(str(tmp_path / "dead"))
    first = LateLetters(where)
    assert first.total == 0  # no directory yet
    first.write(3, ['{"key":"a"}', '{"key":"b"}'])
    first.write(3, ['{"key":"a"}', '{"key":"b"}'])  # batch 3 replayed: the same file, counted once
    first.write(5, ['{"key":"c"}'])
    assert first.total == 3
    again = LateLetters(where)  # a restarted runtime lists what is there
    assert again.total == 3
    again.write(5, ['{"key":"c"}'])
    assert again.total == 3
    (tmp_path / "dead" / "p0-0-10.jsonl").write_text('{"reason":"bad_json"}\n')
    other = DeadLetterCounter(tmp_path / "dead")
    other.refresh()
    assert other.total == 1, "the other dead letters leave the late ones to their own count"


def test_a_drain_drops_the_dead_letters_of_batches_that_never_committed(tmp_path):
    """Dead letters exactly once across a drain that stopped mid-batch: the files of journal ranges that start at
    or past the committed positions, and the late records of batches after the committed one, go; the rest stay
    (spark_runtime.drain: step 4)."""
    from spark_runtime.late import LateLetters
    from spark_runtime.sink import DeadLetterCounter
    from spark_runtime.storage import location

    d = tmp_path / "dead"
    d.mkdir()
    for name in ("p0-0-100.jsonl", "p0-100-250.jsonl", "p1-0-80.jsonl", "p1-80-90.jsonl", "p2-5-9.jsonl"):
        (d / name).write_text('{"reason":"bad_json"}\n{"reason":"bad_json"}\n')
    late = LateLetters(location(str(d)))
    for batch in (3, 4, 5):
        late.write(batch, ['{"key":"a"}'])
    counter = DeadLetterCounter(d)
    counter.refresh()
    assert counter.total == 10 and late.total == 3
    committed = {"p0.jsonl": 100, "p1.jsonl": 90}  # p2 is not this shard's: its file is left alone
    assert counter.drop_uncommitted(committed) == 2 and late.drop_after(4) == 1
    assert sorted(f.name for f in d.iterdir()) == [
        "late-b3.jsonl",
        "late-b4.jsonl",
        "p0-0-100.jsonl",
        "p1-0-80.jsonl",
        "p1-80-90.jsonl",
        "p2-5-9.jsonl",
    ]
    assert counter.total == 8 and late.total == 2
    assert counter.drop_uncommitted(committed) == 0 and late.drop_after(4) == 0, "idempotent"
